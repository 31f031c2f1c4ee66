"""Triton kernels of the symmetric abs-max codec: fused quantize+pack, unpack+dequantize, dequantize-and-sum, each
optionally fused with the bucketed Hadamard rotation (:mod:`composer_qsdp.kernels.hadamard`).

Reference (same math, same wire, same numbers bit for bit): the symmetric codec of the ``quant`` layer
(``quant.symmetric.SymmetricCodec``), methods ``_encode_rows_reference`` (:func:`encode_rows`) and
``_decode_rows_fp32`` (:func:`decode_rows`, :func:`decode_sum`); with ``rotate=True``, the rotation
(``quant.hadamard.hadamard_rows``) before the encode and after the decode (or the sum), as ``HadamardCodec``
composes them. The launchers take ``[rows, n]`` tensors, so one launch covers every chunk of a reduce-scatter;
they run on CUDA tensors, and on CPU tensors under ``TRITON_INTERPRET=1`` (CI).

Tiling (:mod:`composer_qsdp.kernels.groups`): a program handles whole buckets of one row as a tile of groups of
8 elements, so a bucket's abs-max is one in-register reduction, the 8 codes of a group pack into one aligned
``bits``-byte word inside a thread, and one read of ``x`` and one write of the wire cover everything. With
``rotate`` the tile's buckets are rotated in registers (:func:`composer_qsdp.kernels.hadamard.butterflies`) right
after the load, or right before the store: the rotated values never go through memory.

Exactness: every fp32 operation of the reference appears once, in its order; divisions use ``div_rn`` (IEEE)
instead of Triton's approximate ``/``; launches pass ``enable_fp_fusion=False`` so ``acc + level * scale`` is not
contracted into an FMA; ``torch.round``'s half-to-even rounding is one addition of
:data:`composer_qsdp.kernels.groups.MAGIC`, and levels are read back as fp32 through the same identity (no
conversion instructions); bf16 outputs round to nearest even under the interpreter too
(:mod:`composer_qsdp.kernels.cast`). Only NaN payloads may differ (GPUs write the canonical NaN).

Coverage: ``bits`` in :data:`SUPPORTED_BITS`, ``bucket_size`` a multiple of 8 up to :data:`MAX_BUCKET` (a power
of two with ``rotate``); the codec uses its torch reference for other configurations.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from composer_qsdp.kernels.abs_max import abs_max, abs_max_codes, abs_max_decode, bucket_scales, tile_abs_max
from composer_qsdp.kernels.cast import emulate_bf16_rne, store_average, store_cast
from composer_qsdp.kernels.groups import ELEMENTS_PER_THREAD, GPU_TILE, INTERPRETER_TILE
from composer_qsdp.kernels.groups import MAX_BUCKET, MAX_ROWS, launch_fits, launch_shape, load_codes
from composer_qsdp.kernels.groups import cdiv, output_buffer, row_stride, split_tile, store_codes, tile, vec
from composer_qsdp.kernels.hadamard import butterflies, rotated_store, rotation_scale
from composer_qsdp.kernels.wire_format import WireFormat, aligned_rows

__all__ = ["MAX_BUCKET", "SUPPORTED_BITS", "supports", "encode_rows", "decode_rows", "decode_add_rows", "decode_sum"]

#: Code widths with a kernel (a group of 8 codes is exactly ``bits`` bytes): every width the codec takes.
SUPPORTED_BITS = (2, 3, 4, 5, 6, 7, 8)
#: Elements per thread of the launches that fuse the Hadamard rotation (the others use ``ELEMENTS_PER_THREAD``).
ROTATED_ELEMENTS_PER_THREAD = 64


def supports(bits: int, bucket_size: int, rotate: bool = False) -> bool:
    """True when a kernel covers ``bits`` and ``bucket_size`` (elements: a multiple of 8 up to :data:`MAX_BUCKET`,
    and a power of two when the kernel also applies the Hadamard rotation, ``rotate``)."""
    power_of_two = bucket_size & (bucket_size - 1) == 0
    return bits in SUPPORTED_BITS and 8 <= bucket_size <= MAX_BUCKET and bucket_size % 8 == 0 and (
        power_of_two or not rotate)  # fmt: skip


@triton.jit
def _rotated_load(x_ptr, pid, n_in, BUCKET: tl.constexpr, LOG_B: tl.constexpr, GROUPS: tl.constexpr,
                  BPP: tl.constexpr, VEC: tl.constexpr, scale):  # fmt: skip
    """The Hadamard rotation of the zero-padded buckets of program ``pid`` of a row on the ``[G, BPP, H, V]`` tile
    (loaded bucket-major, as the rotation kernel does, then rearranged once), and the buckets' NaN-propagating
    abs-max ``[1, BPP, 1, 1]``, reduced before the rearrangement, where a bucket spans few threads."""
    col = (pid * BPP + tl.arange(0, BPP))[:, None] * BUCKET + tl.arange(0, BUCKET)[None, :]
    v = tl.load(x_ptr + col, mask=col < n_in, other=0.0).to(tl.float32)
    v = tl.reshape(butterflies(tl.reshape(v, (BPP * BUCKET,)), BUCKET, LOG_B), (BPP, BUCKET)) * scale
    absmax = tl.reduce(tl.abs(v), 1, abs_max)
    return tl.permute(tl.reshape(v, (BPP, GROUPS, 8 // VEC, VEC)), (1, 0, 2, 3)), absmax[None, :, None, None]


@triton.jit
def _encode_kernel(
    x_ptr, ref_ptr, wire_ptr, n_in, n, x_row_stride, ref_row_stride, wire_row_stride, num_buckets, code_bytes,
    meta_offset, scale_rot,
    BITS: tl.constexpr, BUCKET: tl.constexpr, GROUPS: tl.constexpr, BPP: tl.constexpr, VEC: tl.constexpr,
    QMAX: tl.constexpr, ROTATE: tl.constexpr, LOG_B: tl.constexpr, PARTIAL_GROUPS: tl.constexpr,
    DIFFERENCE: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    b, g, lane, e, valid = tile(pid, n, BUCKET, GROUPS, BPP, VEC)
    if ROTATE:  # columns n_in..n are the zero padding of the rotation
        x, absmax = _rotated_load(x_ptr + row * x_row_stride, pid, n_in, BUCKET, LOG_B, GROUPS, BPP, VEC, scale_rot)
    else:
        x = tl.load(x_ptr + row * x_row_stride + e, mask=valid, other=0.0).to(tl.float32)
        if DIFFERENCE:  # the same fp32 subtraction as the reference's, never written to memory
            x = x - tl.load(ref_ptr + row * ref_row_stride + e, mask=valid, other=0.0).to(tl.float32)
        absmax = tile_abs_max(x, valid)
    codes, scale = abs_max_codes(x, absmax, QMAX)

    row_wire = wire_ptr + row * tl.multiple_of(wire_row_stride, 4)  # wire rows are whole fp32 words
    store_codes(row_wire, codes, pid, b, g, lane, e, valid, n, num_buckets, code_bytes, meta_offset,
                BITS, BUCKET, BPP, PARTIAL_GROUPS)  # fmt: skip
    meta = (row_wire + meta_offset).to(tl.pointer_type(tl.float32))
    tl.store(meta + b, scale, mask=b < num_buckets)


@triton.jit
def _decode_tile(row_wire, b, g, lane, e, valid, n, num_buckets, meta_offset,
                 BITS: tl.constexpr, BUCKET: tl.constexpr, BPP: tl.constexpr, QMAX: tl.constexpr):  # fmt: skip
    """fp32 values of one wire row on the tile ``(b, g, lane, e, valid)`` (garbage where not ``valid``)."""
    codes = load_codes(row_wire, b, g, lane, e, valid, n, BITS, BUCKET)
    scale = bucket_scales(row_wire, meta_offset, num_buckets, BPP)[None, :, None, None]
    return abs_max_decode(codes, scale, QMAX)


@triton.jit
def _decode_kernel(
    wire_ptr, out_ptr, n, n_out, wire_row_stride, out_row_stride, num_buckets, meta_offset, scale_rot, divisor,
    BITS: tl.constexpr, BUCKET: tl.constexpr, GROUPS: tl.constexpr, BPP: tl.constexpr, VEC: tl.constexpr,
    QMAX: tl.constexpr, ROTATE: tl.constexpr, LOG_B: tl.constexpr, SUM: tl.constexpr, ROWS: tl.constexpr,
    EMULATE_BF16_RNE: tl.constexpr, ADD: tl.constexpr, DIVIDE: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    if ROTATE:  # the rotation rearranges the tile anyway
        b, g, lane, e, valid = tile(pid, n, BUCKET, GROUPS, BPP, VEC)
    else:  # coalesced fp32 stores
        b, g, lane, e, valid = split_tile(pid, n, BUCKET, GROUPS, BPP, VEC)
    if SUM:
        # Rows in order from +0.0, like the reference's loop, so the fp32 sum is the same.
        acc = tl.zeros(e.shape, tl.float32)
        for row in range(ROWS):
            row_wire = wire_ptr + tl.cast(row, tl.int64) * tl.multiple_of(wire_row_stride, 4)
            acc += _decode_tile(row_wire, b, g, lane, e, valid, n, num_buckets, meta_offset, BITS, BUCKET, BPP, QMAX)
        if ROTATE:  # the sum of the rotated rows, rotated back once (an average divides after it, as the reference)
            rotated_store(out_ptr, acc, pid, n_out, BUCKET, LOG_B, scale_rot, EMULATE_BF16_RNE, divisor, DIVIDE)
        else:
            store_average(out_ptr + e, acc, valid, divisor, DIVIDE, EMULATE_BF16_RNE)
    else:
        row = tl.program_id(1).to(tl.int64)
        row_wire = wire_ptr + row * tl.multiple_of(wire_row_stride, 4)
        val = _decode_tile(row_wire, b, g, lane, e, valid, n, num_buckets, meta_offset, BITS, BUCKET, BPP, QMAX)
        if ROTATE:
            rotated_store(out_ptr + row * out_row_stride, val, pid, n_out, BUCKET, LOG_B, scale_rot,
                           EMULATE_BF16_RNE)  # fmt: skip
        else:
            if ADD:  # out += decoded, added in fp32 (not contracted: enable_fp_fusion=False) and rounded once
                val = tl.load(out_ptr + row * out_row_stride + e, mask=valid, other=0.0).to(tl.float32) + val
            store_cast(out_ptr + row * out_row_stride + e, val, valid, EMULATE_BF16_RNE)


def _config(bits: int, bucket_size: int, rows: int, fmt: WireFormat, rotate: bool, on_gpu: bool,
            buckets_per_program: int | None, num_warps: int | None) -> tuple[int, int, int]:  # fmt: skip
    """Validate a launch; return (GROUPS, buckets per program, warps)."""
    if not supports(bits, bucket_size, rotate):
        raise ValueError(
            f"no symmetric kernel for bits={bits}, bucket_size={bucket_size}, rotate={rotate}; allowed: bits in "
            f"{SUPPORTED_BITS}, bucket_size a multiple of 8 up to {MAX_BUCKET} (a power of two to rotate)"
        )
    if rows < 1 or not launch_fits(rows, fmt.numel):
        raise ValueError(f"rows={rows} must be in 1..{MAX_ROWS} and n={fmt.numel} below 2**31")
    # The rotation's butterflies and tile rearrangement go through shared memory: fewer, fuller warps (64 elements
    # per thread) exchange less of it per element.
    per_thread = ROTATED_ELEMENTS_PER_THREAD if rotate else ELEMENTS_PER_THREAD
    return launch_shape(bucket_size, fmt.num_buckets, on_gpu, GPU_TILE, INTERPRETER_TILE, per_thread,
                        buckets_per_program, num_warps)  # fmt: skip


def _rotation(bucket_size: int, rotate: bool) -> dict:
    """Launch arguments of the Hadamard rotation (unused when ``rotate`` is False)."""
    return {"scale_rot": rotation_scale(bucket_size) if rotate else 1.0, "ROTATE": rotate,
            "LOG_B": bucket_size.bit_length() - 1}  # fmt: skip


def encode_rows(
    x: torch.Tensor,
    bits: int,
    bucket_size: int,
    fmt: WireFormat,
    rotate: bool = False,
    buckets_per_program: int | None = None,
    num_warps: int | None = None,
    ref: torch.Tensor | None = None,
) -> torch.Tensor:
    """Encode each row of a ``[R, n]`` float tensor into ``[R, fmt.wire_bytes]`` ``uint8``.

    ``fmt`` is the codec's ``SymmetricCodec.wire_format(m)`` of ``m = n`` elements, or with ``rotate`` of ``m = n``
    padded to whole buckets, which then encodes each row's zero-padded buckets Hadamard-rotated. With ``ref`` (a
    ``[R, n]`` float tensor; not with ``rotate``) it encodes ``x - ref``, subtracted in fp32 in registers.
    ``buckets_per_program`` (a power of two) and ``num_warps`` override the launch shape, not the result.
    """
    if x.stride(1) != 1:
        x = x.contiguous()
    rows, n = x.shape
    if ref is not None:
        if rotate or ref.shape != x.shape:
            raise ValueError(f"a difference encode needs rotate=False and ref of x's shape {tuple(x.shape)}; got "
                             f"rotate={rotate}, ref of shape {tuple(ref.shape)}")  # fmt: skip
        ref = ref if ref.stride(1) == 1 else ref.contiguous()
    groups, bpp, warps = _config(bits, bucket_size, rows, fmt, rotate, x.is_cuda, buckets_per_program, num_warps)
    wire = torch.empty(rows, fmt.wire_bytes, dtype=torch.uint8, device=x.device)
    _encode_kernel[(cdiv(fmt.num_buckets, bpp), rows)](
        x, x if ref is None else ref, wire, n, fmt.numel, row_stride(x), row_stride(x if ref is None else ref),
        row_stride(wire), fmt.num_buckets, fmt.code_bytes, fmt.meta_offset, **_rotation(bucket_size, rotate),
        BITS=bits, BUCKET=bucket_size, GROUPS=groups, BPP=bpp, VEC=vec(x.dtype), QMAX=(1 << (bits - 1)) - 1,
        PARTIAL_GROUPS=bits < 8 and fmt.numel % 8 != 0, DIFFERENCE=ref is not None, num_warps=warps,
        enable_fp_fusion=False,
    )  # fmt: skip
    return wire


def _decode(wire: torch.Tensor, bits: int, bucket_size: int, fmt: WireFormat, out: torch.Tensor, sum_rows: bool,
            rotate: bool, buckets_per_program: int | None, num_warps: int | None,
            add: bool = False, divisor: int = 1) -> torch.Tensor:  # fmt: skip
    wire = aligned_rows(wire)
    rows = wire.shape[0]
    groups, bpp, warps = _config(bits, bucket_size, rows, fmt, rotate, wire.is_cuda, buckets_per_program,
                                 num_warps)  # fmt: skip
    tiles = cdiv(fmt.num_buckets, bpp)
    _decode_kernel[(tiles,) if sum_rows else (tiles, rows)](
        wire, out, fmt.numel, out.shape[-1], row_stride(wire), row_stride(out), fmt.num_buckets,
        fmt.meta_offset, divisor=float(divisor), **_rotation(bucket_size, rotate),
        BITS=bits, BUCKET=bucket_size, GROUPS=groups, BPP=bpp, VEC=vec(out.dtype), QMAX=(1 << (bits - 1)) - 1,
        SUM=sum_rows, ROWS=rows if sum_rows else 1, EMULATE_BF16_RNE=emulate_bf16_rne(), ADD=add,
        DIVIDE=divisor != 1,
        num_warps=warps, enable_fp_fusion=False,
    )  # fmt: skip
    return out


def decode_rows(
    wire: torch.Tensor,
    bits: int,
    bucket_size: int,
    fmt: WireFormat,
    dtype: torch.dtype,
    rotate: bool = False,
    numel: int | None = None,
    buckets_per_program: int | None = None,
    num_warps: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode a ``[R, fmt.wire_bytes]`` wire into ``[R, numel]`` values of ``dtype``: into ``out`` when given
    (that shape and dtype, rows contiguous).

    ``numel`` defaults to ``fmt.numel``; with ``rotate`` the decoded buckets are rotated back and the first
    ``numel <= fmt.numel`` columns kept (``HadamardCodec`` drops its padding so).
    """
    out = output_buffer((wire.shape[0], fmt.numel if numel is None else numel), dtype, wire.device, out)
    return _decode(wire, bits, bucket_size, fmt, out, False, rotate, buckets_per_program, num_warps)


def decode_add_rows(
    wire: torch.Tensor,
    bits: int,
    bucket_size: int,
    fmt: WireFormat,
    out: torch.Tensor,
    buckets_per_program: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """``out += decode_rows(wire)`` for a contiguous ``[R, fmt.numel]`` float ``out``, in one pass: each
    element's decoded value is added to ``out``'s in fp32 and rounded once to ``out``'s dtype. Returns ``out``."""
    if out.shape != (wire.shape[0], fmt.numel) or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous [{wire.shape[0]}, {fmt.numel}] tensor, got "
                         f"{tuple(out.shape)} (contiguous: {out.is_contiguous()})")  # fmt: skip
    return _decode(wire, bits, bucket_size, fmt, out, False, False, buckets_per_program, num_warps, add=True)


def decode_sum(
    wire: torch.Tensor,
    bits: int,
    bucket_size: int,
    fmt: WireFormat,
    rotate: bool = False,
    numel: int | None = None,
    buckets_per_program: int | None = None,
    num_warps: int | None = None,
    *,
    out: torch.Tensor | None = None,
    divisor: int = 1,
) -> torch.Tensor:
    """Sum, in row order from +0.0, of the fp32 decodes of the rows of a wire, divided by ``divisor`` in fp32: fp32
    ``[numel]`` (default ``fmt.numel``), or rounded into ``out`` (``[numel]``, any float dtype) when given; with
    ``rotate`` the sum is rotated back (then divided) and its first ``numel`` columns kept."""
    out = output_buffer((fmt.numel if numel is None else numel,), torch.float32 if out is None else out.dtype,
                        wire.device, out)  # fmt: skip
    return _decode(wire, bits, bucket_size, fmt, out, True, rotate, buckets_per_program, num_warps, divisor=divisor)
