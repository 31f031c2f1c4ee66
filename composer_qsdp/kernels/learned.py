"""Triton kernels of the learned-levels codec: fused bucketing + level search + stochastic rounding + pack,
unpack + level gather + dequantize, and dequantize-and-sum.

Reference (same math, same wire, same numbers bit for bit): the learned-levels codec of the ``quant`` layer
(``quant.learned.LearnedLevelsCodec``), methods ``_encode_rows_reference`` (:func:`encode_rows`),
``_decode_rows_fp32`` (:func:`decode_rows`) and ``_decode_sum_reference`` (:func:`decode_sum`). The codec passes
its levels (``K = 2**bits`` fp32 values on the input's device, 0 first and 1 last, strictly increasing) and its
wire format; the launchers take ``[rows, n]`` tensors. They run on CUDA tensors, and on CPU tensors under
``TRITON_INTERPRET=1`` (CI).

Tiling, packing and exactness as the min-max kernels (:mod:`composer_qsdp.kernels.minmax`): one program holds
whole buckets as a tile of groups of 8 (:mod:`composer_qsdp.kernels.groups`), so bucketing, search, rounding and
packing are one pass over ``x``; every fp32 operation of the reference's rounding appears once, in its order,
launched with ``enable_fp_fusion=False``. The rounding is division-free (``code = j + [z - l_j >= (1 - u) *
g_j]``, the codec's module docstring says why it is unbiased): an IEEE ``div_rn`` per element cost about ten
instructions, and the encoder, like min-max's, is bound by instruction issue. ``1 - u`` comes from
:func:`composer_qsdp.kernels.noise.complement_noise`, exactly the reference's ``1 - rounding_noise``. The kernel
skips the reference's clamp of ``z`` to ``[0, 1]``: ``z >= 0`` in finite buckets, and where rounding puts ``z``
just above 1 (by at most ``2**-22``) the search still gives ``j = K - 2`` and ``z - l_j >= g_j >= (1 - u) * g_j``
still gives code ``K - 1``, as for ``z = 1``.

Level search (why: ``bits`` dependent gathers per element, each an address computation, a load and a select,
made the binary search most of the encoder's instructions): a uniform grid of ``M = CELLS_PER_LEVEL * K`` cells
on ``[0, 1]``, built once per level set by :func:`search_table` (on the levels' device, no host synchronization;
the codec caches it next to its levels, and the wire does not change). Cell ``c = round(z * M)`` (one fp32
multiply and the magic-number add) stores ``j_c``, the bracket index at its lower edge, and ``b_c = l_{j_c + 1}``;
when no cell holds two levels, ``j = j_c + [b_c <= z]`` exactly, and one more gather reads ``(l_j, g_j)`` as an
8-byte pair: two 8-byte gathers and one comparison per element for any ``bits``. Levels closer than a cell (fitted
gaps can be as small as ``2**-20``) take ``R`` more steps of binary lifting over the rest of the cell, ``R`` the
least with ``2**R`` at least the most levels in one cell, stored in the table: a loop bound read from device
memory, the same in every program, so the search stays exact for any valid levels and costs the extra gathers
only for level sets that need them (``CELLS_PER_LEVEL`` is chosen so that levels fitted to common distributions
need none). Levels padded with NaN past ``K - 2`` stop every probe there.

Coverage: ``bits`` in :data:`SUPPORTED_BITS` and ``bucket_size`` a multiple of 8 up to :data:`MAX_BUCKET`; the
codec uses its torch reference for other configurations.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from composer_qsdp.kernels.bucket_decode import BucketDecoder
from composer_qsdp.kernels.groups import (ELEMENTS_PER_THREAD, GPU_TILE, INTERPRETER_TILE, MAGIC, MAX_BUCKET,
                                          PACKED_BITS, bucket_lattice, cdiv, check_packed, launch_shape, row_stride,
                                          store_codes, supports_packed, tile, tile_codes, vec)  # fmt: skip
from composer_qsdp.kernels.wire_format import WireFormat
from composer_qsdp.kernels.noise import complement_noise

__all__ = ["CELLS_PER_LEVEL", "MAX_BUCKET", "SUPPORTED_BITS", "supports", "search_table", "encode_rows", "decode_rows",
           "decode_sum"]

#: Code widths with a kernel: those whose 8 codes pack into one aligned integer word.
SUPPORTED_BITS = PACKED_BITS
# Elements per thread on a GPU. The encoder's per-element work is now close to the min-max kernel's, whose
# per-thread fixed work (bucket reductions, divisions, addresses) 32 spreads without spills; the decoders, at parity with min-max, keep 16 (one level gather per element).
_ELEMENTS_PER_THREAD = {"encode": ELEMENTS_PER_THREAD, "decode": 16}
#: Cells of the search's uniform grid per level (a power of two): fine enough that no cell of levels fitted to
#: common distributions holds two levels, so the search needs no refinement step.
CELLS_PER_LEVEL = 4
_CELLS_PER_LEVEL = tl.constexpr(CELLS_PER_LEVEL)  # jit code reads only constexpr globals


def supports(bits: int, bucket_size: int, rows: int = 1, n: int = 1) -> bool:
    """True when a kernel covers ``bits`` (in :data:`SUPPORTED_BITS`), ``bucket_size``, ``rows`` and ``n``
    (:func:`composer_qsdp.kernels.groups.supports_packed`)."""
    return supports_packed(bits, bucket_size, rows, n, SUPPORTED_BITS)


# --------------------------------------------------------------------------------------------- search table
def search_table(levels: torch.Tensor) -> torch.Tensor:
    """The encode kernel's search table for ``K`` valid levels (fp32, strictly increasing from 0 to 1), on their
    device: int64 words (each two 32-bit halves, the low one first), without a host synchronization.

    Contents, for ``M = CELLS_PER_LEVEL * K`` cells:

    * ``[0, K)`` pairs ``(l_j, g_j)``, ``g_j = l_{j+1} - l_j`` in fp32 (the reference's subtraction), ``j <= K - 2``;
    * ``[K, K + 2M)`` cells ``(j_c, b_c)``: ``j_c = j((c - 1/2) / M)`` (int32), the bracket index at the cell's lower
      end, and ``b_c = s_{j_c + 1}`` (fp32); cells past ``M`` repeat cell ``M``;
    * ``[K + 2M, 2K + 2M)`` the search levels ``s_i`` as ``2K`` fp32: ``l_i`` for ``i <= K - 2``, then NaN, which no
      comparison ``s_i <= z`` accepts, so a search never leaves ``0..K-2``;
    * ``2K + 2M`` the refinement steps ``R`` (int32): the least ``R`` with ``2**R >= n_c`` for every cell ``c <= M``,
      ``n_c = j((c + 1/2) / M) - j_c`` the number of levels inside it.
    """
    num_levels = levels.numel()
    cells = CELLS_PER_LEVEL * num_levels
    inner = levels[:-1]
    gaps = levels[1:] - inner
    pairs = torch.stack((inner, gaps), 1).view(torch.int32)
    pairs = torch.cat([pairs, pairs.new_zeros(1, 2)])
    # Cell edges (c -/+ 1/2) / M are exact in fp32, and j of each edge is the reference's search.
    c = torch.arange(cells + 2, device=levels.device, dtype=torch.float64)
    j = (torch.searchsorted(levels, ((c - 0.5) / cells).to(torch.float32), right=True) - 1).clamp_(0, num_levels - 2)
    search = torch.cat([inner, levels.new_full((num_levels + 1,), float("nan"))])
    lower = j[: cells + 1]
    cell_words = torch.stack((lower.to(torch.int32), search[lower + 1].view(torch.int32)), 1)
    cell_words = torch.cat([cell_words, cell_words[-1:].expand(cells - 1, 2)])
    inside = (j[1:] - lower).max()
    steps = (inside > 2 ** torch.arange(num_levels.bit_length(), device=levels.device)).sum()
    steps = torch.stack((steps.to(torch.int32), steps.new_zeros((), dtype=torch.int32)))
    words = torch.cat([pairs.reshape(-1), cell_words.reshape(-1), search.view(torch.int32), steps])
    return words.view(torch.int64)


# --------------------------------------------------------------------------------------------- kernels
@triton.jit
def _bracket(z, table_ptr, bad, BITS: tl.constexpr):
    """``(j, l_j, g_j)`` for normalized values ``z`` (:func:`search_table`): ``j`` the largest index ``<= K - 2``
    with ``l_j <= z``, exact for ``0 <= z <= 1 + 2**-22``; ``(0, 0, g_0)`` in ``bad`` (non-finite) buckets, whose
    ``z`` are 0 or NaN; for other ``z`` (lanes outside the row), some ``j`` in ``0..K-2`` and its pair."""
    K: tl.constexpr = 1 << BITS
    M: tl.constexpr = _CELLS_PER_LEVEL * K
    # The cell c = round_half_even(z * M): z * M is exact and adding MAGIC rounds it (groups.py). Masking the bit
    # pattern keeps any z inside the table; bad buckets take cell 0, where z = 0 or NaN stays at j = 0.
    cell = (z * M + MAGIC).to(tl.int32, bitcast=True) & tl.where(bad, 0, 2 * M - 1)
    word = tl.load(table_ptr + K + cell)
    j = word.to(tl.int32)
    j += ((word >> 32).to(tl.int32).to(tl.float32, bitcast=True) <= z).to(tl.int32)
    # Levels closer than a cell: binary lifting over the rest of the cell (j_c < j <= j_c + n_c <= j + 2**R - 1),
    # R steps of one gather each; R is the same in every program, so the branches do not diverge.
    steps = tl.load((table_ptr + 2 * K + 2 * M).to(tl.pointer_type(tl.int32)))
    if steps > 0:
        search = (table_ptr + K + 2 * M).to(tl.pointer_type(tl.float32))
        for s in tl.static_range(BITS - 1, -1, -1):
            if s < steps:
                probe = j + (1 << s)
                j = tl.where(tl.load(search + probe) <= z, probe, j)
    pair = tl.load(table_ptr + j)
    return j, pair.to(tl.int32).to(tl.float32, bitcast=True), (pair >> 32).to(tl.int32).to(tl.float32, bitcast=True)


# Seeds and counter offsets change every step: specializing on their values (Triton compiles an integer equal to 1
# as a constant and one divisible by 16 apart) would compile new variants during training.
@triton.jit(do_not_specialize=["seed", "offset"])
def _quantize_kernel(
    x_ptr, levels_ptr, table_ptr, wire_ptr, meta_ptr,
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
    # The reference's clamp to [0, 1] never changes a code (module docstring).
    z = (x - lo) * inv
    j, lower, gap = _bracket(z, table_ptr, bad, BITS)
    rest = complement_noise(seed, offset + row * n + b * BUCKET + g * 8, lane, ALIGNED)
    codes = j + (z - lower >= rest * gap).to(tl.int32)

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
    BITS: tl.constexpr, BUCKET: tl.constexpr, BPP: tl.constexpr, GS: tl.constexpr = 8,
):  # fmt: skip
    """Decoded fp32 values of wire row ``row`` on the tile ``(b, g, lane, e, valid)`` of groups of ``GS`` (``lo``
    where not ``valid``)."""
    codes, lo, rng = tile_codes(wire_ptr, meta_ptr, row, b, g, lane, e, valid, n, num_buckets, meta_offset,
                                wire_row_stride, BITS, BUCKET, BPP, GS)  # fmt: skip
    # Codes are < K, so the gather stays inside the row's level table (4 * K bytes, L1-resident).
    levels = meta_ptr + row * (wire_row_stride // 4) + meta_offset // 4 + 2 * num_buckets
    return lo + tl.load(levels + codes) * rng


# --------------------------------------------------------------------------------------------- launchers
def _config(bucket_size: int, num_buckets: int, on_gpu: bool, buckets_per_program: int | None,
            num_warps: int | None, kind: str = "decode") -> tuple[int, int, int]:  # fmt: skip
    """(GROUPS, buckets per program, warps) of a launch (:func:`composer_qsdp.kernels.groups.launch_shape`);
    ``kind``: ``"encode"`` or ``"decode"``."""
    return launch_shape(bucket_size, num_buckets, on_gpu, GPU_TILE, INTERPRETER_TILE, _ELEMENTS_PER_THREAD[kind],
                        buckets_per_program, num_warps)  # fmt: skip


def _check(bits: int, bucket_size: int, rows: int, fmt: WireFormat) -> None:
    check_packed("learned-levels", bits, bucket_size, rows, fmt.numel, SUPPORTED_BITS)


def encode_rows(
    x: torch.Tensor,
    levels: torch.Tensor,
    bits: int,
    bucket_size: int,
    fmt: WireFormat,
    seed: int,
    offset: int,
    *,
    table: torch.Tensor | None = None,
    buckets_per_program: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Quantize each row of ``x`` ``[R, n]`` onto ``levels``: ``[R, fmt.wire_bytes]`` ``uint8``, the codec's wire.

    Args:
        x: ``[R, n]`` fp32, bf16 or fp16.
        levels: the ``2**bits`` normalized levels, fp32 on ``x``'s device, strictly increasing from 0 to 1 (the
            codec validates them; they are not checked here, which would synchronize with the host).
        bits, bucket_size: the codec's (elements per bucket).
        fmt: the codec's ``LearnedLevelsCodec.wire_format(n)``.
        seed, offset: row ``r`` uses noise counters ``offset + r * n + i`` under key ``seed``.
        table: :func:`search_table` of ``levels``, which a caller encoding many times builds once per level set;
            built here when None.
        buckets_per_program, num_warps: override the launch heuristic for benchmark sweeps (a power of two, and
            warps); they never change the result.
    """
    rows, n = x.shape
    _check(bits, bucket_size, rows, fmt)
    if levels.shape != (1 << bits,) or levels.dtype != torch.float32 or levels.device != x.device:
        raise ValueError(f"levels must be 2**bits = {1 << bits} fp32 values on {x.device}, got {levels.dtype} "
                         f"{tuple(levels.shape)} on {levels.device}")  # fmt: skip
    if x.stride(1) != 1:
        x = x.contiguous()
    wire = torch.empty(rows, fmt.wire_bytes, dtype=torch.uint8, device=x.device)
    nb = fmt.num_buckets
    groups, bpp, warps = _config(bucket_size, nb, x.is_cuda, buckets_per_program, num_warps, "encode")
    aligned = offset % 8 == 0 and (rows == 1 or n % 8 == 0)
    _quantize_kernel[(cdiv(nb, bpp), rows)](
        x, levels.contiguous(), search_table(levels) if table is None else table, wire, wire.view(torch.float32),
        n, nb, fmt.code_bytes, fmt.meta_offset, row_stride(x), row_stride(wire),
        seed, offset,
        BITS=bits, BUCKET=bucket_size, GROUPS=groups, BPP=bpp, VEC=vec(x.dtype), ALIGNED=aligned,
        PARTIAL_GROUPS=bits < 8 and n % 8 != 0, num_warps=warps, enable_fp_fusion=False,
    )  # fmt: skip
    return wire


def _decode_launch_shape(bucket_size: int, num_buckets: int, on_gpu: bool, aligned_rows: bool,
                         buckets_per_program: int | None, num_warps: int | None) -> tuple[int, int, int]:  # fmt: skip
    """:func:`_config` of a decode (16 elements per thread whether or not the output's rows are aligned)."""
    return _config(bucket_size, num_buckets, on_gpu, buckets_per_program, num_warps)


_DECODER = BucketDecoder(_decode_tile, _check, _decode_launch_shape)
#: :meth:`composer_qsdp.kernels.bucket_decode.BucketDecoder.decode_rows` with the learned-levels tile decoder.
decode_rows = _DECODER.decode_rows
#: :meth:`composer_qsdp.kernels.bucket_decode.BucketDecoder.decode_sum` with the learned-levels tile decoder.
decode_sum = _DECODER.decode_sum
