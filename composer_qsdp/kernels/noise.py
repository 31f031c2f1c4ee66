"""Triton side of the codecs' stochastic-rounding stream (its torch reference: ``quant.philox.rounding_bits``).

Counter ``c`` takes half ``c % 2`` (low half first) of word ``(c // 2) % 4`` of the Philox4x32 call ``c // 8``
with ``NOISE_ROUNDS`` rounds (:mod:`composer_qsdp.kernels.philox_constants`): a 16-bit value ``k``. Kernels lay
their tiles out as groups of 8 consecutive elements (:mod:`composer_qsdp.kernels.groups`); :func:`noise_bits`
draws a group's values with one Philox call when the group's first counter is a multiple of 8 and two
otherwise. Two forms:

* :func:`noise_bits`: ``k`` itself; the min-max kernels add its top bits to a fixed-point image of the value to
  round (:func:`composer_qsdp.kernels.fixed_point.fraction_bits`), an integer add instead of the float noise's
  four instructions.
* :func:`centered_noise`: ``u - 1/2`` for ``u = (k + 0.5) / 2**16``, identical to the torch reference's
  ``rounding_noise(...) - 0.5`` bit for bit. Built from bits rather than with an int -> float conversion (a slow
  instruction on GPUs): ``0x3F800040 | k << 7`` is the fp32 number ``1 + u`` and ``(1 + u) - 1.5`` is exact.
  :func:`complement_noise` is ``1 - u = 2 - (1 + u)`` the same way (the learned-levels kernels' rounding), one
  float add where ``1/2 - centered_noise`` would take two.

The Philox rounds are :func:`_philox` rather than ``tl.randint4x`` (which has 10 rounds): Philox4x32 on the
counter ``(c mod 2**32, c >> 32, 0, 0)`` under the key ``(seed mod 2**32, seed >> 32)``, with each round's two
32 x 32 -> 64-bit products written as one widening multiply instead of separate high and low halves, which
saves instructions in the stochastic quantize kernels, whose instruction issue bounds them.
"""

import triton
import triton.language as tl

from composer_qsdp.kernels import philox_constants

__all__ = ["centered_noise", "complement_noise", "noise_bits"]

# jit code reads only constexpr globals
_KEY_A = tl.constexpr(philox_constants.KEY_A)
_KEY_B = tl.constexpr(philox_constants.KEY_B)
_ROUND_A = tl.constexpr(philox_constants.ROUND_A)
_ROUND_B = tl.constexpr(philox_constants.ROUND_B)
_N_ROUNDS = tl.constexpr(philox_constants.NOISE_ROUNDS)


@triton.jit
def _philox(seed, call):
    """The four uint32 words of the ``NOISE_ROUNDS``-round Philox call ``call`` (an int64 tensor) under key ``seed``."""
    seed = seed.to(tl.uint64)
    k0 = (seed & 0xFFFFFFFF).to(tl.uint32)
    k1 = (seed >> 32).to(tl.uint32)
    c0 = call.to(tl.uint32)
    c1 = (call >> 32).to(tl.uint32)
    c2 = tl.zeros(c0.shape, tl.uint32)
    c3 = c2
    for _ in tl.static_range(_N_ROUNDS):
        prod_a = c0.to(tl.uint64) * _ROUND_A
        prod_b = c2.to(tl.uint64) * _ROUND_B
        c0, c1, c2, c3 = ((prod_b >> 32).to(tl.uint32) ^ c1 ^ k0, prod_b.to(tl.uint32),
                          (prod_a >> 32).to(tl.uint32) ^ c3 ^ k1, prod_a.to(tl.uint32))  # fmt: skip
        k0 = k0 + _KEY_A
        k1 = k1 + _KEY_B
    return c0, c1, c2, c3


@triton.jit
def _bits_from_words(w0, w1, w2, w3, lane):
    """``k`` of lane ``lane`` (0..7) of the Philox call that returned words ``w0..w3`` (all broadcastable)."""
    pair = lane >> 1
    word = tl.where(pair == 0, w0, tl.where(pair == 1, w1, tl.where(pair == 2, w2, w3)))
    return tl.where((lane & 1) == 0, word & 0xFFFF, word >> 16)


@triton.jit
def noise_bits(seed, start, lane, ALIGNED: tl.constexpr, TOP: tl.constexpr = 16):
    """The top ``TOP`` bits of ``k`` (uint32 in ``[0, 2**TOP)``) at counters ``start + lane``: int64 group starts
    ``start`` ``[G, B, 1, 1]`` and lanes ``lane`` (0..7, ``[1, 1, H, V]``) -> ``[G, B, H, V]``.

    ``ALIGNED`` promises every ``start`` is a multiple of 8: the group is then one Philox call. Otherwise its
    8 counters straddle two consecutive calls, and both are drawn (still 4x fewer than one per element).
    """
    call = start >> 3
    w0, w1, w2, w3 = _philox(seed, call)
    if ALIGNED:
        k = _bits_from_words(w0, w1, w2, w3, lane)
    else:
        pos = (start & 7) + lane  # 0..14: position in call `call` (< 8) or in call `call + 1`
        v0, v1, v2, v3 = _philox(seed, call + 1)
        nxt = pos >= 8
        k = _bits_from_words(tl.where(nxt, v0, w0), tl.where(nxt, v1, w1), tl.where(nxt, v2, w2),
                             tl.where(nxt, v3, w3), pos & 7)  # fmt: skip
    return k >> (16 - TOP)


@triton.jit
def _one_plus_noise(seed, start, lane, ALIGNED: tl.constexpr):
    """``1 + u`` (fp32, exact) at counters ``start + lane``, shapes as :func:`noise_bits`."""
    k = noise_bits(seed, start, lane, ALIGNED)
    return ((k << 7) | 0x3F800040).to(tl.float32, bitcast=True)


@triton.jit
def centered_noise(seed, start, lane, ALIGNED: tl.constexpr):
    """``u - 1/2`` (fp32) at counters ``start + lane``, shapes as :func:`noise_bits`."""
    return _one_plus_noise(seed, start, lane, ALIGNED) - 1.5


@triton.jit
def complement_noise(seed, start, lane, ALIGNED: tl.constexpr):
    """``1 - u`` (fp32, exact: a multiple of ``2**-17`` in ``(0, 1)``) at counters ``start + lane``, shapes as
    :func:`noise_bits`: the same distribution as ``u``, for rounding that compares against ``(1 - u)``."""
    return 2.0 - _one_plus_noise(seed, start, lane, ALIGNED)
