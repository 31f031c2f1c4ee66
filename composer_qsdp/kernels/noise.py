"""Triton side of the codecs' stochastic-rounding stream (:func:`composer_qsdp.quant.philox.rounding_noise`).

Counter ``c`` takes half ``c % 2`` (low half first) of word ``(c // 2) % 4`` of ``tl.randint4x(seed, c // 8)``
and maps the 16-bit value ``k`` to ``(k + 0.5) / 2**16``. Kernels lay their tiles out as groups of 8
consecutive elements (``[..., 8]``); :func:`noise_for_groups` draws a group's noise with one Philox call when
the group's first counter is a multiple of 8 and two otherwise, float32 in ``(0, 1)``, identical to the torch
reference bit for bit.
"""

import triton
import triton.language as tl

__all__ = ["noise_for_groups"]


@triton.jit
def _noise_from_words(w0, w1, w2, w3, lane):
    """Noise of lane ``lane`` (0..7) of the Philox call that returned words ``w0..w3`` (all broadcastable)."""
    pair = lane >> 1
    word = tl.where(pair == 0, w0, tl.where(pair == 1, w1, tl.where(pair == 2, w2, w3)))
    half = tl.where((lane & 1) == 0, word & 0xFFFF, word >> 16)
    return (half.to(tl.float32) + 0.5) * (1.0 / 65536.0)


@triton.jit
def noise_for_groups(seed, start, ALIGNED: tl.constexpr):
    """Noise of counters ``start + m`` for ``m`` in 0..7: int64 ``start`` ``[A, B, 1]`` -> float32 ``[A, B, 8]``.

    ``ALIGNED`` promises every ``start`` is a multiple of 8: the group is then one Philox call. Otherwise its
    8 counters straddle two consecutive calls, and both are drawn (still 4x fewer than one per element).
    """
    lane = tl.arange(0, 8)[None, None, :]
    call = start >> 3
    w0, w1, w2, w3 = tl.randint4x(seed, call)
    if ALIGNED:
        return _noise_from_words(w0, w1, w2, w3, lane)
    pos = (start & 7) + lane  # 0..14: position in call `call` (< 8) or in call `call + 1`
    v0, v1, v2, v3 = tl.randint4x(seed, call + 1)
    nxt = pos >= 8
    return _noise_from_words(tl.where(nxt, v0, w0), tl.where(nxt, v1, w1), tl.where(nxt, v2, w2),
                             tl.where(nxt, v3, w3), pos & 7)  # fmt: skip
