"""Triton kernels of the 1-bit sign codec: fused scale+sign+pack, unpack+scale, and unpack+scale+sum over rows.

Reference: :class:`composer_qsdp.quant.sign.SignCodec` (same wire, and the decodes bit for bit): per bucket of
``d`` elements, ``scale = sqrt(sum(x * x) / d)`` in fp32, bit ``j % 8`` of byte ``j // 8`` of the bucket set when
element ``j`` is ``>= 0``, the fp32 scales after the codes at ``meta_offset``; decoded values are ``+-scale``. The
encode's codes equal the reference's; its scales may differ from the reference's in the last bits, as the two sum
the squares in different orders (every rank decodes the same wire, so ranks never disagree). The decode-and-sum
adds the rows in order 0..R-1 from +0.0, as :func:`composer_qsdp.quant.codec.sum_rows_in_order`.

The launchers take ``[rows, n]`` tensors and the wire format's sizes as plain integers (this module knows nothing
of the codec layer); they run on CUDA tensors, and on CPU tensors under ``TRITON_INTERPRET=1`` (CI). A program
holds whole buckets of one row as a ``[buckets, groups of 8, 8]`` tile: a bucket's sum of squares is one
in-register reduction and a group's 8 signs one byte.

Coverage: buckets of a multiple of 8 elements up to :data:`MAX_BUCKET`; the codec uses its torch reference
otherwise.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from composer_qsdp.kernels.cast import emulate_bf16_rne, store_cast
from composer_qsdp.kernels.groups import cdiv, next_power_of_2

__all__ = ["MAX_BUCKET", "decode_rows", "decode_sum", "encode_rows", "supports"]

#: Largest bucket (elements) a program holds in registers.
MAX_BUCKET = 8192
#: Elements per program: on a GPU about a warp's worth of work per 32 elements; under the interpreter, whose cost
#: is per program, as many as possible.
_GPU_TILE, _INTERPRETER_TILE = 2048, 65536


def supports(bucket_size: int) -> bool:
    """True when a kernel covers buckets of ``bucket_size`` elements (a multiple of 8 up to :data:`MAX_BUCKET`)."""
    return 8 <= bucket_size <= MAX_BUCKET and bucket_size % 8 == 0


@triton.jit
def _tile(pid, n, num_buckets, BUCKET: tl.constexpr, GROUPS: tl.constexpr, BPP: tl.constexpr):
    """Program ``pid``'s buckets ``[BPP]`` and groups ``[GROUPS]``, the element indices ``[BPP, GROUPS, 8]`` and
    their mask, the byte offsets of the groups' codes in a row ``[BPP, GROUPS]`` and the mask of the groups that
    hold at least one element."""
    bucket = pid * BPP + tl.arange(0, BPP)
    group = tl.arange(0, GROUPS)
    first = bucket[:, None] * BUCKET + group[None, :] * 8  # [BPP, GROUPS]: each group's first element
    group_ok = (group[None, :] * 8 < BUCKET) & (bucket[:, None] < num_buckets) & (first < n)
    e = first[:, :, None] + tl.arange(0, 8)[None, None, :]
    valid = group_ok[:, :, None] & (e < n)
    return bucket, e, valid, bucket[:, None] * (BUCKET // 8) + group[None, :], group_ok


@triton.jit
def _encode_kernel(x_ptr, wire_ptr, n, num_buckets, x_stride, wire_stride, code_bytes, meta_offset,
                   BUCKET: tl.constexpr, GROUPS: tl.constexpr, BPP: tl.constexpr):
    pid, row = tl.program_id(0), tl.program_id(1).to(tl.int64)
    bucket, e, valid, byte_offset, group_ok = _tile(pid, n, num_buckets, BUCKET, GROUPS, BPP)
    x = tl.load(x_ptr + row * x_stride + e, mask=valid, other=0.0).to(tl.float32)
    count = tl.maximum(tl.minimum(n - bucket * BUCKET, BUCKET), 1).to(tl.float32)  # >= 1: past the end, masked
    scale = tl.sqrt_rn(tl.div_rn(tl.sum(tl.sum(x * x, axis=2), axis=1), count))
    signs = ((x >= 0) & valid).to(tl.int32)
    byte = tl.sum(signs << tl.arange(0, 8)[None, None, :], axis=2)
    row_wire = wire_ptr + row * wire_stride
    tl.store(row_wire + byte_offset, byte.to(tl.uint8), mask=group_ok)
    meta = (row_wire + meta_offset).to(tl.pointer_type(tl.float32))
    tl.store(meta + bucket, scale, mask=bucket < num_buckets)
    pad = code_bytes + tl.arange(0, 4)  # the zero bytes between the codes and the 4-byte aligned scales
    tl.store(row_wire + pad, tl.zeros([4], tl.uint8), mask=(pad < meta_offset) & (pid == 0))


@triton.jit
def _decode_row(row_wire, bucket, byte_offset, group_ok, num_buckets, meta_offset):
    """fp32 ``+-scale`` values of one wire row on a program's tile (garbage past the row's end)."""
    byte = tl.load(row_wire + byte_offset, mask=group_ok, other=0).to(tl.int32)
    meta = (row_wire + meta_offset).to(tl.pointer_type(tl.float32))
    scale = tl.load(meta + bucket, mask=bucket < num_buckets, other=0.0)
    sign = (((byte[:, :, None] >> tl.arange(0, 8)[None, None, :]) & 1) * 2 - 1).to(tl.float32)  # exactly +-1
    return sign * scale[:, None, None]


@triton.jit
def _decode_kernel(wire_ptr, out_ptr, n, num_buckets, wire_stride, out_stride, meta_offset,
                   BUCKET: tl.constexpr, GROUPS: tl.constexpr, BPP: tl.constexpr, SUM: tl.constexpr,
                   ROWS: tl.constexpr, EMULATE_BF16_RNE: tl.constexpr):
    bucket, e, valid, byte_offset, group_ok = _tile(tl.program_id(0), n, num_buckets, BUCKET, GROUPS, BPP)
    if SUM:
        # Rows in order from +0.0, like the reference's loop, so the fp32 sum is the same.
        acc = tl.zeros([BPP, GROUPS, 8], tl.float32)
        for row in range(ROWS):
            row_wire = wire_ptr + tl.cast(row, tl.int64) * wire_stride
            acc += _decode_row(row_wire, bucket, byte_offset, group_ok, num_buckets, meta_offset)
        tl.store(out_ptr + e, acc, mask=valid)
    else:
        row = tl.program_id(1).to(tl.int64)
        value = _decode_row(wire_ptr + row * wire_stride, bucket, byte_offset, group_ok, num_buckets, meta_offset)
        store_cast(out_ptr + row * out_stride + e, value, valid, EMULATE_BF16_RNE)


def _launch(bucket_size: int, numel: int, rows: int, on_gpu: bool) -> tuple[int, int, int, int]:
    """(groups per bucket as a power of two, buckets per program, programs per row, number of buckets)."""
    num_buckets = -(-numel // bucket_size)
    groups = next_power_of_2(bucket_size // 8)
    target = _GPU_TILE if on_gpu else _INTERPRETER_TILE
    bpp = max(1, min(next_power_of_2(num_buckets), target // (groups * 8)))
    return groups, bpp, cdiv(num_buckets, bpp), num_buckets


def encode_rows(x: torch.Tensor, bucket_size: int, wire_bytes: int, code_bytes: int,
                meta_offset: int) -> torch.Tensor:
    """The ``[R, wire_bytes]`` uint8 wires of the rows of ``[R, n]`` floating ``x`` (any float dtype; the byte
    format: codes in ``[0, code_bytes)``, zeros up to ``meta_offset``, then one fp32 scale per bucket)."""
    rows, n = x.shape
    x = x.contiguous()
    wire = torch.empty(rows, wire_bytes, dtype=torch.uint8, device=x.device)
    groups, bpp, programs, num_buckets = _launch(bucket_size, n, rows, x.is_cuda)
    _encode_kernel[(programs, rows)](x, wire, n, num_buckets, x.stride(0), wire.stride(0), code_bytes, meta_offset,
                                     BUCKET=bucket_size, GROUPS=groups, BPP=bpp, num_warps=4)
    return wire


def decode_rows(wire: torch.Tensor, bucket_size: int, numel: int, meta_offset: int,
                dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The ``[R, numel]`` values of the ``[R, wire_bytes]`` wires (rows contiguous, 4-byte aligned) in ``dtype``:
    the fp32 values rounded to nearest even in registers, so a bf16 decode writes 2 bytes per element instead of
    4 and a cast pass."""
    rows = wire.shape[0]
    out = torch.empty(rows, numel, dtype=dtype, device=wire.device)
    groups, bpp, programs, num_buckets = _launch(bucket_size, numel, rows, wire.is_cuda)
    _decode_kernel[(programs, rows)](wire, out, numel, num_buckets, wire.stride(0), out.stride(0), meta_offset,
                                     BUCKET=bucket_size, GROUPS=groups, BPP=bpp, SUM=False, ROWS=1,
                                     EMULATE_BF16_RNE=emulate_bf16_rne(), num_warps=4)
    return out


def decode_sum(wire: torch.Tensor, bucket_size: int, numel: int, meta_offset: int) -> torch.Tensor:
    """The fp32 sum of the decoded rows of the ``[R, wire_bytes]`` wires, added in order 0..R-1 from +0.0."""
    out = torch.empty(numel, dtype=torch.float32, device=wire.device)
    groups, bpp, programs, num_buckets = _launch(bucket_size, numel, wire.shape[0], wire.is_cuda)
    _decode_kernel[(programs,)](wire, out, numel, num_buckets, wire.stride(0), 0, meta_offset,
                                BUCKET=bucket_size, GROUPS=groups, BPP=bpp, SUM=True, ROWS=wire.shape[0],
                                EMULATE_BF16_RNE=False, num_warps=4)
    return out
