"""Building blocks of the bucketed codec kernels: tiles of groups of 8 elements, packed code words, and exact
integer <-> float conversions that avoid the GPU's conversion unit.

Tiles: a program handles ``BPP`` consecutive buckets of one row as a ``[G, BPP, 8 // VEC, VEC]`` tile, ``G``
being the bucket's number of groups of 8 consecutive elements rounded up to a power of two (padding groups
masked) and ``VEC`` the elements of one 16-byte access of the streamed dtype (8 for bf16/fp16, 4 for fp32).
Groups lead, so the lanes of a warp walk along contiguous memory, and a thread holds whole groups: Triton
vectorizes an access to at most 16 bytes along the innermost dimension, and the extra ``8 // VEC`` dimension
keeps the two halves of an fp32 group in one thread (as two 16-byte accesses) instead of splitting it over two
threads, which would then both run the group's Philox call and exchange its codes. When a program has fewer
warps than ``G / 32``, each thread holds several groups of the same bucket, and the bucket's reductions run
mostly inside the thread.

Code words: a bucket of a multiple of 8 elements starts at a multiple of ``bits`` bytes, so the 8 codes of a
group are one ``bits``-byte little-endian word (code ``j`` in bits ``[j * bits, (j + 1) * bits)``, the format of
:mod:`composer_qsdp.kernels.wire_format`), packed and unpacked inside a thread. Widths 1, 2, 4 and 8 make that word
a naturally aligned integer, stored with one access; the other widths (3, 5, 6, 7) store and load it byte by byte,
each byte masked to the row's code bytes, since a 3-, 5-, 6- or 7-byte word has no integer type and its last group
may end short of the metadata's 4-byte boundary. A tile may also take groups of ``GS`` = 16 codes (``tile``'s
``GS``; rows whose length is a multiple of 16): the two 8-code words of a group are consecutive, so they make one
``2 * bits``-byte word, one 64-bit access at 4 bits (the rotated feedback quantize and the decode-sum rotated back,
whose threads hold such rows); at 3 bits, a 6-byte word at an even offset, stored as three 16-bit words and loaded
from the two aligned 32-bit words around it.

Exact conversions through the fp32 "magic number" ``MAGIC = 1.5 * 2**23`` (bits ``0x4B400000``): fp32 numbers
in ``[2**23, 2**24)`` are the integers, one unit apart, so

* for ``|v| < 2**22``, the round-to-nearest sum ``v + MAGIC`` is ``MAGIC + round_half_even(v)`` and its bit
  pattern is ``0x4B400000 + round_half_even(v)``: rounding to an integer code with one fp32 add;
* for an integer ``0 <= c < 2**22``, the bit pattern ``0x4B400000 | c`` is the fp32 number ``MAGIC + c``:
  subtracting ``MAGIC`` gives ``c`` exactly.

Why: GPUs issue int <-> float conversions and ``FRND`` at a fraction of the fp32 add rate, and they would bound
the quantize kernels; additions and bit operations run on the full-rate pipes. The
torch references state the same arithmetic with ``torch.round`` and integer tensors, so both give the same
numbers.
"""

import functools

import torch
import triton
import triton.language as tl

__all__ = [
    "FP32_MAX", "MAGIC", "MAGIC_BITS", "MAX_ROWS", "MAX_BUCKET", "GPU_TILE", "ELEMENTS_PER_THREAD", "INTERPRETER_TILE",
    "KERNEL_BITS", "PACKED_BITS", "tile", "split_tile", "bucket_lattice", "bucket_pair", "group_words", "pack_words", "unpack_words", "store_codes",
    "load_codes", "codes_to_float", "launch_fits", "launch_shape", "row_stride", "vec",
]

#: The largest finite fp32 number: the quantize kernels cap the reciprocal of a tiny scale by it, as the torch
#: references clamp theirs (a constexpr, as jit code reads no other globals).
FP32_MAX = tl.constexpr(3.4028234663852886e38)
#: 1.5 * 2**23 (fp32): ``v + MAGIC`` rounds ``|v| < 2**22`` half to even onto the integers.
MAGIC = tl.constexpr(12582912.0)
#: The bit pattern of :data:`MAGIC`; ``MAGIC + c`` is ``MAGIC_BITS + c`` for integers ``0 <= c < 2**22``.
MAGIC_BITS = tl.constexpr(0x4B400000)
#: Most rows of one launch: the rows are the grid's second dimension, which CUDA caps at 65535.
MAX_ROWS = 65535
#: Largest bucket (elements) a codec kernel's program holds in registers without spilling (8 warps x 32
#: elements/thread).
MAX_BUCKET = 8192
# Launch targets of the codec kernels (:func:`launch_shape`), in elements per program and per thread on a GPU:
# one warp per 1024-element bucket, each thread holding 4 of its groups, keeps a bucket's min/max (or abs-max)
# reduction inside one warp (no shared memory, no barrier) and spreads the per-thread fixed work (reductions,
# divisions, addresses) over more elements. The interpreter's
# cost is per program, almost independent of its size: as few programs as possible there.
GPU_TILE = 1024
ELEMENTS_PER_THREAD = 32
INTERPRETER_TILE = 65536


@triton.jit
def tile(pid, n, BUCKET: tl.constexpr, GROUPS: tl.constexpr, BPP: tl.constexpr, VEC: tl.constexpr,
         GS: tl.constexpr = 8):  # fmt: skip
    """The tile of program ``pid`` over a row of ``n`` elements: buckets ``b`` ``[1, BPP, 1, 1]``, groups ``g``
    ``[G, 1, 1, 1]`` of ``GS`` consecutive elements (a multiple of 8), lanes ``[1, 1, GS // VEC, VEC]`` (0..GS-1
    within a group), element indices and their mask ``[G, BPP, GS // VEC, VEC]``."""
    b = (pid * BPP + tl.arange(0, BPP))[None, :, None, None]
    g = tl.arange(0, GROUPS)[:, None, None, None]
    lane = tl.arange(0, GS // VEC)[None, None, :, None] * VEC + tl.arange(0, VEC)[None, None, None, :]
    e = b * BUCKET + g * GS + lane
    return b, g, lane, e, (g * GS < BUCKET) & (e < n)


@triton.jit
def split_tile(pid, n, BUCKET: tl.constexpr, GROUPS: tl.constexpr, BPP: tl.constexpr, VEC: tl.constexpr):
    """:func:`tile` for kernels that need no group inside one thread (the decoders): the ``8 // VEC`` 16-byte
    parts of a group lie on consecutive tile rows, ``[G * 8 // VEC, BPP, 1, VEC]``, so consecutive threads
    access consecutive 16-byte chunks. Same ``b`` and element indices; ``g`` and ``lane`` are per row.

    With :func:`tile`, an fp32 tile's thread holds a whole group as two 16-byte accesses 32 bytes apart, so each
    warp-wide access covers every 32-byte sector by half: fine for loads (the other half hits L1), but stores
    reach L2 as half-sector writes, which cost the fp32 decoders much of their bandwidth. Equal to :func:`tile`
    when ``VEC`` is 8 (bf16, fp16).
    """
    H: tl.constexpr = 8 // VEC
    b = (pid * BPP + tl.arange(0, BPP))[None, :, None, None]
    r = tl.arange(0, GROUPS * H)[:, None, None, None]  # group r // H, part r % H
    g = r // H
    e = b * BUCKET + r * VEC + tl.arange(0, VEC)[None, None, None, :]
    lane = (r % H) * VEC + tl.arange(0, VEC)[None, None, None, :]
    return b, g, lane, e, (g * 8 < BUCKET) & (e < n)


@triton.jit
def _min_max(lo_a, hi_a, lo_b, hi_b):
    """Combine of a (min, max) reduction that propagates NaN (plain min/max skip NaN on a GPU)."""
    return (tl.minimum(lo_a, lo_b, propagate_nan=tl.PropagateNan.ALL),
            tl.maximum(hi_a, hi_b, propagate_nan=tl.PropagateNan.ALL))  # fmt: skip


@triton.jit
def bucket_lattice(x, valid, LEVELS: tl.constexpr, GROUPS_FIRST: tl.constexpr = False):
    """The min-max lattice of each bucket of a ``[G, BPP, H, V]`` fp32 tile (``valid``: its mask), as the torch
    references' ``quant.buckets.bucket_lattice`` computes it: ``LEVELS`` equal steps from the bucket's min to its
    max. Returns ``(lo, scale, inv, bad)``, each ``[1, BPP, 1, 1]``: the min, the step ``(max - min) / LEVELS``
    (one IEEE division), its reciprocal (0 for a constant bucket, capped at :data:`FP32_MAX`), and whether the step
    is non-finite (a NaN or an infinity in the bucket, or a range that overflows fp32). ``GROUPS_FIRST`` reduces
    across the groups first, for a tile whose threads hold a column of groups rather than whole groups (the min and
    max do not depend on the order)."""
    # NaN-propagating min/max: a NaN or infinity anywhere in the bucket makes the range non-finite.
    lo, hi = tl.where(valid, x, float("inf")), tl.where(valid, x, float("-inf"))
    if GROUPS_FIRST:
        lo, hi = tl.reduce((lo, hi), 0, _min_max, keep_dims=True)
    for axis in tl.static_range(3, 1, -1):  # the lanes of each group
        lo, hi = tl.reduce((lo, hi), axis, _min_max, keep_dims=True)
    if not GROUPS_FIRST:
        lo, hi = tl.reduce((lo, hi), 0, _min_max, keep_dims=True)
    if LEVELS == 1:
        scale = hi - lo
    else:
        scale = tl.math.div_rn(hi - lo, tl.full(lo.shape, LEVELS, tl.float32))
    bad = ~(scale < float("inf"))
    positive = scale > 0
    inv = tl.math.div_rn(tl.full(lo.shape, 1.0, tl.float32), tl.where(positive, scale, 1.0))
    return lo, scale, tl.minimum(tl.where(positive, inv, 0.0), FP32_MAX), bad


@triton.jit
def bucket_pair(meta_ptr, row, wire_row_stride, meta_offset, num_buckets, BPP: tl.constexpr):
    """The two fp32 metadata words ``(first, second)`` that a wire row stores per bucket at ``meta_offset``
    (bytes; e.g. min and step), for program ``tl.program_id(0)``'s ``BPP`` buckets, as ``[1, BPP, 1, 1]`` (0 past
    the last bucket). Loaded once per bucket as 1-D vectors, then broadcast: loading them in a tile's layout
    would issue one load per element. The two words load together, one 64-bit access where the rows' strides and
    ``meta_offset`` are known multiples of 16 (a decode-sum rotated back: 4 loads fewer per thread over 4 rows)."""
    bucket = tl.program_id(0) * BPP + tl.arange(0, BPP)
    row_meta = meta_ptr + row * (wire_row_stride // 4) + meta_offset // 4 + 2 * bucket
    on = bucket < num_buckets
    first, second = tl.split(tl.load(row_meta[:, None] + tl.arange(0, 2)[None, :], mask=on[:, None], other=0.0))
    return first[None, :, None, None], second[None, :, None, None]


@triton.jit
def group_words(row_wire, b, g, BITS: tl.constexpr, BUCKET: tl.constexpr, GS: tl.constexpr = 8):
    """Pointers ``[G, BPP, 1, 1]`` to the ``GS * BITS / 8``-byte word holding the ``GS`` codes of each group where
    that is 1, 2, 4 or 8 bytes, or to its first byte."""
    WORD: tl.constexpr = GS * BITS // 8
    if WORD == 1:
        words = row_wire + b * (BUCKET // GS) + g
    elif WORD == 2:
        words = row_wire.to(tl.pointer_type(tl.int16)) + b * (BUCKET // GS) + g
    elif WORD == 4:
        words = row_wire.to(tl.pointer_type(tl.int32)) + b * (BUCKET // GS) + g
    elif WORD == 8:
        words = row_wire.to(tl.pointer_type(tl.int64)) + b * (BUCKET // GS) + g
    else:
        words = row_wire + group_byte(b, g, BITS, BUCKET, GS)
    return words


@triton.jit
def group_byte(b, g, BITS: tl.constexpr, BUCKET: tl.constexpr, GS: tl.constexpr = 8):
    """Offset in bytes of each ``GS``-code group's word from the start of its wire row, ``[G, BPP, 1, 1]``."""
    return b * (BUCKET // 8 * BITS) + g * (GS * BITS // 8)


@triton.jit
def pack_words(codes, lane, BITS: tl.constexpr):
    """Integer codes (each in ``[0, 2**BITS)``) on a tile with lanes ``lane`` -> the groups' packed words
    ``[G, BPP, 1, 1]``, of the codes' integer type (int64 where a group's codes exceed 32 bits)."""
    return tl.sum(tl.sum(codes << (lane * BITS), 3, keep_dims=True), 2, keep_dims=True)


@triton.jit
def unpack_words(words, lane, BITS: tl.constexpr):
    """The int32 codes of the lanes ``lane`` of packed words ``[G, BPP, 1, 1]`` (inverse of :func:`pack_words`)."""
    return (words >> (lane * BITS)) & ((1 << BITS) - 1)


@triton.jit
def store_codes(row_wire, codes, pid, b, g, lane, e, valid, n, num_buckets, code_bytes, meta_offset,
                BITS: tl.constexpr, BUCKET: tl.constexpr, BPP: tl.constexpr, PARTIAL_GROUPS: tl.constexpr,
                GS: tl.constexpr = 8):  # fmt: skip
    """Write the int32 codes of program ``pid``'s tile ``(b, g, lane, e, valid)`` into the wire row at ``row_wire``
    (bytes ``[0, code_bytes)``), and zero the row's padding ``[code_bytes, meta_offset)`` before its metadata.

    ``PARTIAL_GROUPS``: the row's last group may be partial (``n`` not a multiple of 8); its packed word then has
    zero codes past the row's end, as the torch reference's packing writes them. ``GS``: the tile's group size
    (:func:`tile`); with ``GS > 8``, ``n`` must be a multiple of ``GS``.
    """
    if BITS == 8:
        tl.store(row_wire + e, codes.to(tl.uint8), mask=valid)
    else:
        if PARTIAL_GROUPS:
            codes = tl.where(valid, codes, 0)  # lanes past the row's end in its last word are zero
        group_ok = (g * GS < BUCKET) & (b * BUCKET + g * GS < n)
        words = group_words(row_wire, b, g, BITS, BUCKET, GS)
        # Words of more than 32 bits (8 codes of 5-7 bits, 16 of 3 or 4) are packed in 64 bits, and so are 16 codes
        # of 1 or 2 bits: packed in 32 bits, a tile of rows of 16 (the rotated feedback quantize) had Triton sum the
        # words across the threads that hold its columns (shuffles) instead of moving the codes to the threads that
        # hold its rows, 98 more instructions per thread at 2 bits (sm_90).
        WORD: tl.constexpr = GS * BITS // 8
        packed = pack_words(codes.to(tl.int64) if WORD > 4 or GS > 8 else codes, lane, BITS)
        if (WORD & (WORD - 1)) == 0:  # 1, 2, 4 or 8 bytes: an aligned integer word
            tl.store(words, packed.to(words.dtype.element_ty), mask=group_ok)
        elif GS > 8:
            # 16 codes of 3 bits at an even offset: three 16-bit stores. n being a multiple of 16, no word ends past
            # the code bytes.
            for k in tl.static_range(WORD // 2):
                tl.store(words.to(tl.pointer_type(tl.int16)) + k, (packed >> (16 * k)).to(tl.int16), mask=group_ok)
        else:
            for k in tl.static_range(WORD):
                # The row's last word may end past its code bytes, where the padding and metadata start.
                ok = group_ok & (group_byte(b, g, BITS, BUCKET, GS) + k < code_bytes)
                tl.store(words + k, ((packed >> (8 * k)) & 0xFF).to(tl.uint8), mask=ok)
    # The program holding the last bucket zeroes the padding; a tail group's word may already have written zeros
    # there.
    pad = code_bytes + tl.arange(0, 4)
    tl.store(row_wire + pad, tl.zeros([4], tl.uint8), mask=(pad < meta_offset) & (pid == (num_buckets - 1) // BPP))


@triton.jit
def load_codes(row_wire, b, g, lane, e, valid, n, BITS: tl.constexpr, BUCKET: tl.constexpr, GS: tl.constexpr = 8):
    """The int32 codes stored by :func:`store_codes` in the wire row at ``row_wire``, on the tile ``(b, g, lane, e,
    valid)`` of groups of ``GS`` (:func:`tile`): 0 in groups outside the row, and past its end inside its last group
    what that group's word holds."""
    if BITS == 8:
        codes = tl.load(row_wire + e, mask=valid, other=0).to(tl.int32)
    else:
        WORD: tl.constexpr = GS * BITS // 8
        group_ok = (g * GS < BUCKET) & (b * BUCKET + g * GS < n)
        words = group_words(row_wire, b, g, BITS, BUCKET, GS)
        if (WORD & (WORD - 1)) == 0:  # 1, 2, 4 or 8 bytes: an aligned integer word
            packed = tl.load(words, mask=group_ok, other=0).to(tl.int64 if WORD > 4 else tl.int32)
            codes = unpack_words(packed, lane, BITS).to(tl.int32)
        elif GS > 8:
            # 16 codes of 3 bits: 6 bytes at an even offset, which lie in the two aligned 32-bit words from that
            # offset rounded down to a multiple of 4: two loads instead of six byte loads, each with its own check. The
            # other 2 bytes are codes, or the padding and metadata that follow the codes, never past the row (n is a
            # multiple of 16, so no word ends past the code bytes).
            first = group_byte(b, g, BITS, BUCKET, GS)
            pair = row_wire.to(tl.pointer_type(tl.uint32)) + (first >> 2)
            both = (tl.load(pair, mask=group_ok, other=0).to(tl.uint64)
                    | (tl.load(pair + 1, mask=group_ok, other=0).to(tl.uint64) << 32)) >> ((first & 2) * 8)
            codes = unpack_words(both, lane, BITS).to(tl.int32)
        else:
            # Bytes of the row's last word past its code bytes belong to the padding or the metadata: read as 0.
            code_bytes = (BUCKET // 8 * BITS) * (n // BUCKET) + ((n % BUCKET) * BITS + 7) // 8
            first = group_byte(b, g, BITS, BUCKET, GS)
            packed = tl.zeros(first.shape, tl.int64 if WORD > 4 else tl.int32)
            for k in tl.static_range(WORD):
                byte = tl.load(words + k, mask=group_ok & (first + k < code_bytes), other=0).to(packed.dtype)
                packed = packed | (byte << (8 * k))
            codes = unpack_words(packed, lane, BITS).to(tl.int32)
    return codes


@triton.jit
def tile_codes(wire_ptr, meta_ptr, row, b, g, lane, e, valid, n, num_buckets, meta_offset, wire_row_stride,
               BITS: tl.constexpr, BUCKET: tl.constexpr, BPP: tl.constexpr, GS: tl.constexpr = 8):  # fmt: skip
    """What a bucketed decoder reads of wire row ``row`` on the tile ``(b, g, lane, e, valid)`` of groups of ``GS``:
    the int32 codes (:func:`load_codes`) and the buckets' two fp32 metadata words (:func:`bucket_pair`)."""
    row_wire = wire_ptr + row * tl.multiple_of(wire_row_stride, 4)  # wire rows are whole fp32 words
    codes = load_codes(row_wire, b, g, lane, e, valid, n, BITS, BUCKET, GS)
    first, second = bucket_pair(meta_ptr, row, wire_row_stride, meta_offset, num_buckets, BPP)
    return codes, first, second


@triton.jit
def codes_to_float(codes, OFFSET: tl.constexpr):
    """``codes - OFFSET`` as exact fp32, for int32 codes in ``[0, 2**22)``, without a conversion instruction."""
    return (codes | MAGIC_BITS).to(tl.float32, bitcast=True) - (MAGIC + OFFSET)


def vec(dtype) -> int:
    """``VEC`` of a tile streaming ``dtype`` (a torch dtype): its elements per 16-byte access, at most 8."""
    return min(8, 16 // dtype.itemsize)


def launch_fits(rows: int, n: int) -> bool:
    """True when one launch covers ``rows`` rows (at most :data:`MAX_ROWS`) of ``n`` elements (below ``2**31``:
    the tiles index elements with int32)."""
    return rows <= MAX_ROWS and n < 2**31


#: Code widths whose packed word of 8 codes is one naturally aligned integer, stored with a single access (the
#: other widths go byte by byte).
PACKED_BITS = (1, 2, 4, 8)
#: Code widths the packed-word kernels cover: every width, since 8 codes of ``bits`` bits fill ``bits`` bytes.
KERNEL_BITS = (1, 2, 3, 4, 5, 6, 7, 8)


def supports_packed(bits: int, bucket_size: int, rows: int = 1, n: int = 1,
                    widths: tuple[int, ...] = KERNEL_BITS) -> bool:  # fmt: skip
    """True when the packed-word kernels (min-max, learned levels) cover ``bits`` (in ``widths``, the code widths
    of the calling codec's kernel), ``bucket_size`` (elements; a multiple of 8 up to :data:`MAX_BUCKET`), ``rows``
    and ``n`` elements per row (:func:`launch_fits`)."""
    return bits in widths and 8 <= bucket_size <= MAX_BUCKET and bucket_size % 8 == 0 and launch_fits(rows, n)


def check_packed(codec: str, bits: int, bucket_size: int, rows: int, n: int,
                 widths: tuple[int, ...] = KERNEL_BITS) -> None:  # fmt: skip
    """Raise a ``ValueError`` naming ``codec``'s kernel and what is allowed where :func:`supports_packed` is False."""
    if not supports_packed(bits, bucket_size, rows, n, widths):
        raise ValueError(
            f"no {codec} kernel for bits={bits}, bucket_size={bucket_size}, rows={rows}, n={n}; allowed: bits in "
            f"{widths}, bucket_size a multiple of 8 up to {MAX_BUCKET}, rows up to {MAX_ROWS}, n below 2**31"
        )


def row_stride(t: torch.Tensor) -> int:
    """Row stride of a ``[R, ...]`` launch argument; 0 for one row or a 1-D tensor, which never moves by it: Triton
    then specializes it as a multiple of 16 and vectorizes the single-row (all-gather) case whatever ``n`` is."""
    return t.stride(0) if t.dim() == 2 and t.shape[0] > 1 else 0


def rows_aligned(t: torch.Tensor) -> bool:
    """Whether every row of the ``[R, n]`` launch argument ``t`` starts on a 16-element boundary (one row always
    does): the kernels' loads and stores of it can then be vectorized."""
    return t.shape[0] == 1 or t.stride(0) % 16 == 0


def output_buffer(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
                  out: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
    """A decode kernel's output: ``out`` checked (``shape``, ``dtype``, contiguous rows), or a new tensor.

    Raises:
        ValueError: ``out`` does not match, naming what it is and what is needed.
    """
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype or out.stride(-1) != 1:
        raise ValueError(f"out must be a {list(shape)} tensor of {dtype} with contiguous rows, got "
                         f"{out.dtype} {tuple(out.shape)} with strides {out.stride()}")  # fmt: skip
    return out


# Host-side integer helpers. Triton's own ``triton.cdiv`` / ``triton.next_power_of_2`` are constexpr functions whose
# host calls cost microseconds each (argument unwrapping), several times per launch; a quantized collective is
# bound by such fixed host costs at small sizes.
def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive integers."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two ``>= n`` (1 for ``n <= 1``)."""
    return 1 << max(0, n - 1).bit_length()


@functools.lru_cache(maxsize=4096)
def launch_shape(bucket_size: int, num_buckets: int, on_gpu: bool, gpu_tile: int, interpreter_tile: int,
                 elements_per_thread: int, buckets_per_program: int | None,
                 num_warps: int | None) -> tuple[int, int, int]:  # fmt: skip
    """(``G``, buckets per program, warps) of a launch over ``num_buckets`` buckets of ``bucket_size`` elements.

    About ``gpu_tile`` elements per program on a GPU (``interpreter_tile`` under the interpreter, whose cost is
    per program) and ``elements_per_thread`` per thread; ``buckets_per_program`` (a power of two) and
    ``num_warps`` override the heuristic for benchmark sweeps, never the result.
    """
    groups = next_power_of_2(cdiv(bucket_size, 8))
    bucket_tile = groups * 8
    if buckets_per_program is None:
        target = gpu_tile if on_gpu else interpreter_tile
        buckets_per_program = max(1, min(next_power_of_2(num_buckets), target // bucket_tile))
    elif buckets_per_program < 1 or buckets_per_program & (buckets_per_program - 1):
        raise ValueError(f"buckets_per_program={buckets_per_program} must be a power of two >= 1")
    if num_warps is None:
        num_warps = min(16, max(1, buckets_per_program * bucket_tile // (32 * elements_per_thread)))
    elif not 1 <= num_warps <= 32 or num_warps & (num_warps - 1):
        raise ValueError(f"num_warps={num_warps} must be a power of two from 1 to 32")
    return groups, buckets_per_program, num_warps
