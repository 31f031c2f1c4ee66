"""Triton kernels of the symmetric abs-max codec: fused quantize+pack, unpack+dequantize, dequantize-and-sum.

Reference (same math, same wire, same numbers bit for bit): :class:`composer_qsdp.quant.symmetric.SymmetricCodec`,
methods ``_encode_rows_reference`` (:func:`encode_rows`) and ``_decode_rows_fp32`` (:func:`decode_rows`,
:func:`decode_sum`). The launchers take ``[rows, n]`` tensors, so one launch covers every chunk of a
reduce-scatter; they run on CUDA tensors, and on CPU tensors under ``TRITON_INTERPRET=1`` (CI).

Tiling: a program handles ``G`` buckets of one row as a ``[G, BP]`` tile (``BP`` = ``bucket_size`` rounded up
to a power of two, extra lanes masked), so a bucket's abs-max is one in-register reduction and its codes are
packed (``8 // bits`` per byte, shifted and summed) without leaving registers: one read of ``x``, one write of
the wire.

Exactness: every fp32 operation of the reference appears once, in its order; divisions use ``div_rn`` (IEEE)
instead of Triton's approximate ``/``; launches pass ``enable_fp_fusion=False`` so ``acc + code * scale`` is not
contracted into an FMA; ``torch.round``'s half-to-even rounding is the exact identity
``(v + 1.5 * 2**23) - 1.5 * 2**23`` for ``|v| < 2**22`` (here ``|v| <= qmax``); bf16 outputs round to nearest
even under the interpreter too (:mod:`composer_qsdp.kernels.cast`). Only NaN payloads may differ (GPUs write
the canonical NaN).

Coverage: ``bits`` in :data:`SUPPORTED_BITS`, ``bucket_size`` up to :data:`MAX_BUCKET`; the codec uses its
torch reference for other configurations.
"""

from __future__ import annotations

import triton
import triton.language as tl
import torch

from composer_qsdp.kernels.cast import emulate_bf16_rne, store_cast
from composer_qsdp.quant.wire import WireLayout, aligned_rows

__all__ = ["MAX_BUCKET", "SUPPORTED_BITS", "supports", "encode_rows", "decode_rows", "decode_sum"]

#: Code widths with a kernel (whole codes per byte).
SUPPORTED_BITS = (2, 4, 8)
#: Largest bucket (elements) a program holds in registers.
MAX_BUCKET = 8192
_FP32_MAX = tl.constexpr(3.4028234663852886e38)  # jit code reads only constexpr globals
_RNE_MAGIC = tl.constexpr(12582912.0)  # 1.5 * 2**23: adding and subtracting it rounds |v| < 2**22 half to even
# Elements per program: enough in flight per SM on a GPU; under the interpreter (~12 ms per program,
# almost independent of size) as few programs as possible.
_GPU_TILE = 4096
_INTERPRETER_TILE = 65536


def supports(bits: int, bucket_size: int) -> bool:
    """True when a kernel covers ``bits`` and ``bucket_size`` (elements, up to :data:`MAX_BUCKET`)."""
    return bits in SUPPORTED_BITS and 1 <= bucket_size <= MAX_BUCKET


def _config(bits: int, bucket_size: int, rows: int, layout: WireLayout, device: torch.device,
            buckets_per_program: int | None, num_warps: int | None) -> tuple[int, int, int]:  # fmt: skip
    """Validate a launch; return (BP, buckets per program, warps)."""
    if not supports(bits, bucket_size):
        raise ValueError(
            f"no symmetric kernel for bits={bits}, bucket_size={bucket_size}; allowed: bits in {SUPPORTED_BITS}, "
            f"bucket_size 1..{MAX_BUCKET}"
        )
    if not 1 <= rows <= 65535 or layout.numel >= 2**31:
        raise ValueError(f"rows={rows} must be in 1..65535 and n={layout.numel} below 2**31")
    bp = max(triton.next_power_of_2(bucket_size), 8 // bits)
    if buckets_per_program is None:
        target = _GPU_TILE if device.type == "cuda" else _INTERPRETER_TILE
        buckets_per_program = max(1, min(target // bp, triton.next_power_of_2(layout.num_buckets)))
    elif buckets_per_program < 1 or buckets_per_program & (buckets_per_program - 1):
        raise ValueError(f"buckets_per_program={buckets_per_program} must be a power of two >= 1")
    if num_warps is None:
        num_warps = min(16, max(4, buckets_per_program * bp // 512))  # 16 elements per thread
    return bp, buckets_per_program, num_warps


@triton.jit
def _encode_kernel(
    x_ptr, wire_ptr, n, x_row_stride, wire_row_stride, num_buckets, code_bytes, meta_offset,
    BUCKET: tl.constexpr, BUCKET_BYTES: tl.constexpr, BP: tl.constexpr, G: tl.constexpr,
    BITS: tl.constexpr, QMAX: tl.constexpr,
):
    tile = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    bucket = tile.to(tl.int64) * G + tl.arange(0, G)
    lane = tl.arange(0, BP)
    col = bucket[:, None] * BUCKET + lane[None, :]
    valid = (lane[None, :] < BUCKET) & (col < n)
    x = tl.load(x_ptr + row * x_row_stride + col, mask=valid, other=0.0).to(tl.float32)

    ax = tl.abs(x)
    absmax = tl.max(ax, axis=1)
    # Explicit flag: a max reduction may drop NaNs on the GPU.
    nonfinite = tl.max(tl.where(ax < float("inf"), 0, 1), axis=1) > 0
    scale = tl.where(nonfinite, float("nan"), tl.div_rn(absmax, QMAX * 1.0))
    positive = absmax > 0
    safe = tl.where(positive, absmax, 1.0)  # keeps the discarded branch free of 1/0 (interpreter warnings)
    inv = tl.where(positive, tl.minimum(tl.div_rn(tl.full([G], QMAX, tl.float32), safe), _FP32_MAX), 0.0)
    v = x * inv[:, None]
    q = (v + _RNE_MAGIC) - _RNE_MAGIC
    q = tl.minimum(tl.maximum(q, -QMAX * 1.0), QMAX * 1.0)
    q = tl.where(nonfinite[:, None], 0.0, q)
    code = tl.where(valid, q.to(tl.int32) + QMAX, 0)

    if BITS == 8:
        packed = code
        byte = lane
    else:
        per_byte: tl.constexpr = 8 // BITS
        grouped = tl.reshape(code, (G, BP // per_byte, per_byte))
        shifts = tl.arange(0, per_byte) * BITS
        packed = tl.sum(grouped << shifts[None, None, :], axis=2)
        byte = tl.arange(0, BP // per_byte)
    pos = bucket[:, None] * BUCKET_BYTES + byte[None, :]
    wire_row = wire_ptr + row * wire_row_stride
    tl.store(wire_row + pos, packed.to(tl.uint8), mask=(byte[None, :] < BUCKET_BYTES) & (pos < code_bytes))
    meta = (wire_row + meta_offset).to(tl.pointer_type(tl.float32))
    tl.store(meta + bucket, scale, mask=bucket < num_buckets)


@triton.jit
def _dequantize(wire_row, bucket, lane, valid, num_buckets, meta_offset,
                BUCKET_BYTES: tl.constexpr, BITS: tl.constexpr, QMAX: tl.constexpr):
    """fp32 values of a [G, BP] tile of one wire row (garbage where not ``valid``)."""
    if BITS == 8:
        code = tl.load(wire_row + bucket[:, None] * BUCKET_BYTES + lane[None, :], mask=valid, other=0)
    else:
        per_byte: tl.constexpr = 8 // BITS
        byte = tl.load(wire_row + bucket[:, None] * BUCKET_BYTES + (lane // per_byte)[None, :], mask=valid, other=0)
        code = (byte >> ((lane % per_byte) * BITS).to(tl.uint8)[None, :]) & ((1 << BITS) - 1)
    scale = tl.load((wire_row + meta_offset).to(tl.pointer_type(tl.float32)) + bucket, mask=bucket < num_buckets)
    return (code.to(tl.int32) - QMAX).to(tl.float32) * scale[:, None]


@triton.jit
def _decode_kernel(
    wire_ptr, out_ptr, n, wire_row_stride, out_row_stride, num_buckets, meta_offset,
    BUCKET: tl.constexpr, BUCKET_BYTES: tl.constexpr, BP: tl.constexpr, G: tl.constexpr,
    BITS: tl.constexpr, QMAX: tl.constexpr, SUM: tl.constexpr, ROWS: tl.constexpr, EMULATE_BF16_RNE: tl.constexpr,
):
    tile = tl.program_id(0)
    bucket = tile.to(tl.int64) * G + tl.arange(0, G)
    lane = tl.arange(0, BP)
    col = bucket[:, None] * BUCKET + lane[None, :]
    valid = (lane[None, :] < BUCKET) & (col < n)
    if SUM:
        # Rows in order from +0.0, like the reference's loop, so the fp32 sum is the same.
        acc = tl.zeros([G, BP], tl.float32)
        wire_row = wire_ptr
        for _ in range(ROWS):
            acc += _dequantize(wire_row, bucket, lane, valid, num_buckets, meta_offset, BUCKET_BYTES, BITS, QMAX)
            wire_row += wire_row_stride
        tl.store(out_ptr + col, acc, mask=valid)
    else:
        row = tl.program_id(1).to(tl.int64)
        val = _dequantize(wire_ptr + row * wire_row_stride, bucket, lane, valid, num_buckets, meta_offset,
                          BUCKET_BYTES, BITS, QMAX)
        store_cast(out_ptr + row * out_row_stride + col, val, valid, EMULATE_BF16_RNE)


def _row_stride(t: torch.Tensor) -> int:
    """Row stride for a launch: 0 for a single row, which lets Triton prove aligned, vectorizable addresses."""
    return t.stride(0) if t.dim() == 2 and t.shape[0] > 1 else 0


def encode_rows(
    x: torch.Tensor,
    bits: int,
    bucket_size: int,
    layout: WireLayout,
    buckets_per_program: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Encode each row of a ``[R, n]`` float tensor into ``[R, layout.wire_bytes]`` ``uint8``.

    ``layout`` is :meth:`SymmetricCodec.layout(n) <composer_qsdp.quant.symmetric.SymmetricCodec.layout>`;
    ``buckets_per_program`` (a power of two) and ``num_warps`` override the launch shape, not the result.
    """
    if x.stride(1) != 1:
        x = x.contiguous()
    rows, n = x.shape
    bp, g, warps = _config(bits, bucket_size, rows, layout, x.device, buckets_per_program, num_warps)
    wire = torch.empty(rows, layout.wire_bytes, dtype=torch.uint8, device=x.device)
    wire[:, layout.code_bytes : layout.meta_offset] = 0
    _encode_kernel[(triton.cdiv(layout.num_buckets, g), rows)](
        x, wire, n, _row_stride(x), _row_stride(wire), layout.num_buckets, layout.code_bytes, layout.meta_offset,
        BUCKET=bucket_size, BUCKET_BYTES=layout.bucket_bytes, BP=bp, G=g, BITS=bits, QMAX=(1 << (bits - 1)) - 1,
        num_warps=warps, enable_fp_fusion=False,
    )  # fmt: skip
    return wire


def _decode(wire: torch.Tensor, bits: int, bucket_size: int, layout: WireLayout, out: torch.Tensor, sum_rows: bool,
            buckets_per_program: int | None, num_warps: int | None) -> torch.Tensor:  # fmt: skip
    wire = aligned_rows(wire)
    rows = wire.shape[0]
    bp, g, warps = _config(bits, bucket_size, rows, layout, wire.device, buckets_per_program, num_warps)
    tiles = triton.cdiv(layout.num_buckets, g)
    _decode_kernel[(tiles,) if sum_rows else (tiles, rows)](
        wire, out, layout.numel, _row_stride(wire), _row_stride(out), layout.num_buckets, layout.meta_offset,
        BUCKET=bucket_size, BUCKET_BYTES=layout.bucket_bytes, BP=bp, G=g, BITS=bits, QMAX=(1 << (bits - 1)) - 1,
        SUM=sum_rows, ROWS=rows if sum_rows else 1, EMULATE_BF16_RNE=emulate_bf16_rne(),
        num_warps=warps, enable_fp_fusion=False,
    )  # fmt: skip
    return out


def decode_rows(
    wire: torch.Tensor,
    bits: int,
    bucket_size: int,
    layout: WireLayout,
    dtype: torch.dtype,
    buckets_per_program: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Decode a ``[R, layout.wire_bytes]`` wire into ``[R, layout.numel]`` values of ``dtype``."""
    out = torch.empty(wire.shape[0], layout.numel, dtype=dtype, device=wire.device)
    return _decode(wire, bits, bucket_size, layout, out, False, buckets_per_program, num_warps)


def decode_sum(
    wire: torch.Tensor,
    bits: int,
    bucket_size: int,
    layout: WireLayout,
    buckets_per_program: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Sum, in row order from +0.0, of the fp32 decodes of the rows of a wire: fp32 ``[layout.numel]``."""
    out = torch.empty(layout.numel, dtype=torch.float32, device=wire.device)
    return _decode(wire, bits, bucket_size, layout, out, True, buckets_per_program, num_warps)
