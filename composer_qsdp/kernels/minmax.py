"""Triton kernels of the min-max codec: fused quantize+pack, unpack+dequantize, fused dequantize-and-sum.

Reference (same math, same wire, same numbers bit for bit): the min-max codec of the ``quant`` layer
(``quant.minmax.MinMaxCodec``), methods ``_encode_rows_reference`` (:func:`encode_rows`), ``_decode_rows_fp32``
(:func:`decode_rows`) and ``_decode_sum_reference`` (:func:`decode_sum`). The codec passes its wire format
(``MinMaxCodec.wire_format``, a :class:`composer_qsdp.kernels.wire_format.WireFormat`); the launchers take ``[rows, n]``
tensors, so one launch covers every chunk of a reduce-scatter. They run on CUDA tensors, and on CPU tensors
under ``TRITON_INTERPRET=1`` (CI).

Tiling (:mod:`composer_qsdp.kernels.groups`): one program handles ``BPP`` consecutive buckets of one row as a
``[G, BPP, 8]`` tile of groups of 8 consecutive elements. A whole bucket lives in one program, so min, max and
quantization happen in a single pass over the data (one read of ``x``, one write of the codes), and the 8
codes of a group pack inside a thread into one naturally aligned ``bits``-byte word stored with a single
access. Stochastic rounding draws one Philox call per group of 8 when every group's first counter is a
multiple of 8 (``ALIGNED``: ``offset`` and, for several rows, ``n`` multiples of 8) and two otherwise; both
give the same numbers (:mod:`composer_qsdp.kernels.noise`). The Hadamard-rotated feedback quantize tiles a bucket
of up to 256 elements as rows of 16 (:func:`rotation_rows`): a thread holds a row, which is one code word, runs the
rotation's first stages inside it and, after one exchange, the others along a column.

Error feedback's residual (:func:`encode_rows_feedback`) is fp32, bf16, or the 8-bit symmetric codec's wire in this
codec's buckets (``quant.residual.CodedResidual``), decoded after the load and re-encoded before the store with the
symmetric kernels' own arithmetic (:mod:`composer_qsdp.kernels.abs_max`), so it is the bytes that codec writes.

Exactness: every fp32 operation appears once, in the reference's order, and the kernels launch with
``enable_fp_fusion=False`` so ``a * b + c`` is not contracted into an FMA; divisions use ``div_rn`` (IEEE)
instead of Triton's approximate ``/``. Rounding to an integer code and reading a code back as fp32 go through
the exact magic-number identities of :mod:`composer_qsdp.kernels.groups` (no conversion instructions). Outputs
are stored through :func:`composer_qsdp.kernels.cast.store_cast` (round to nearest even also under the
interpreter, whose own bf16 cast truncates). The only difference left is the payload of NaN outputs (GPUs
produce the canonical NaN).

Coverage: ``bits`` 1..8 and ``bucket_size`` a multiple of 8 up to :data:`MAX_BUCKET`; the codec
uses its torch reference for other configurations.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from composer_qsdp.kernels import hadamard
from composer_qsdp.kernels.abs_max import abs_max, abs_max_codes, abs_max_decode, bucket_scales, tile_abs_max
from composer_qsdp.kernels.bucket_decode import BucketDecoder
from composer_qsdp.kernels.cast import emulate_bf16_rne, store_cast
from composer_qsdp.kernels.groups import (ELEMENTS_PER_THREAD, GPU_TILE, INTERPRETER_TILE, MAGIC, MAGIC_BITS,
                                          MAX_BUCKET, KERNEL_BITS, bucket_lattice, cdiv, check_packed, codes_to_float,
                                          launch_shape, row_stride, rows_aligned, store_codes, supports_packed, tile,
                                          tile_codes, vec)
from composer_qsdp.kernels.fixed_point import fraction_bits
from composer_qsdp.kernels.hadamard import butterflies, butterflies_rows, rotation_rows
from composer_qsdp.kernels.noise import noise_bits
from composer_qsdp.kernels.wire_format import WireFormat, aligned_rows, bucket_wire_format

__all__ = ["MAX_BUCKET", "SUPPORTED_BITS", "supports", "encode_rows", "encode_rows_feedback", "decode_rows",
           "decode_sum", "rotation_rows", "rotated_feedback_elements_per_thread"]

#: Code widths with a kernel (a group of 8 codes is exactly ``bits`` bytes): all of them.
SUPPORTED_BITS = KERNEL_BITS
# Launch targets: those of :mod:`composer_qsdp.kernels.groups`, except when the rows of the streamed input or
# output do not start on 16-element boundaries: the accesses cannot be vectorized, 32 elements per thread spill
# registers, and the stochastic quantize with noise counters not multiples of 8 (two Philox calls per group) needed
# 254 of 255 registers at 16 elements, so decoders take 16 there and the quantize kernel 8.
_ELEMENTS_PER_THREAD_UNALIGNED_ROWS = {"decode": 16, "encode": 8}
# 8-bit stochastic quantize of 2-byte inputs issues the most instructions per byte moved; twice the elements per
# thread spreads the per-thread fixed work further. At 4 bits the same change adds register pressure without that
# gain, so 4 bits keeps 32.
_ELEMENTS_PER_THREAD_8BIT_STOCHASTIC_HALF = 64
# The rotated feedback quantize views a bucket of up to C * C elements as rows of C = 16 consecutive elements (8 for
# 5-7 bits: 16 such codes exceed a 64-bit word), a thread's row being one code word (:func:`rotation_rows`): a thread
# holds one row (16 elements) and, after one exchange, one column. Larger buckets go through the flat rotation, which
# holds the compensated values, their rotation, codes and decode at once: at 32 elements per thread it needs all 255
# registers (sm_90 compile, 256-element buckets), at 4 (8 warps per 1024 elements) 128.
ROTATED_ELEMENTS_PER_THREAD = 16
_FLAT_ROTATED_ELEMENTS_PER_THREAD = 4
# With the 8-bit coded residual the per-thread work (IEEE divisions, bucket reductions, index math) dominates: two
# rows per thread issue 14% fewer instructions per element (sm_90: 69.4 against 80.5 at 3 bits, 166-168 registers,
# no spills at 2-4 bits) and ran 10% faster on an H100 (0.139 against 0.154 ms, one GPT-1.3B block); the fp32 and
# bf16 residuals lose as many resident warps as they save there, and keep one row.
_CODED_ROTATED_ELEMENTS_PER_THREAD = 32


def rotated_feedback_elements_per_thread(log_row: int, coded: bool) -> int:
    """Elements per thread of the rotated feedback quantize: ``log_row`` from :func:`rotation_rows` (0: the flat
    rotation of larger buckets), ``coded`` when the residual is the 8-bit coded one."""
    if not log_row:
        return _FLAT_ROTATED_ELEMENTS_PER_THREAD
    return _CODED_ROTATED_ELEMENTS_PER_THREAD if coded else ROTATED_ELEMENTS_PER_THREAD


# The coded residual the feedback quantize reads and writes: the 8-bit symmetric codec's wire (one byte per element
# at the element's index, so codes need no packing), levels +-127.
_CODED_BITS = tl.constexpr(8)
_CODED_QMAX = tl.constexpr(127)


#: True when a kernel covers ``bits``, ``bucket_size``, ``rows`` and ``n``
#: (:func:`composer_qsdp.kernels.groups.supports_packed`).
supports = supports_packed


# --------------------------------------------------------------------------------------------- kernels
# Seeds and counter offsets change every step: specializing on their values (Triton compiles an integer equal to 1
# as a constant and one divisible by 16 apart) would compile new variants during training.
@triton.jit
def _quantize_tile(x, valid, row_wire, meta_ptr, row, pid, b, g, lane, e, n, num_buckets, code_bytes, meta_offset,
                   wire_row_stride, row_counter, seed,
                   BITS: tl.constexpr, BUCKET: tl.constexpr, BPP: tl.constexpr, STOCHASTIC: tl.constexpr,
                   FRACTION: tl.constexpr, ALIGNED: tl.constexpr, PARTIAL_GROUPS: tl.constexpr,
                   GS: tl.constexpr = 8, WHOLE_BUCKETS: tl.constexpr = False):  # fmt: skip
    """Quantize the fp32 tile ``x`` (groups of ``GS`` elements, :func:`composer_qsdp.kernels.groups.tile`) into wire
    row ``row`` (codes at ``row_wire``, the buckets' min and step in the fp32 words of ``meta_ptr``);
    ``row_counter``: the noise counter of the row's first element. Returns the codes as exact fp32 numbers and the
    buckets' ``(min, step)`` as the wire holds them (NaN for a non-finite bucket). ``WHOLE_BUCKETS``: every bucket of
    the tile is whole (``valid`` throughout) or past the row's end (never stored), so its lattice needs no mask."""
    LEVELS: tl.constexpr = (1 << BITS) - 1
    lo, scale, inv, bad = bucket_lattice(x, valid | WHOLE_BUCKETS, LEVELS, GS > 8)

    t = (x - lo) * inv
    # t >= 0 is rounded on a grid of 2**-F through one float add (F = 0: MAGIC, round half to even), stochastic
    # rounding adding the noise's top F bits to the bit pattern (fixed_point.fraction_bits). The cap clamps the
    # top on the bit patterns, which also maps a non-finite bucket to code 0: NaN lanes have patterns above any cap
    # as unsigned ints.
    F: tl.constexpr = FRACTION
    base: tl.constexpr = MAGIC_BITS - (F << 23)  # bits of 1.5 * 2**(23 - F)
    y = (t + (1.5 * (1 << (23 - F)))).to(tl.uint32, bitcast=True)
    if STOCHASTIC:  # one draw per 8 consecutive counters
        sub = tl.arange(0, GS // 8)[None, None, :, None]
        noise = noise_bits(seed, row_counter + b * BUCKET + g * GS + sub * 8, tl.arange(0, 8)[None, None, None, :],
                           ALIGNED, F)  # fmt: skip
        y = y + tl.reshape(noise, y.shape)
    cap = tl.where(bad, base, base + ((LEVELS << F) | ((1 << F) - 1))).to(tl.uint32)
    capped = tl.minimum(y, cap)
    codes = ((capped >> F) - (base >> F)).to(tl.int32)
    if F == 0:  # capped is MAGIC + code (MAGIC_BITS | code): codes_to_float without the integer operation
        levels = capped.to(tl.float32, bitcast=True) - MAGIC
    else:
        levels = codes_to_float(codes, 0)

    store_codes(row_wire, codes, pid, b, g, lane, e, valid, n, num_buckets, code_bytes, meta_offset,
                BITS, BUCKET, BPP, PARTIAL_GROUPS, GS)  # fmt: skip
    row_meta = meta_ptr + row * (wire_row_stride // 4) + meta_offset // 4 + 2 * b
    on = b < num_buckets
    lo = tl.where(bad, float("nan"), lo)
    scale = tl.where(bad, float("nan"), scale)
    tl.store(row_meta, lo, mask=on)
    tl.store(row_meta + 1, scale, mask=on)
    return levels, lo, scale


@triton.jit(do_not_specialize=["seed", "offset"])
def _quantize_kernel(
    x_ptr, wire_ptr, meta_ptr,
    n, num_buckets, code_bytes, meta_offset, x_row_stride, wire_row_stride,
    seed, offset,
    BITS: tl.constexpr, BUCKET: tl.constexpr, GROUPS: tl.constexpr, BPP: tl.constexpr, VEC: tl.constexpr,
    STOCHASTIC: tl.constexpr, FRACTION: tl.constexpr, ALIGNED: tl.constexpr, PARTIAL_GROUPS: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    b, g, lane, e, valid = tile(pid, n, BUCKET, GROUPS, BPP, VEC)
    x = tl.load(x_ptr + row * x_row_stride + e, mask=valid, other=0.0).to(tl.float32)
    row_wire = wire_ptr + row * tl.multiple_of(wire_row_stride, 4)  # wire rows are whole fp32 words
    _quantize_tile(x, valid, row_wire, meta_ptr, row, pid, b, g, lane, e, n, num_buckets, code_bytes, meta_offset,
                   wire_row_stride, offset + row * n, seed,
                   BITS, BUCKET, BPP, STOCHASTIC, FRACTION, ALIGNED, PARTIAL_GROUPS)  # fmt: skip


@triton.jit
def _fp32(v):
    """``v`` as fp32. bf16 goes through its bit pattern, one shift or mask per element: the conversion moves the upper
    element of each 32-bit pair down and back up, two instructions (sm_90)."""
    if v.dtype == tl.bfloat16:
        v = (v.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    return v.to(tl.float32)


@triton.jit
def _load_residual(r_row, idx, on, r_meta_offset, num_buckets, BPP: tl.constexpr, FLAT: tl.constexpr,
                   CODED: tl.constexpr):  # fmt: skip
    """The fp32 residual at the element indices ``idx`` of one row (0 where not ``on``): a float row, or with
    ``CODED`` the 8-bit symmetric wire row at ``r_row`` decoded as the symmetric decoder does (its buckets are the
    tile's: ``[BPP, 1]`` with ``FLAT`` indices ``[BPP, BUCKET]``, else ``[1, BPP, 1, 1]``)."""
    if CODED:
        # Level 0 off the row: (127 - 127) * scale is +0.0, the zero padding, as every stored scale is finite.
        codes = tl.load(r_row + idx, mask=on, other=_CODED_QMAX).to(tl.int32)
        scale = bucket_scales(r_row, r_meta_offset, num_buckets, BPP)
        r = abs_max_decode(codes, scale[:, None] if FLAT else scale[None, :, None, None], _CODED_QMAX)
    else:
        r = _fp32(tl.load(r_row + idx, mask=on, other=0.0))
    return r


@triton.jit
def _store_coded_residual(r_row, r, pid, b, g, lane, idx, on, n_in, num_buckets, r_meta_offset,
                          BUCKET: tl.constexpr, BPP: tl.constexpr, FLAT: tl.constexpr):  # fmt: skip
    """Store the finite fp32 residual ``r`` on the tile ``(b, g, lane, idx, on)`` (``FLAT``: ``[BPP, BUCKET]``
    indices and ``b`` ``[BPP, 1]``) into the 8-bit symmetric wire row at ``r_row`` as the symmetric encoder writes
    it: per bucket its abs-max over ``on``, codes at byte ``idx``, the padding up to ``r_meta_offset`` zeroed, then
    one fp32 scale per bucket."""
    if FLAT:
        absmax = tl.reduce(tl.where(on, tl.abs(r), 0.0), 1, abs_max, keep_dims=True)
    else:
        absmax = tile_abs_max(r, on)
    codes, scale = abs_max_codes(r, absmax, _CODED_QMAX, True)
    store_codes(r_row, codes, pid, b, g, lane, idx, on, n_in, num_buckets, n_in, r_meta_offset,
                _CODED_BITS, BUCKET, BPP, False)  # fmt: skip
    meta = (r_row + r_meta_offset).to(tl.pointer_type(tl.float32))
    tl.store(meta + b, scale, mask=b < num_buckets)


@triton.jit(do_not_specialize=["seed", "offset"])
def _quantize_feedback_kernel(
    x_ptr, r_ptr, wire_ptr, meta_ptr,
    n_in, n, num_buckets, code_bytes, meta_offset, x_row_stride, r_row_stride, wire_row_stride, r_meta_offset,
    seed, offset, beta, scale_rot,
    BITS: tl.constexpr, BUCKET: tl.constexpr, GROUPS: tl.constexpr, BPP: tl.constexpr, VEC: tl.constexpr,
    STOCHASTIC: tl.constexpr, FRACTION: tl.constexpr, ALIGNED: tl.constexpr, PARTIAL_GROUPS: tl.constexpr,
    ROTATE: tl.constexpr, LOG_B: tl.constexpr, LOG_ROW: tl.constexpr, EMULATE_BF16_RNE: tl.constexpr,
    CODED: tl.constexpr, R_ALIGN: tl.constexpr, FEEDBACK: tl.constexpr = True,
):  # fmt: skip
    """Error feedback in one pass: quantize ``c = x + r`` (Hadamard-rotated per bucket with ``ROTATE``; ``n`` is then
    the padded row length) and write ``r <- fresh - beta * (fresh - r)``, ``fresh = c - decode(encode(c))`` (rotated
    back), non-finite entries reset to 0. ``c``, its rotation and its decode never go through memory.

    ``LOG_ROW > 0`` (rotated only, :func:`rotation_rows`): the tile is ``GROUPS`` rows of ``2**LOG_ROW`` elements per
    bucket, each row one code word; the rotation's stages run along the rows, then along the columns
    (:func:`composer_qsdp.kernels.hadamard.butterflies_rows`). ``LOG_ROW = 0``: groups of 8, rotated flat.

    ``CODED``: ``r_ptr`` holds the residual as 8-bit symmetric wire rows of the first ``n_in`` columns, in buckets of
    ``BUCKET`` (scales at byte ``r_meta_offset``; ``r_row_stride`` in bytes, a multiple of ``R_ALIGN``), read and
    written as that codec's decode and encode (:mod:`composer_qsdp.kernels.abs_max`); else as ``n_in`` floats per
    row."""
    ROWS: tl.constexpr = LOG_ROW > 0
    FLAT: tl.constexpr = ROTATE and not ROWS
    GS: tl.constexpr = (1 << LOG_ROW) if ROWS else 8
    pid = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    b, g, lane, e, valid = tile(pid, n, BUCKET, GROUPS, BPP, VEC, GS)
    x_row = x_ptr + row * x_row_stride
    if CODED:  # stated as a product by the constant R_ALIGN, which Triton's alignment analysis follows
        r_row = r_ptr + row * (r_row_stride // R_ALIGN) * R_ALIGN
    else:
        r_row = r_ptr + row * r_row_stride
    if FLAT:  # bucket-major [BPP, BUCKET], as the rotation kernel loads
        rb = (pid * BPP + tl.arange(0, BPP))[:, None]
        col = rb * BUCKET + tl.arange(0, BUCKET)[None, :]
        on = col < n_in  # columns n_in..n are the zero padding
        c = _fp32(tl.load(x_row + col, mask=on, other=0.0))
        if FEEDBACK:
            r = _load_residual(r_row, col, on, r_meta_offset, num_buckets, BPP, FLAT, CODED)
            c = c + r
        v = tl.reshape(butterflies(tl.reshape(c, (BPP * BUCKET,)), BUCKET, LOG_B), (BPP, BUCKET)) * scale_rot
        xt = tl.permute(tl.reshape(v, (BPP, GROUPS, 8 // VEC, VEC)), (1, 0, 2, 3))
    else:
        on = valid & (e < n_in) if ROWS else valid  # rotated: columns n_in..n are the zero padding
        c = _fp32(tl.load(x_row + e, mask=on, other=0.0))
        if FEEDBACK:
            r = _load_residual(r_row, e, on, r_meta_offset, num_buckets, BPP, FLAT, CODED)
            c = c + r
        xt = butterflies_rows(c, LOG_B - LOG_ROW, LOG_ROW) * scale_rot if ROWS else c
    row_wire = wire_ptr + row * tl.multiple_of(wire_row_stride, 4)
    levels, lo, scale = _quantize_tile(xt, valid, row_wire, meta_ptr, row, pid, b, g, lane, e, n, num_buckets,
                                       code_bytes, meta_offset, wire_row_stride,
                                       offset + row * n_in, seed,
                                       BITS, BUCKET, BPP, STOCHASTIC, FRACTION, ALIGNED, PARTIAL_GROUPS, GS,
                                       ROWS)  # fmt: skip
    if FEEDBACK:
        decoded = lo + scale * levels  # the decoder's arithmetic (no FMA: enable_fp_fusion=False)
        if ROWS:
            decoded = butterflies_rows(decoded, LOG_B - LOG_ROW, LOG_ROW) * scale_rot
        elif ROTATE:
            flat = butterflies(tl.reshape(tl.permute(decoded, (1, 0, 2, 3)), (BPP * BUCKET,)), BUCKET, LOG_B)
            decoded = tl.reshape(flat, (BPP, BUCKET)) * scale_rot
        fresh = c - decoded
        r = fresh - (fresh - r) * beta
        r = tl.where(tl.abs(r) < float("inf"), r, 0.0)  # NaN compares false: reset with the infinities
        if CODED and FLAT:
            _store_coded_residual(r_row, r, pid, rb, rb, rb, col, on, n_in, num_buckets, r_meta_offset, BUCKET, BPP,
                                  FLAT)  # fmt: skip
        elif CODED:
            _store_coded_residual(r_row, r, pid, b, g, lane, e, on, n_in, num_buckets, r_meta_offset, BUCKET, BPP, FLAT)
        elif FLAT:
            store_cast(r_row + col, r, on, EMULATE_BF16_RNE)
        else:
            store_cast(r_row + e, r, on, EMULATE_BF16_RNE)


@triton.jit
def _decode_tile(
    wire_ptr, meta_ptr, row, b, g, lane, e, valid, n, num_buckets, meta_offset, wire_row_stride,
    BITS: tl.constexpr, BUCKET: tl.constexpr, BPP: tl.constexpr, GS: tl.constexpr = 8,
):  # fmt: skip
    """Decoded fp32 values of wire row ``row`` on the tile ``(b, g, lane, e, valid)`` of groups of ``GS`` (0 where
    not ``valid``)."""
    codes, lo, scale = tile_codes(wire_ptr, meta_ptr, row, b, g, lane, e, valid, n, num_buckets, meta_offset,
                                  wire_row_stride, BITS, BUCKET, BPP, GS)  # fmt: skip
    return lo + scale * codes_to_float(codes, 0)


# --------------------------------------------------------------------------------------------- launchers
def _config(bucket_size: int, num_buckets: int, on_gpu: bool, aligned_rows: bool, buckets_per_program: int | None,
            num_warps: int | None, kind: str = "decode", wide: bool = False) -> tuple[int, int, int]:  # fmt: skip
    """(GROUPS, buckets per program, warps) of a launch (:func:`composer_qsdp.kernels.groups.launch_shape`);
    ``aligned_rows``: the rows of the streamed input or output start on 16-element boundaries; ``kind``: ``"encode"``
    or ``"decode"``; ``wide``: an 8-bit stochastic quantize of a 2-byte dtype (one warp per 2048 elements)."""
    if not aligned_rows:
        per_thread = _ELEMENTS_PER_THREAD_UNALIGNED_ROWS[kind]
    else:
        per_thread = _ELEMENTS_PER_THREAD_8BIT_STOCHASTIC_HALF if wide else ELEMENTS_PER_THREAD
    return launch_shape(bucket_size, num_buckets, on_gpu, max(GPU_TILE, 32 * per_thread), INTERPRETER_TILE,
                        per_thread, buckets_per_program, num_warps)  # fmt: skip



def _check(bits: int, bucket_size: int, rows: int, fmt: WireFormat) -> None:
    check_packed("min-max", bits, bucket_size, rows, fmt.numel)


def encode_rows(
    x: torch.Tensor,
    bits: int,
    bucket_size: int,
    fmt: WireFormat,
    stochastic: bool,
    seed: int,
    offset: int,
    *,
    buckets_per_program: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Quantize each row of ``x`` ``[R, n]``: ``[R, fmt.wire_bytes]`` ``uint8``, the codec's wire.

    Row ``r`` uses noise counters ``offset + r * n + i`` under key ``seed``; ``fmt`` is the codec's
    ``MinMaxCodec.wire_format(n)``. ``buckets_per_program`` (a
    power of two) and ``num_warps`` override the launch heuristic for benchmark sweeps; they never change the
    result.
    """
    rows, n = x.shape
    _check(bits, bucket_size, rows, fmt)
    if x.stride(1) != 1:
        x = x.contiguous()
    wire = torch.empty(rows, fmt.wire_bytes, dtype=torch.uint8, device=x.device)
    nb = fmt.num_buckets
    wide = stochastic and bits == 8 and x.element_size() == 2
    groups, bpp, warps = _config(bucket_size, nb, x.is_cuda, rows_aligned(x), buckets_per_program, num_warps,
                                 "encode", wide)  # fmt: skip
    aligned = offset % 8 == 0 and (rows == 1 or n % 8 == 0)
    _quantize_kernel[(cdiv(nb, bpp), rows)](
        x, wire, wire.view(torch.float32),
        n, nb, fmt.code_bytes, fmt.meta_offset, row_stride(x), row_stride(wire),
        seed, offset,
        BITS=bits, BUCKET=bucket_size, GROUPS=groups, BPP=bpp, VEC=vec(x.dtype), STOCHASTIC=stochastic,
        FRACTION=fraction_bits(bits) if stochastic else 0, ALIGNED=aligned, PARTIAL_GROUPS=bits < 8 and n % 8 != 0,
        num_warps=warps, enable_fp_fusion=False,
    )  # fmt: skip
    return wire


def encode_rows_feedback(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    beta: float,
    bits: int,
    bucket_size: int,
    fmt: WireFormat,
    stochastic: bool,
    seed: int,
    offset: int,
    rotate: bool = False,
    *,
    buckets_per_program: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Error-feedback quantize of ``x`` ``[R, n]`` with ``residual`` (updated in place) in one pass:
    ``[R, fmt.wire_bytes]`` ``uint8``, the wire of ``x + residual``.

    ``residual``: ``R * n`` contiguous fp32 or bf16 elements, or the residual coded as the 8-bit symmetric codec's
    wire rows in buckets of ``bucket_size`` (``quant.residual.CodedResidual`` of ``SymmetricCodec(8, bucket_size)``):
    ``uint8`` ``[R, SymmetricCodec(8, bucket_size).wire_bytes(n)]``, contiguous, read and written as that codec
    decodes and encodes them (its buckets are this codec's, the last one partial, also when ``rotate`` pads the rows).
    ``None``: no feedback, the rotated (or plain) encode of ``x`` alone in the same pass (``beta`` unused): what
    ``HadamardCodec(MinMaxCodec)``'s ``encode_rows`` computes through an fp32 copy of the rotated rows.

    Reference: ``MinMaxCodec``'s ``Codec._encode_rows_feedback`` (with ``rotate``, ``HadamardCodec``'s over it,
    ``fmt`` then describing the rows zero-padded to whole buckets). Row ``r`` uses noise counters ``offset + r * n +
    i`` (``i`` indexing the padded row) under key ``seed``. ``buckets_per_program`` (a power of two) and
    ``num_warps`` override the launch heuristic for benchmark sweeps; they never change the result.

    Raises:
        ValueError: an unsupported configuration, or a coded residual of another shape or not contiguous.
    """
    rows, n = x.shape
    _check(bits, bucket_size, rows, fmt)
    if rotate and not hadamard.supports(bucket_size):
        raise ValueError(f"no rotated min-max kernel for bucket_size={bucket_size}; allowed: powers of two")
    if x.stride(1) != 1:
        x = x.contiguous()
    coded = residual is not None and residual.dtype == torch.uint8
    if residual is None:
        r = x  # never read: the kernel's feedback is compiled out
    elif coded:
        rfmt = bucket_wire_format(n, bucket_size, 8, cdiv(n, bucket_size))
        if tuple(residual.shape) != (rows, rfmt.wire_bytes) or aligned_rows(residual) is not residual:
            raise ValueError(f"a coded residual must be the contiguous [{rows}, {rfmt.wire_bytes}] uint8 wire of "
                             f"SymmetricCodec(8, {bucket_size}) for rows of {n} elements, got shape "
                             f"{tuple(residual.shape)} with strides {residual.stride()}")  # fmt: skip
        r = residual
    else:
        r = residual.view(rows, n)
    wire = torch.empty(rows, fmt.wire_bytes, dtype=torch.uint8, device=x.device)
    nb = fmt.num_buckets
    log_row = rotation_rows(bits, bucket_size) if rotate else 0
    # A tile of rows streams x and the residual through the same 16-byte accesses.
    tile_vec = min(vec(x.dtype), vec(r.dtype)) if log_row else vec(x.dtype)
    if rotate:
        per_thread = rotated_feedback_elements_per_thread(log_row, coded)
        groups, bpp, warps = launch_shape(bucket_size, nb, x.is_cuda, GPU_TILE, INTERPRETER_TILE, per_thread,
                                          buckets_per_program, num_warps)  # fmt: skip
        groups = bucket_size >> log_row if log_row else groups
    else:
        groups, bpp, warps = _config(bucket_size, nb, x.is_cuda, rows_aligned(x) and rows_aligned(r),
                                     buckets_per_program, num_warps, "encode")  # fmt: skip
    _quantize_feedback_kernel[(cdiv(nb, bpp), rows)](
        x, r, wire, wire.view(torch.float32),
        n, fmt.numel, nb, fmt.code_bytes, fmt.meta_offset, row_stride(x), row_stride(r), row_stride(wire),
        rfmt.meta_offset if coded else 0, seed, offset, float(beta), hadamard.rotation_scale(bucket_size) if rotate else 1.0,
        BITS=bits, BUCKET=bucket_size, GROUPS=groups, BPP=bpp, VEC=tile_vec, STOCHASTIC=stochastic,
        FRACTION=fraction_bits(bits) if stochastic else 0, ALIGNED=offset % 8 == 0 and (rows == 1 or n % 8 == 0),
        PARTIAL_GROUPS=bits < 8 and fmt.numel % 8 != 0, ROTATE=rotate, LOG_B=bucket_size.bit_length() - 1,
        LOG_ROW=log_row, EMULATE_BF16_RNE=emulate_bf16_rne(), CODED=coded, R_ALIGN=_coded_row_alignment(r) if coded else 4,
        FEEDBACK=residual is not None, num_warps=warps, enable_fp_fusion=False,
    )  # fmt: skip
    return wire


def _coded_row_alignment(residual: torch.Tensor) -> int:
    """Bytes (4, 8 or 16) that every row start of the ``[R, m]`` residual is a multiple of, as far as its row stride
    tells (one row: 16, torch allocations being 16-byte aligned); only a coded residual's rows are read with it.

    Triton specializes a stride on divisibility by 16 only, and a coded row of ``SymmetricCodec(8, b)``'s wire is
    ``numel + 4 * buckets`` bytes (often 8 mod 16): without this, its codes would load and store one byte per access.
    """
    stride = row_stride(residual)
    return 16 if stride == 0 else min(16, stride & -stride)


_DECODER = BucketDecoder(_decode_tile, _check, _config)
#: :meth:`composer_qsdp.kernels.bucket_decode.BucketDecoder.decode_rows` with the min-max tile decoder.
decode_rows = _DECODER.decode_rows
#: :meth:`composer_qsdp.kernels.bucket_decode.BucketDecoder.decode_sum` with the min-max tile decoder.
decode_sum = _DECODER.decode_sum
