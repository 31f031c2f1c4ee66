"""Triton kernels of the learned-levels codec: fused bucketing + level search + stochastic rounding + pack,
unpack + level gather + dequantize, and dequantize-and-sum.

Reference (same math, same wire, same numbers bit for bit): the learned-levels codec of the ``quant`` layer
(``quant.learned.LearnedLevelsCodec``), methods ``_encode_rows_reference`` (:func:`encode_rows`),
``_decode_rows_fp32`` (:func:`decode_rows`) and ``_decode_sum_reference`` (:func:`decode_sum`). The codec passes
its levels (``K = 2**bits`` fp32 values on the input's device, 0 first and 1 last, strictly increasing) and its
wire layout; the launchers take ``[rows, n]`` tensors. They run on CUDA tensors, and on CPU tensors under
``TRITON_INTERPRET=1`` (CI).

Tiling, packing and exactness as the min-max kernels (:mod:`composer_qsdp.kernels.minmax`): one program holds
whole buckets as a tile of groups of 8 (:mod:`composer_qsdp.kernels.groups`), so bucketing, search, rounding and
packing are one pass over ``x``; every fp32 operation of the reference appears once, in its order, launched with
``enable_fp_fusion=False``, and the division of the rounding probability is ``div_rn`` (IEEE), as the
reference's tensor division is on every device.

Level search: ``j``, the largest index ``<= K - 2`` with ``l_j <= z``, by a branchless binary search (binary
lifting, ``bits`` steps) whose probes gather levels from the ``K``-entry table, ``4 * K`` bytes that stay in L1.
The probe rejected last is ``l_{j+1}`` and the one accepted last ``l_j``, so the bracket comes out of the
search without further gathers. Rounding ``code = j + floor(p + u)`` takes ``floor`` as the comparison
``p + u >= 1``: ``0 <= p <= 1`` and ``u < 1`` keep ``p + u`` below 2 (and ``j + 1 <= K - 1``, so the reference's
clamp never acts). ``u`` is :func:`composer_qsdp.kernels.noise.centered_noise` plus 1/2, which is exact.

Coverage: ``bits`` in :data:`SUPPORTED_BITS` and ``bucket_size`` a multiple of 8 up to :data:`MAX_BUCKET`; the
codec uses its torch reference for other configurations.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from composer_qsdp.kernels.cast import emulate_bf16_rne, store_cast
from composer_qsdp.kernels.groups import (GPU_TILE, INTERPRETER_TILE, MAX_BUCKET, MAX_ROWS, bucket_lattice,
                                          bucket_pair, launch_fits, launch_shape, load_codes, row_stride, split_tile,
                                          store_codes, tile, vec)  # fmt: skip
from composer_qsdp.kernels.layout import WireLayout, aligned_rows
from composer_qsdp.kernels.noise import centered_noise

__all__ = ["MAX_BUCKET", "SUPPORTED_BITS", "supports", "encode_rows", "decode_rows", "decode_sum"]

#: Code widths with a kernel (a group of 8 codes is exactly ``bits`` bytes).
SUPPORTED_BITS = (1, 2, 4, 8)
# Elements per thread on a GPU. The search keeps an index and two levels per element live beside the min-max
# kernel's state, and the decoders' level gathers issue one load per element: 16 keeps both without spills.
_ELEMENTS_PER_THREAD = 16


def supports(bits: int, bucket_size: int, rows: int = 1, n: int = 1) -> bool:
    """True when a kernel covers ``bits``, ``bucket_size`` (elements; a multiple of 8 up to ``MAX_BUCKET``),
    ``rows`` and ``n`` elements per row (:func:`composer_qsdp.kernels.groups.launch_fits`)."""
    return (bits in SUPPORTED_BITS and 8 <= bucket_size <= MAX_BUCKET and bucket_size % 8 == 0
            and launch_fits(rows, n))  # fmt: skip


# --------------------------------------------------------------------------------------------- kernels
@triton.jit
def _bracket(z, levels_ptr, BITS: tl.constexpr):
    """``(j, l_j, l_{j+1})`` for normalized values ``z``: ``j`` the largest index ``<= K - 2`` with ``l_j <= z``
    (0 where ``z`` is NaN), as int32 and fp32 tensors shaped like ``z``."""
    K: tl.constexpr = 1 << BITS
    j = tl.zeros(z.shape, tl.int32)
    lower = tl.zeros(z.shape, tl.float32) + tl.load(levels_ptr)
    upper = lower
    # Binary lifting: j stays a multiple of 2 * step, so a probe j + step reaches K - 1 only at the last step,
    # where the bracket's upper end is the limit. Every index above the final j that the search could still
    # reach is probed and rejected, the last of them being j + 1.
    for s in tl.static_range(BITS - 1, -1, -1):
        probe = j + (1 << s)
        level = tl.load(levels_ptr + probe)
        take = level <= z
        if s == 0:
            take = take & (probe < K - 1)
        j = tl.where(take, probe, j)
        lower = tl.where(take, level, lower)
        upper = tl.where(take, upper, level)
    return j, lower, upper


# Seeds and counter offsets change every step: specializing on their values (Triton compiles an integer equal to 1
# as a constant and one divisible by 16 apart) would compile new variants during training.
@triton.jit(do_not_specialize=["seed", "offset"])
def _quantize_kernel(
    x_ptr, levels_ptr, wire_ptr, meta_ptr,
    n, num_buckets, code_bytes, meta_offset, x_row_stride, wire_row_stride,
    seed, offset,
    BITS: tl.constexpr, BUCKET: tl.constexpr, GROUPS: tl.constexpr, BPP: tl.constexpr, VEC: tl.constexpr,
    ALIGNED: tl.constexpr, PARTIAL_GROUPS: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    b, g, lane, e, valid = tile(pid, n, BUCKET, GROUPS, BPP, VEC)
    x = tl.load(x_ptr + row * x_row_stride + e, mask=valid, other=0.0).to(tl.float32)

    # One step over the whole range: rng = max - min.
    lo, rng, inv, bad = bucket_lattice(x, valid, 1)
    # Only non-finite buckets give NaN here, and their codes are 0 whatever the search finds.
    z = tl.minimum(tl.maximum((x - lo) * inv, 0.0), 1.0)
    j, lower, upper = _bracket(z, levels_ptr, BITS)
    p = tl.math.div_rn(z - lower, upper - lower)
    u = centered_noise(seed, offset + row * n + b * BUCKET + g * 8, lane, ALIGNED) + 0.5
    codes = tl.where(bad, 0, j + (p + u >= 1.0).to(tl.int32))

    row_wire = wire_ptr + row * tl.multiple_of(wire_row_stride, 4)  # wire rows are whole fp32 words
    store_codes(row_wire, codes, pid, b, g, lane, e, valid, n, num_buckets, code_bytes, meta_offset,
                BITS, BUCKET, BPP, PARTIAL_GROUPS)  # fmt: skip
    row_meta = meta_ptr + row * (wire_row_stride // 4) + meta_offset // 4
    on = b < num_buckets
    tl.store(row_meta + 2 * b, tl.where(bad, float("nan"), lo), mask=on)
    tl.store(row_meta + 2 * b + 1, tl.where(bad, float("nan"), rng), mask=on)
    if pid == 0:  # the levels follow the per-bucket pairs; the row's first program copies them
        k = tl.arange(0, 1 << BITS)
        tl.store(row_meta + 2 * num_buckets + k, tl.load(levels_ptr + k))


@triton.jit
def _decode_tile(
    wire_ptr, meta_ptr, row, b, g, lane, e, valid, n, num_buckets, meta_offset, wire_row_stride,
    BITS: tl.constexpr, BUCKET: tl.constexpr, BPP: tl.constexpr,
):  # fmt: skip
    """Decoded fp32 values of wire row ``row`` on the tile ``(b, g, lane, e, valid)`` (``lo`` where not ``valid``)."""
    row_wire = wire_ptr + row * tl.multiple_of(wire_row_stride, 4)  # wire rows are whole fp32 words
    codes = load_codes(row_wire, b, g, lane, e, valid, n, BITS, BUCKET)
    lo, rng = bucket_pair(meta_ptr, row, wire_row_stride, meta_offset, num_buckets, BPP)
    # Codes are < K, so the gather stays inside the row's level table (4 * K bytes, L1-resident).
    levels = meta_ptr + row * (wire_row_stride // 4) + meta_offset // 4 + 2 * num_buckets
    return lo + tl.load(levels + codes) * rng


@triton.jit
def _dequantize_kernel(
    wire_ptr, meta_ptr, out_ptr,
    n, num_buckets, meta_offset, wire_row_stride, out_row_stride,
    BITS: tl.constexpr, BUCKET: tl.constexpr, GROUPS: tl.constexpr, BPP: tl.constexpr, VEC: tl.constexpr,
    EMULATE_BF16_RNE: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    b, g, lane, e, valid = split_tile(pid, n, BUCKET, GROUPS, BPP, VEC)  # coalesced fp32 stores
    y = _decode_tile(wire_ptr, meta_ptr, row, b, g, lane, e, valid, n, num_buckets, meta_offset, wire_row_stride,
                     BITS, BUCKET, BPP)  # fmt: skip
    store_cast(out_ptr + row * out_row_stride + e, y, valid, EMULATE_BF16_RNE)


@triton.jit
def _dequantize_sum_kernel(
    wire_ptr, meta_ptr, out_ptr,
    n, num_buckets, meta_offset, wire_row_stride,
    ROWS: tl.constexpr, BITS: tl.constexpr, BUCKET: tl.constexpr, GROUPS: tl.constexpr, BPP: tl.constexpr,
    VEC: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    b, g, lane, e, valid = split_tile(pid, n, BUCKET, GROUPS, BPP, VEC)  # coalesced fp32 stores
    acc = tl.zeros(e.shape, tl.float32)
    for row in range(ROWS):  # in row order, like the reference
        acc += _decode_tile(wire_ptr, meta_ptr, tl.cast(row, tl.int64), b, g, lane, e, valid, n, num_buckets,
                            meta_offset, wire_row_stride, BITS, BUCKET, BPP)  # fmt: skip
    tl.store(out_ptr + e, acc, mask=valid)


# --------------------------------------------------------------------------------------------- launchers
def _config(bucket_size: int, num_buckets: int, on_gpu: bool, buckets_per_program: int | None,
            num_warps: int | None) -> tuple[int, int, int]:  # fmt: skip
    """(GROUPS, buckets per program, warps) of a launch (:func:`composer_qsdp.kernels.groups.launch_shape`)."""
    return launch_shape(bucket_size, num_buckets, on_gpu, GPU_TILE, INTERPRETER_TILE, _ELEMENTS_PER_THREAD,
                        buckets_per_program, num_warps)  # fmt: skip


def _check(bits: int, bucket_size: int, rows: int, layout: WireLayout) -> None:
    if not supports(bits, bucket_size, rows, layout.numel):
        raise ValueError(
            f"no learned-levels kernel for bits={bits}, bucket_size={bucket_size}, rows={rows}, n={layout.numel}; "
            f"allowed: bits in {SUPPORTED_BITS}, bucket_size a multiple of 8 up to {MAX_BUCKET}, rows up to "
            f"{MAX_ROWS}, n below 2**31"
        )


def encode_rows(
    x: torch.Tensor,
    levels: torch.Tensor,
    bits: int,
    bucket_size: int,
    layout: WireLayout,
    seed: int,
    offset: int,
    *,
    buckets_per_program: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Quantize each row of ``x`` ``[R, n]`` onto ``levels``: ``[R, layout.wire_bytes]`` ``uint8``, the codec's wire.

    Args:
        x: ``[R, n]`` fp32, bf16 or fp16.
        levels: the ``2**bits`` normalized levels, fp32 on ``x``'s device, strictly increasing from 0 to 1 (the
            codec validates them; they are not checked here, which would synchronize with the host).
        bits, bucket_size: the codec's (elements per bucket).
        layout: the codec's ``LearnedLevelsCodec.layout(n)``.
        seed, offset: row ``r`` uses noise counters ``offset + r * n + i`` under key ``seed``.
        buckets_per_program, num_warps: override the launch heuristic for benchmark sweeps (a power of two, and
            warps); they never change the result.
    """
    rows, n = x.shape
    _check(bits, bucket_size, rows, layout)
    if levels.shape != (1 << bits,) or levels.dtype != torch.float32 or levels.device != x.device:
        raise ValueError(f"levels must be 2**bits = {1 << bits} fp32 values on {x.device}, got {levels.dtype} "
                         f"{tuple(levels.shape)} on {levels.device}")  # fmt: skip
    if x.stride(1) != 1:
        x = x.contiguous()
    wire = torch.empty(rows, layout.wire_bytes, dtype=torch.uint8, device=x.device)
    nb = layout.num_buckets
    groups, bpp, warps = _config(bucket_size, nb, x.is_cuda, buckets_per_program, num_warps)
    aligned = offset % 8 == 0 and (rows == 1 or n % 8 == 0)
    _quantize_kernel[(triton.cdiv(nb, bpp), rows)](
        x, levels.contiguous(), wire, wire.view(torch.float32),
        n, nb, layout.code_bytes, layout.meta_offset, row_stride(x), row_stride(wire),
        seed, offset,
        BITS=bits, BUCKET=bucket_size, GROUPS=groups, BPP=bpp, VEC=vec(x.dtype), ALIGNED=aligned,
        PARTIAL_GROUPS=bits < 8 and n % 8 != 0, num_warps=warps, enable_fp_fusion=False,
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
    return _decode(wire, bits, bucket_size, layout, dtype, False, buckets_per_program, num_warps)


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
    return _decode(wire, bits, bucket_size, layout, torch.float32, True, buckets_per_program, num_warps)


def _decode(wire: torch.Tensor, bits: int, bucket_size: int, layout: WireLayout, dtype: torch.dtype, sum_rows: bool,
            buckets_per_program: int | None, num_warps: int | None) -> torch.Tensor:  # fmt: skip
    """:func:`decode_rows` (``[R, numel]`` of ``dtype``), or with ``sum_rows`` :func:`decode_sum` (fp32 ``[numel]``)."""
    rows = wire.shape[0]
    _check(bits, bucket_size, rows, layout)
    wire = aligned_rows(wire)
    out = torch.empty((layout.numel,) if sum_rows else (rows, layout.numel), dtype=dtype, device=wire.device)
    nb = layout.num_buckets
    groups, bpp, warps = _config(bucket_size, nb, out.is_cuda, buckets_per_program, num_warps)
    launch = {"BITS": bits, "BUCKET": bucket_size, "GROUPS": groups, "BPP": bpp, "VEC": vec(dtype), "num_warps": warps,
              "enable_fp_fusion": False}  # fmt: skip
    if sum_rows:
        _dequantize_sum_kernel[(triton.cdiv(nb, bpp),)](
            wire, wire.view(torch.float32), out, layout.numel, nb, layout.meta_offset, row_stride(wire), ROWS=rows,
            **launch,
        )  # fmt: skip
    else:
        _dequantize_kernel[(triton.cdiv(nb, bpp), rows)](
            wire, wire.view(torch.float32), out, layout.numel, nb, layout.meta_offset, row_stride(wire),
            row_stride(out), EMULATE_BF16_RNE=emulate_bf16_rne(), **launch,
        )  # fmt: skip
    return out
