"""Triton side of the codecs' stochastic-rounding stream (:func:`composer_qsdp.quant.philox.rounding_noise`).

Counter ``c`` takes half ``c % 2`` (low half first) of word ``(c // 2) % 4`` of ``tl.randint4x(seed, c // 8)``
and maps the 16-bit value ``k`` to ``(k + 0.5) / 2**16``. Kernels lay their tiles out as groups of 8
consecutive elements (``[..., 8]``), so one Philox call serves a whole group when the group's first counter
is a multiple of 8 (:func:`noise_for_groups`); :func:`noise_at` handles arbitrary counters at one Philox call
per element. Both return float32 in ``(0, 1)``, identical to the torch reference bit for bit.
"""

import triton
import triton.language as tl

__all__ = ["noise_at", "noise_for_groups"]


@triton.jit
def _noise_from_words(w0, w1, w2, w3, lane):
    """Noise of lane ``lane`` (0..7) of the Philox call that returned words ``w0..w3`` (all broadcastable)."""
    pair = lane >> 1
    word = tl.where(pair == 0, w0, tl.where(pair == 1, w1, tl.where(pair == 2, w2, w3)))
    half = tl.where((lane & 1) == 0, word & 0xFFFF, word >> 16)
    return (half.to(tl.float32) + 0.5) * (1.0 / 65536.0)


@triton.jit
def noise_for_groups(seed, calls):
    """Noise of counters ``8 * calls[a, g] + m`` for ``m`` in 0..7: ``calls`` int64 ``[A, G]`` -> ``[A, G, 8]``."""
    w0, w1, w2, w3 = tl.randint4x(seed, calls)
    lane = tl.arange(0, 8)[None, None, :]
    return _noise_from_words(w0[:, :, None], w1[:, :, None], w2[:, :, None], w3[:, :, None], lane)


@triton.jit
def noise_at(seed, counters):
    """Noise at arbitrary int64 ``counters`` (any shape); one Philox call per element."""
    w0, w1, w2, w3 = tl.randint4x(seed, counters >> 3)
    return _noise_from_words(w0, w1, w2, w3, counters & 7)
