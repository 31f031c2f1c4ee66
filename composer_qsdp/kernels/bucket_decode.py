"""Decode kernels shared by the codecs whose wire is packed codes plus fp32 words of per-bucket metadata (min-max,
learned levels): ``decode_rows`` into any float dtype, and ``decode_sum`` of the rows in fp32, optionally divided
by an integer (a reduce-scatter's average) and rounded into any float dtype.

A codec passes its per-tile decoder, a ``@triton.jit`` function with the signature of ``minmax._decode_tile``
(``(wire_ptr, meta_ptr, row, b, g, lane, e, valid, n, num_buckets, meta_offset, wire_row_stride, BITS, BUCKET,
BPP)`` -> fp32 values on the tile), as the constexpr ``DECODE_TILE``: Triton compiles one variant per decoder, and
the loops, stores and launch logic live here once. Tiles are :func:`composer_qsdp.kernels.groups.split_tile`'s
(coalesced stores); outputs go through :func:`composer_qsdp.kernels.cast.store_cast` (round to nearest even);
the sum runs over rows in order from +0.0 and divides with ``div_rn``, as the codecs' torch references do.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from composer_qsdp.kernels.cast import emulate_bf16_rne, store_cast
from composer_qsdp.kernels.groups import cdiv, row_stride, split_tile, vec
from composer_qsdp.kernels.layout import WireLayout

__all__ = ["decode_output", "launch_decode"]


@triton.jit
def _dequantize_kernel(
    wire_ptr, meta_ptr, out_ptr,
    n, num_buckets, meta_offset, wire_row_stride, out_row_stride,
    DECODE_TILE: tl.constexpr, BITS: tl.constexpr, BUCKET: tl.constexpr, GROUPS: tl.constexpr, BPP: tl.constexpr,
    VEC: tl.constexpr, EMULATE_BF16_RNE: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    b, g, lane, e, valid = split_tile(pid, n, BUCKET, GROUPS, BPP, VEC)
    y = DECODE_TILE(wire_ptr, meta_ptr, row, b, g, lane, e, valid, n, num_buckets, meta_offset, wire_row_stride,
                    BITS, BUCKET, BPP)  # fmt: skip
    store_cast(out_ptr + row * out_row_stride + e, y, valid, EMULATE_BF16_RNE)


@triton.jit
def _dequantize_sum_kernel(
    wire_ptr, meta_ptr, out_ptr,
    n, num_buckets, meta_offset, wire_row_stride, divisor,
    DECODE_TILE: tl.constexpr, ROWS: tl.constexpr, BITS: tl.constexpr, BUCKET: tl.constexpr, GROUPS: tl.constexpr,
    BPP: tl.constexpr, VEC: tl.constexpr, DIVIDE: tl.constexpr, EMULATE_BF16_RNE: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    b, g, lane, e, valid = split_tile(pid, n, BUCKET, GROUPS, BPP, VEC)
    acc = tl.zeros(e.shape, tl.float32)
    for row in range(ROWS):  # in row order, like the references
        acc += DECODE_TILE(wire_ptr, meta_ptr, tl.cast(row, tl.int64), b, g, lane, e, valid, n, num_buckets,
                           meta_offset, wire_row_stride, BITS, BUCKET, BPP)  # fmt: skip
    if DIVIDE:  # an average: the references' fp32 division, then one rounding to the output dtype
        acc = tl.math.div_rn(acc, tl.full(acc.shape, divisor, tl.float32))
    store_cast(out_ptr + e, acc, valid, EMULATE_BF16_RNE)


def decode_output(wire: torch.Tensor, layout: WireLayout, dtype: torch.dtype, sum_rows: bool,
                  out: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
    """The output of a decode of the ``[R, wire_bytes]`` ``wire``: ``out`` checked (``[numel]`` for a sum, else
    ``[R, numel]``, of ``dtype``, rows contiguous), or a new tensor."""
    shape = (layout.numel,) if sum_rows else (wire.shape[0], layout.numel)
    if out is None:
        return torch.empty(shape, dtype=dtype, device=wire.device)
    if tuple(out.shape) != shape or out.dtype != dtype or out.stride(-1) != 1:
        raise ValueError(f"out must be a {list(shape)} tensor of {dtype} with contiguous rows, got "
                         f"{out.dtype} {tuple(out.shape)} with strides {out.stride()}")  # fmt: skip
    return out


def launch_decode(wire: torch.Tensor, layout: WireLayout, out: torch.Tensor, sum_rows: bool, decode_tile: object,
                  bits: int, bucket_size: int, launch: tuple[int, int, int], divisor: int = 1) -> torch.Tensor:  # fmt: skip
    """Decode the ``[R, wire_bytes]`` ``wire`` (rows 4-byte aligned) into ``out`` (from :func:`decode_output`) with
    the codec's ``decode_tile``; ``launch`` is ``(GROUPS, buckets per program, warps)``; a sum is divided by
    ``divisor`` in fp32. Returns ``out``."""
    groups, bpp, warps = launch
    nb = layout.num_buckets
    constants = {"DECODE_TILE": decode_tile, "BITS": bits, "BUCKET": bucket_size, "GROUPS": groups, "BPP": bpp,
                 "VEC": vec(out.dtype), "EMULATE_BF16_RNE": emulate_bf16_rne(), "num_warps": warps,
                 "enable_fp_fusion": False}  # fmt: skip
    meta = wire.view(torch.float32)
    if sum_rows:
        _dequantize_sum_kernel[(cdiv(nb, bpp),)](
            wire, meta, out, layout.numel, nb, layout.meta_offset, row_stride(wire), float(divisor),
            ROWS=wire.shape[0], DIVIDE=divisor != 1, **constants,
        )  # fmt: skip
    else:
        _dequantize_kernel[(cdiv(nb, bpp), wire.shape[0])](
            wire, meta, out, layout.numel, nb, layout.meta_offset, row_stride(wire), row_stride(out), **constants,
        )  # fmt: skip
    return out
