"""Triton kernels of the min-max codec: fused quantize+pack, unpack+dequantize, fused dequantize-and-sum.

Reference (same math, same wire, same numbers bit for bit): :class:`composer_qsdp.quant.minmax.MinMaxCodec`,
methods ``_encode_rows_reference`` (:func:`encode_rows`), ``_decode_rows_fp32`` (:func:`decode_rows`) and
``_decode_sum_reference`` (:func:`decode_sum`). The codec passes its wire layout (:meth:`MinMaxCodec.layout`,
:mod:`composer_qsdp.quant.wire`); the launchers take ``[rows, n]`` tensors, so one launch covers every chunk
of a reduce-scatter. They run on CUDA tensors, and on CPU tensors under ``TRITON_INTERPRET=1`` (CI).

Tiling: one program handles ``BPP`` consecutive buckets of one row as a ``[G, BPP, 8]`` tile, where ``G`` is
the bucket's number of groups of 8 consecutive elements (rounded up to a power of two, padding lanes
masked). A whole bucket lives in one program, so min, max and quantization happen in a single pass over the
data (one read of ``x``, one write of the codes). The 8 codes of a group pack, with shifts and a sum inside
a thread, into one naturally aligned ``bits``-byte word stored with a single access. Stochastic rounding
draws one Philox call per group of 8 when every group's first counter is a multiple of 8 (``ALIGNED``:
``offset`` and, for several rows, ``n`` multiples of 8) and two otherwise; both give the same numbers
(:mod:`composer_qsdp.kernels.noise`).

Exactness: every fp32 operation appears once, in the reference's order, and the kernels launch with
``enable_fp_fusion=False`` so ``a * b + c`` is not contracted into an FMA; divisions use ``div_rn`` (IEEE)
instead of Triton's approximate ``/``. Outputs are stored through :func:`composer_qsdp.kernels.cast.store_cast`
(round to nearest even also under the interpreter, whose own bf16 cast truncates). The only difference left
is the payload of NaN outputs (GPUs produce the canonical NaN).

Coverage: ``bits`` in (1, 2, 4, 8) and ``bucket_size`` a multiple of 8 up to :data:`MAX_BUCKET`; the codec
uses its torch reference for other configurations.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from composer_qsdp.kernels.cast import emulate_bf16_rne, store_cast
from composer_qsdp.kernels.noise import noise_for_groups
from composer_qsdp.quant.wire import WireLayout, aligned_rows

__all__ = ["MAX_BUCKET", "SUPPORTED_BITS", "supports", "encode_rows", "decode_rows", "decode_sum"]

#: Code widths with a kernel (a group of 8 codes is exactly ``bits`` bytes).
SUPPORTED_BITS = (1, 2, 4, 8)
#: Largest bucket (elements) a program holds in registers without spilling (16 warps x 16 elements/thread).
MAX_BUCKET = 8192
_FP32_MAX = tl.constexpr(3.4028234663852886e38)  # jit code reads only constexpr globals
# Elements per program on a GPU, at 16 per thread: more (32 per thread) spills registers once the row
# strides are not known multiples of 16. Under the interpreter (~12 ms per program, almost independent of
# size) as few programs as possible.
_GPU_TILE = 4096
_ELEMENTS_PER_THREAD = 16
_INTERPRETER_TILE = 65536
_MAX_ROWS = 65535


def supports(bits: int, bucket_size: int, rows: int = 1, n: int = 1) -> bool:
    """True when a kernel covers ``bits``, ``bucket_size`` (elements; a multiple of 8 up to ``MAX_BUCKET``),
    ``rows`` (the second grid dimension: at most 65535) and ``n`` elements per row (int32 indexing)."""
    return (bits in SUPPORTED_BITS and 8 <= bucket_size <= MAX_BUCKET and bucket_size % 8 == 0
            and rows <= _MAX_ROWS and n < 2**31)  # fmt: skip


# --------------------------------------------------------------------------------------------- kernels
@triton.jit
def _tile(pid, n, BUCKET: tl.constexpr, GROUPS: tl.constexpr, BPP: tl.constexpr):
    """Buckets ``b`` ``[1, BPP, 1]``, groups ``g`` ``[G, 1, 1]``, element index ``[G, BPP, 8]`` and its mask.

    Groups lead so that the lanes of a warp walk along contiguous memory (a bucket is contiguous).
    """
    b = (pid * BPP + tl.arange(0, BPP))[None, :, None]
    g = tl.arange(0, GROUPS)[:, None, None]
    e = b * BUCKET + g * 8 + tl.arange(0, 8)[None, None, :]
    return b, g, e, (g * 8 < BUCKET) & (e < n)


@triton.jit
def _min_max(lo_a, hi_a, lo_b, hi_b):
    """Combine of a (min, max) reduction that propagates NaN (plain min/max skip NaN on a GPU)."""
    return (tl.minimum(lo_a, lo_b, propagate_nan=tl.PropagateNan.ALL),
            tl.maximum(hi_a, hi_b, propagate_nan=tl.PropagateNan.ALL))  # fmt: skip


@triton.jit
def _group_words(row_wire, b, g, BITS: tl.constexpr, BUCKET: tl.constexpr):
    """Pointers ``[G, BPP, 1]`` to the ``bits``-byte word holding the 8 codes of each group (``bits`` < 8).

    A bucket's codes start at a multiple of ``bits`` bytes (``bucket_size`` is a multiple of 8), so each
    group's codes are one naturally aligned 1-, 2- or 4-byte little-endian word.
    """
    if BITS == 1:
        words = row_wire
    elif BITS == 2:
        words = row_wire.to(tl.pointer_type(tl.int16))
    else:
        words = row_wire.to(tl.pointer_type(tl.int32))
    return words + b * (BUCKET // 8) + g


@triton.jit
def _quantize_kernel(
    x_ptr, wire_ptr, meta_ptr,
    n, num_buckets, code_bytes, meta_offset, x_row_stride, wire_row_stride,
    seed, offset,
    BITS: tl.constexpr, BUCKET: tl.constexpr, GROUPS: tl.constexpr, BPP: tl.constexpr,
    STOCHASTIC: tl.constexpr, ALIGNED: tl.constexpr,
):  # fmt: skip
    LEVELS: tl.constexpr = (1 << BITS) - 1
    pid = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    b, g, e, valid = _tile(pid, n, BUCKET, GROUPS, BPP)
    x = tl.load(x_ptr + row * x_row_stride + e, mask=valid, other=0.0).to(tl.float32)

    # NaN-propagating min/max: a NaN or infinity anywhere in the bucket makes the range non-finite.
    lo, hi = tl.reduce((tl.where(valid, x, float("inf")), tl.where(valid, x, float("-inf"))), 2, _min_max,
                       keep_dims=True)  # fmt: skip
    lo, hi = tl.reduce((lo, hi), 0, _min_max, keep_dims=True)  # [1, BPP, 1]
    scale = tl.math.div_rn(hi - lo, tl.full(lo.shape, LEVELS, tl.float32))
    bad = ~(scale < float("inf"))
    positive = scale > 0
    inv = tl.math.div_rn(tl.full(lo.shape, 1.0, tl.float32), tl.where(positive, scale, 1.0))
    inv = tl.minimum(tl.where(positive, inv, 0.0), _FP32_MAX)

    t = (x - lo) * inv
    if STOCHASTIC:
        t = t + noise_for_groups(seed, offset + row * n + b * BUCKET + g * 8, ALIGNED)
    else:
        t = t + 0.5
    q = tl.minimum(tl.maximum(tl.floor(t), 0.0), LEVELS)
    codes = tl.where(valid & ~bad, q, 0.0).to(tl.int32)

    row_wire = wire_ptr + row * tl.multiple_of(wire_row_stride, 4)  # wire rows are whole fp32 words
    if BITS == 8:
        tl.store(row_wire + e, codes.to(tl.uint8), mask=valid)
    else:
        word = tl.sum(codes << (tl.arange(0, 8)[None, None, :] * BITS), axis=2, keep_dims=True)
        group_ok = (g * 8 < BUCKET) & (b * BUCKET + g * 8 < n)
        words = _group_words(row_wire, b, g, BITS, BUCKET)
        tl.store(words, word.to(words.dtype.element_ty), mask=group_ok)
    # The program holding the last bucket zeroes the padding before the metadata; a tail group's word may
    # already have written zeros there.
    pad = code_bytes + tl.arange(0, 4)
    tl.store(row_wire + pad, tl.zeros([4], tl.uint8), mask=(pad < meta_offset) & (pid == (num_buckets - 1) // BPP))

    row_meta = meta_ptr + row * (wire_row_stride // 4) + meta_offset // 4 + 2 * b
    on = b < num_buckets
    tl.store(row_meta, tl.where(bad, float("nan"), lo), mask=on)
    tl.store(row_meta + 1, tl.where(bad, float("nan"), scale), mask=on)


@triton.jit
def _decode_tile(
    wire_ptr, meta_ptr, row, b, g, e, valid, n, num_buckets, meta_offset, wire_row_stride,
    BITS: tl.constexpr, BUCKET: tl.constexpr, BPP: tl.constexpr,
):  # fmt: skip
    """Decoded fp32 values ``[G, BPP, 8]`` of wire row ``row`` (0 where not ``valid``)."""
    row_wire = wire_ptr + row * tl.multiple_of(wire_row_stride, 4)  # wire rows are whole fp32 words
    if BITS == 8:
        codes = tl.load(row_wire + e, mask=valid, other=0).to(tl.int32)
    else:
        group_ok = (g * 8 < BUCKET) & (b * BUCKET + g * 8 < n)
        word = tl.load(_group_words(row_wire, b, g, BITS, BUCKET), mask=group_ok, other=0).to(tl.int32)
        codes = (word >> (tl.arange(0, 8)[None, None, :] * BITS)) & ((1 << BITS) - 1)
    # Metadata loaded once per bucket as 1-D vectors, then broadcast (loading it in the tile's layout would
    # issue one load per element).
    bucket = tl.program_id(0) * BPP + tl.arange(0, BPP)
    row_meta = meta_ptr + row * (wire_row_stride // 4) + meta_offset // 4 + 2 * bucket
    on = bucket < num_buckets
    lo = tl.load(row_meta, mask=on, other=0.0)[None, :, None]
    scale = tl.load(row_meta + 1, mask=on, other=0.0)[None, :, None]
    return lo + scale * codes.to(tl.float32)


@triton.jit
def _dequantize_kernel(
    wire_ptr, meta_ptr, out_ptr,
    n, num_buckets, meta_offset, wire_row_stride, out_row_stride,
    BITS: tl.constexpr, BUCKET: tl.constexpr, GROUPS: tl.constexpr, BPP: tl.constexpr,
    EMULATE_BF16_RNE: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    b, g, e, valid = _tile(pid, n, BUCKET, GROUPS, BPP)
    y = _decode_tile(wire_ptr, meta_ptr, row, b, g, e, valid, n, num_buckets, meta_offset, wire_row_stride,
                     BITS, BUCKET, BPP)  # fmt: skip
    store_cast(out_ptr + row * out_row_stride + e, y, valid, EMULATE_BF16_RNE)


@triton.jit
def _dequantize_sum_kernel(
    wire_ptr, meta_ptr, out_ptr,
    n, num_buckets, meta_offset, wire_row_stride,
    ROWS: tl.constexpr, BITS: tl.constexpr, BUCKET: tl.constexpr, GROUPS: tl.constexpr, BPP: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    b, g, e, valid = _tile(pid, n, BUCKET, GROUPS, BPP)
    acc = tl.zeros([GROUPS, BPP, 8], tl.float32)
    for row in range(ROWS):  # in row order, like the reference
        acc += _decode_tile(wire_ptr, meta_ptr, tl.cast(row, tl.int64), b, g, e, valid, n, num_buckets,
                            meta_offset, wire_row_stride, BITS, BUCKET, BPP)  # fmt: skip
    tl.store(out_ptr + e, acc, mask=valid)


# --------------------------------------------------------------------------------------------- launchers
def _config(bucket_size: int, num_buckets: int, device: torch.device, buckets_per_program: int | None,
            num_warps: int | None) -> tuple[int, int, int]:  # fmt: skip
    """(GROUPS, buckets per program, warps) for a launch: about ``_GPU_TILE`` elements, 16 per thread."""
    groups = triton.next_power_of_2(bucket_size // 8)
    bucket_tile = groups * 8
    if buckets_per_program is None:
        target = _GPU_TILE if device.type == "cuda" else _INTERPRETER_TILE
        buckets_per_program = max(1, min(triton.next_power_of_2(num_buckets), target // bucket_tile))
    elif buckets_per_program < 1 or buckets_per_program & (buckets_per_program - 1):
        raise ValueError(f"buckets_per_program={buckets_per_program} must be a power of two >= 1")
    if num_warps is None:
        num_warps = min(16, max(1, buckets_per_program * bucket_tile // (32 * _ELEMENTS_PER_THREAD)))
    return groups, buckets_per_program, num_warps


def _row_stride(t: torch.Tensor) -> int:
    """Row stride of a ``[R, ...]`` launch argument; 0 for one row, which never moves by it: Triton then
    specializes it as a multiple of 16 and vectorizes the single-row (all-gather) case whatever ``n`` is."""
    return t.stride(0) if t.shape[0] > 1 else 0


def _check(bits: int, bucket_size: int, rows: int, layout: WireLayout) -> None:
    if not supports(bits, bucket_size, rows, layout.numel):
        raise ValueError(
            f"no min-max kernel for bits={bits}, bucket_size={bucket_size}, rows={rows}, n={layout.numel}; "
            f"allowed: bits in {SUPPORTED_BITS}, bucket_size a multiple of 8 up to {MAX_BUCKET}, rows up to "
            f"{_MAX_ROWS}, n below 2**31"
        )


def encode_rows(
    x: torch.Tensor,
    bits: int,
    bucket_size: int,
    layout: WireLayout,
    stochastic: bool,
    seed: int,
    offset: int,
    *,
    buckets_per_program: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Quantize each row of ``x`` ``[R, n]``: ``[R, layout.wire_bytes]`` ``uint8``, the codec's wire.

    Row ``r`` uses noise counters ``offset + r * n + i`` under key ``seed``; ``layout`` is
    :meth:`MinMaxCodec.layout(n) <composer_qsdp.quant.minmax.MinMaxCodec.layout>`. ``buckets_per_program`` (a
    power of two) and ``num_warps`` override the launch heuristic for benchmark sweeps; they never change the
    result.
    """
    rows, n = x.shape
    _check(bits, bucket_size, rows, layout)
    if x.stride(1) != 1:
        x = x.contiguous()
    wire = torch.empty(rows, layout.wire_bytes, dtype=torch.uint8, device=x.device)
    nb = layout.num_buckets
    groups, bpp, warps = _config(bucket_size, nb, x.device, buckets_per_program, num_warps)
    aligned = offset % 8 == 0 and (rows == 1 or n % 8 == 0)
    _quantize_kernel[(triton.cdiv(nb, bpp), rows)](
        x, wire, wire.view(torch.float32),
        n, nb, layout.code_bytes, layout.meta_offset, _row_stride(x), _row_stride(wire),
        seed, offset,
        BITS=bits, BUCKET=bucket_size, GROUPS=groups, BPP=bpp, STOCHASTIC=stochastic, ALIGNED=aligned,
        num_warps=warps, enable_fp_fusion=False,
    )  # fmt: skip
    return wire


def decode_rows(
    wire: torch.Tensor,
    bits: int,
    bucket_size: int,
    layout: WireLayout,
    dtype: torch.dtype,
    *,
    buckets_per_program: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Decode a ``[R, layout.wire_bytes]`` wire into ``[R, layout.numel]`` values of ``dtype``."""
    rows = wire.shape[0]
    _check(bits, bucket_size, rows, layout)
    wire = aligned_rows(wire)
    out = torch.empty(rows, layout.numel, dtype=dtype, device=wire.device)
    nb = layout.num_buckets
    groups, bpp, warps = _config(bucket_size, nb, wire.device, buckets_per_program, num_warps)
    _dequantize_kernel[(triton.cdiv(nb, bpp), rows)](
        wire, wire.view(torch.float32), out,
        layout.numel, nb, layout.meta_offset, _row_stride(wire), _row_stride(out),
        BITS=bits, BUCKET=bucket_size, GROUPS=groups, BPP=bpp, EMULATE_BF16_RNE=emulate_bf16_rne(),
        num_warps=warps, enable_fp_fusion=False,
    )  # fmt: skip
    return out


def decode_sum(
    wire: torch.Tensor,
    bits: int,
    bucket_size: int,
    layout: WireLayout,
    *,
    buckets_per_program: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Sum of the fp32 decodes of the rows of a ``[R, layout.wire_bytes]`` wire, in row order: fp32 ``[numel]``."""
    rows = wire.shape[0]
    _check(bits, bucket_size, rows, layout)
    wire = aligned_rows(wire)
    out = torch.empty(layout.numel, dtype=torch.float32, device=wire.device)
    nb = layout.num_buckets
    groups, bpp, warps = _config(bucket_size, nb, wire.device, buckets_per_program, num_warps)
    _dequantize_sum_kernel[(triton.cdiv(nb, bpp),)](
        wire, wire.view(torch.float32), out,
        layout.numel, nb, layout.meta_offset, _row_stride(wire),
        ROWS=rows, BITS=bits, BUCKET=bucket_size, GROUPS=groups, BPP=bpp,
        num_warps=warps, enable_fp_fusion=False,
    )  # fmt: skip
    return out
