"""Triton kernel of the bucketed, normalized fast Walsh-Hadamard transform.

It computes ``quant.hadamard.hadamard_rows`` (the torch reference in the layer above) on CUDA tensors (and on CPU
tensors under ``TRITON_INTERPRET=1``, in CI).

Each program loads a tile of ``G`` buckets of one row (zeros past the row's end, which is the padding),
runs the ``log2(B)`` butterfly stages in registers, scales by ``1 / sqrt(B)`` and stores the columns that
exist in the output, cast to its dtype. A stage with half-width ``h`` views the tile as
``[G * B / (2h), 2, h]`` and maps the two halves ``(a, b)`` to ``(a + b, a - b)``; blocks of ``2h <= B``
never straddle a bucket, so the flat tile can be transformed at once.

The stages are the torch reference's additions in the same order and the scale is the same fp32 number, so
the kernel gives the reference's fp32 results (checked bit for bit under the interpreter).
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl
import torch

from composer_qsdp.kernels.cast import emulate_bf16_rne, store_average, store_cast
from composer_qsdp.kernels.groups import cdiv, next_power_of_2, row_stride

__all__ = ["MAX_BUCKET", "supports", "hadamard_rows", "butterflies", "butterflies_rows", "rotated_store",
           "rotation_rows", "rotation_scale"]

#: Largest bucket (elements) a program transforms in registers.
MAX_BUCKET = 8192
# Elements per program: enough in flight per SM on a GPU; under the interpreter, whose cost is per program, few
# programs.
_GPU_TILE = 4096
_INTERPRETER_TILE = 65536


def supports(bucket_size: int) -> bool:
    """True when the kernel covers ``bucket_size`` (a power of two up to :data:`MAX_BUCKET` elements)."""
    return 1 <= bucket_size <= MAX_BUCKET and bucket_size & (bucket_size - 1) == 0


@triton.jit
def butterflies(v, B: tl.constexpr, LOG_B: tl.constexpr):
    """The ``log2(B)`` unscaled butterfly stages of every ``B``-element block of a flat fp32 tile, in the torch
    reference's order (stage ``h = 1, 2, ..., B / 2``: ``(a, b) -> (a + b, a - b)`` within blocks of ``2h``)."""
    N: tl.constexpr = v.shape[0]
    for stage in tl.static_range(LOG_B):
        pairs = tl.permute(tl.reshape(v, (N // (2 << stage), 2, 1 << stage)), (0, 2, 1))
        a, b = tl.split(pairs)
        v = tl.reshape(tl.permute(tl.join(a + b, a - b), (0, 2, 1)), (N,))
    return v


@triton.jit
def _butterflies_first(v, LOG: tl.constexpr):
    """The ``LOG`` unscaled butterfly stages along the first axis (``2**LOG`` elements) of a 2-D fp32 tile."""
    H: tl.constexpr = v.shape[0]
    M: tl.constexpr = v.shape[1]
    for stage in tl.static_range(LOG):
        pairs = tl.permute(tl.reshape(v, (H // (2 << stage), 2, 1 << stage, M)), (0, 2, 3, 1))
        a, b = tl.split(pairs)
        v = tl.reshape(tl.permute(tl.join(a + b, a - b), (0, 3, 1, 2)), (H, M))
    return v


@triton.jit
def butterflies_rows(v, LOG_R: tl.constexpr, LOG_C: tl.constexpr):
    """:func:`butterflies` of the buckets of a ``[R, BPP, H, V]`` fp32 tile that holds bucket ``b``'s element
    ``i * C + h * V + v`` at ``[i, b, h, v]`` (``R = 2**LOG_R`` rows of ``C = H * V = 2**LOG_C`` elements): the
    stages ``h < C`` run along the rows, then the others along the columns, the same additions in the same order."""
    R: tl.constexpr = v.shape[0]
    BPP: tl.constexpr = v.shape[1]
    H: tl.constexpr = v.shape[2]
    V: tl.constexpr = v.shape[3]
    t = _butterflies_first(tl.reshape(tl.permute(v, (2, 3, 0, 1)), (H * V, R * BPP)), LOG_C)
    v = tl.permute(tl.reshape(t, (H, V, R, BPP)), (2, 3, 0, 1))
    return tl.reshape(_butterflies_first(tl.reshape(v, (R, BPP * H * V)), LOG_R), (R, BPP, H, V))


@triton.jit
def rotated_store(out_ptr, v, pid, n_out, BUCKET: tl.constexpr, LOG_B: tl.constexpr, scale,
                  EMULATE_BF16_RNE: tl.constexpr, divisor=1.0, DIVIDE: tl.constexpr = False):  # fmt: skip
    """Store the first ``n_out`` columns of the Hadamard rotation (``scale``: :func:`rotation_scale`) of the buckets
    of program ``pid``'s ``[G, BPP, H, V]`` tile of groups of 8 (``composer_qsdp.kernels.groups.tile``); with
    ``DIVIDE`` each rotated value is divided by ``divisor`` in fp32 (``div_rn``) before its one rounding to the
    output's dtype, as a reference that rotates, then averages does."""
    BPP: tl.constexpr = v.shape[1]
    flat = butterflies(tl.reshape(tl.permute(v, (1, 0, 2, 3)), (BPP * BUCKET,)), BUCKET, LOG_B)
    col = (pid * BPP + tl.arange(0, BPP))[:, None] * BUCKET + tl.arange(0, BUCKET)[None, :]
    store_average(out_ptr + col, tl.reshape(flat, (BPP, BUCKET)) * scale, col < n_out, divisor, DIVIDE,
                  EMULATE_BF16_RNE)  # fmt: skip


@triton.jit
def _hadamard_kernel(
    x_ptr, y_ptr, n_in, n_out, x_row_stride, y_row_stride, scale,
    B: tl.constexpr, LOG_B: tl.constexpr, G: tl.constexpr, EMULATE_BF16_RNE: tl.constexpr,
):  # fmt: skip
    tile = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    bucket = tile.to(tl.int64) * G + tl.arange(0, G)
    col = bucket[:, None] * B + tl.arange(0, B)[None, :]
    v = tl.load(x_ptr + row * x_row_stride + col, mask=col < n_in, other=0.0).to(tl.float32)
    v = tl.reshape(butterflies(tl.reshape(v, (G * B,)), B, LOG_B), (G, B))
    store_cast(y_ptr + row * y_row_stride + col, v * scale, col < n_out, EMULATE_BF16_RNE)


def hadamard_rows(
    x: torch.Tensor,
    bucket_size: int,
    out_cols: int,
    dtype: torch.dtype,
    buckets_per_program: int | None = None,
    num_warps: int | None = None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Kernel launch of ``quant.hadamard.hadamard_rows`` (same arguments, validated there).

    ``buckets_per_program`` (a power of two) and ``num_warps`` override the launch shape, not the result. ``out``:
    the ``[R, out_cols]`` tensor of ``dtype`` (unit stride along a row) to write, which may be ``x`` itself: a
    program loads its buckets whole before it stores them, and no other program touches them.
    """
    if x.stride(1) != 1:
        x = x.contiguous()
    rows, n = x.shape
    g, warps = _launch_shape(x.device, bucket_size, out_cols, buckets_per_program, num_warps)
    y = torch.empty(rows, out_cols, dtype=dtype, device=x.device) if out is None else out
    scale = rotation_scale(bucket_size)
    _hadamard_kernel[(cdiv(cdiv(out_cols, bucket_size), g), rows)](
        x, y, n, out_cols, row_stride(x), row_stride(y), scale,
        B=bucket_size, LOG_B=bucket_size.bit_length() - 1, G=g, EMULATE_BF16_RNE=emulate_bf16_rne(), num_warps=warps,
    )  # fmt: skip
    return y


def rotation_rows(bits: int, bucket_size: int) -> int:
    """``log2`` of the row length (elements) in which the rotated kernels of ``bits``-bit codes (the min-max
    feedback quantize, the decode-sum rotated back) view a ``bucket_size``-element bucket (a power of two) for
    :func:`butterflies_rows`, or 0 where they rotate the bucket flat.

    A row is one code word: 16 codes where they fit 64 bits (not 5-7 bits), else 8, and at most the bucket; the
    view needs at most as many rows as a row has elements (a thread holds a row, then a column).
    """
    log_row = min(bucket_size.bit_length() - 1, 4 if bits <= 4 or bits == 8 else 3)
    return log_row if bucket_size <= 1 << (2 * log_row) else 0


# Every launch that rotates reads it: rounded once per bucket size, through a tensor placed on the CPU by name. On the
# default device, which a caller may have made CUDA (``torch.set_default_device``), that tensor would be copied to
# the GPU and read back, two host syncs per launch.
@functools.cache
def rotation_scale(bucket_size: int) -> float:
    """``1 / sqrt(bucket_size)`` rounded to fp32, the factor the torch reference applies after the butterflies."""
    return torch.tensor(bucket_size**-0.5, dtype=torch.float32, device="cpu").item()


def _launch_shape(device: torch.device, bucket_size: int, out_cols: int, buckets_per_program: int | None,
                  num_warps: int | None) -> tuple[int, int]:  # fmt: skip
    """Validate a launch; return (buckets per program, warps)."""
    if not supports(bucket_size):
        raise ValueError(f"no Hadamard kernel for bucket_size={bucket_size}; allowed: powers of two up to {MAX_BUCKET}")
    if buckets_per_program is None:
        target = _GPU_TILE if device.type == "cuda" else _INTERPRETER_TILE
        num_buckets = cdiv(out_cols, bucket_size)
        buckets_per_program = max(1, min(target // bucket_size, next_power_of_2(num_buckets)))
    elif buckets_per_program < 1 or buckets_per_program & (buckets_per_program - 1):
        raise ValueError(f"buckets_per_program={buckets_per_program} must be a power of two >= 1")
    if num_warps is None:
        num_warps = min(16, max(4, buckets_per_program * bucket_size // 512))  # 16 elements per thread
    return buckets_per_program, num_warps
