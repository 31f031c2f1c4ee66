"""The symmetric abs-max quantization of a bucket in registers, shared by the symmetric codec's kernels
(:mod:`composer_qsdp.kernels.symmetric`) and the min-max error-feedback kernel's 8-bit coded residual
(:mod:`composer_qsdp.kernels.minmax`), so both write the same wire bit for bit.

The arithmetic is the torch reference's (``quant.symmetric.SymmetricCodec``), one IEEE fp32 operation at a time:
``scale = absmax / qmax`` and ``inv = qmax / absmax`` (``div_rn``; 0 for a zero bucket, capped at the largest fp32),
``level = clamp(round_half_even(x * inv), -qmax, qmax)`` through one addition of
:data:`composer_qsdp.kernels.groups.MAGIC`, ``code = level + qmax``; ``decoded = (code - qmax) * scale``. A bucket whose
NaN-propagating abs-max is non-finite gets ``scale = NaN`` and level 0.
"""

import triton
import triton.language as tl

from composer_qsdp.kernels.groups import FP32_MAX, MAGIC, MAGIC_BITS, codes_to_float

__all__ = ["abs_max", "tile_abs_max", "abs_max_codes", "bucket_scales", "abs_max_decode"]


@triton.jit
def abs_max(a, b):
    """Combine of a max reduction that propagates NaN (a plain max skips NaN on a GPU)."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def tile_abs_max(x, valid):
    """NaN-propagating abs-max ``[1, BPP, 1, 1]`` of each bucket of a ``[G, BPP, H, V]`` fp32 tile over its
    ``valid`` elements: a NaN or an infinity anywhere in a bucket makes its abs-max non-finite."""
    absmax = tl.reduce(tl.reduce(tl.where(valid, tl.abs(x), 0.0), 3, abs_max, keep_dims=True), 2, abs_max,
                       keep_dims=True)  # fmt: skip
    return tl.reduce(absmax, 0, abs_max, keep_dims=True)


@triton.jit
def abs_max_codes(x, absmax, QMAX: tl.constexpr, FINITE: tl.constexpr = False):
    """The int32 codes (``level + QMAX``, in ``[0, 2 * QMAX]``) of fp32 ``x`` on its buckets' abs-max grid, and the
    buckets' scales (NaN for a non-finite ``absmax``); ``absmax`` broadcasts against ``x``. ``FINITE``: ``x`` is
    finite and ``absmax`` its buckets' abs-max, and only the codes of elements counted in it are used."""
    nonfinite = ~(absmax < float("inf"))
    scale = tl.where(nonfinite, float("nan"), tl.div_rn(absmax, tl.full(absmax.shape, QMAX, tl.float32)))
    positive = absmax > 0
    safe = tl.where(positive, absmax, 1.0)  # keeps the discarded branch free of 1/0 (interpreter warnings)
    inv = tl.where(positive, tl.minimum(tl.div_rn(tl.full(absmax.shape, QMAX, tl.float32), safe), FP32_MAX), 0.0)
    # Round half to even through MAGIC.
    rounded = x * inv + MAGIC
    if FINITE:
        # No clamp needed: |x| <= absmax, and inv (rounded to nearest, or capped at FP32_MAX below the quotient) makes
        # |x * inv| at most QMAX * (1 + 2**-23), which rounds to QMAX; a zero bucket's inv is 0. QMAX is added in fp32
        # (exact on these integers): added to the bit pattern, it becomes a byte-wide add at an 8-bit store of the
        # codes, an add and a mask per code on sm_90.
        return ((rounded + QMAX).to(tl.uint32, bitcast=True) - MAGIC_BITS).to(tl.int32), scale
    # Clamp to +-QMAX on the bit patterns (as unsigned ints, ordered like the values there); a non-finite bucket
    # clamps to level 0, and its NaN lanes (patterns above any cap) too.
    low = tl.where(nonfinite, MAGIC_BITS, MAGIC_BITS - QMAX).to(tl.uint32)
    high = tl.where(nonfinite, MAGIC_BITS, MAGIC_BITS + QMAX).to(tl.uint32)
    rounded = tl.minimum(tl.maximum(rounded.to(tl.uint32, bitcast=True), low), high)
    return (rounded - (MAGIC_BITS - QMAX)).to(tl.int32), scale


@triton.jit
def bucket_scales(row_wire, meta_offset, num_buckets, BPP: tl.constexpr):
    """The fp32 scales ``[BPP]`` of program ``tl.program_id(0)``'s buckets in the wire row at ``row_wire`` (0 past
    the last bucket), loaded once per bucket as a 1-D vector for the caller to broadcast (loading them in a tile's
    layout would issue one load per element)."""
    bucket = tl.program_id(0) * BPP + tl.arange(0, BPP)
    meta = (row_wire + meta_offset).to(tl.pointer_type(tl.float32))
    return tl.load(meta + bucket, mask=bucket < num_buckets, other=0.0)


@triton.jit
def abs_max_decode(codes, scale, QMAX: tl.constexpr):
    """fp32 ``(codes - QMAX) * scale`` of int32 codes, ``scale`` broadcasting against them."""
    return codes_to_float(codes, QMAX) * scale
