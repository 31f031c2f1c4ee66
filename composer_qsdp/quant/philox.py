"""Counter-based random numbers in pure torch, bit-identical to Triton's ``tl.randint4x``/``tl.randint``/``tl.rand``.

Triton's generator (``triton/language/random.py``) is Philox4x32 with 10 rounds. For a 64-bit seed ``s`` and an
int64 counter ``c`` it runs Philox on the 128-bit counter ``(c mod 2**32, c >> 32, 0, 0)`` with the 64-bit key
``(s mod 2**32, s >> 32)`` and returns four 32-bit words. This module computes the same words on any device
with int64 arithmetic, so the torch reference codecs and the Triton kernels draw the same numbers.

Two layers of API:

* ``randint4x`` / ``randint`` / ``uniform``: exactly ``tl.randint4x`` / ``tl.randint`` / ``tl.rand``.
* ``rounding_bits`` / ``rounding_noise``: the stream the codecs use for stochastic rounding, Philox4x32 with
  ``NOISE_ROUNDS`` = 7 rounds (:mod:`composer_qsdp.kernels.philox_constants` says why). One Philox call yields 8
  values of 16 bits, so the kernels stay close to memory-bound (one Philox call per element would cost several
  times more integer work than the memory traffic of a 4-bit quantizer). Counter ``c`` takes half ``c % 2``
  (low half first) of word ``(c // 2) % 4`` of the call ``c // 8``: the 16-bit value ``k`` (``rounding_bits``),
  or as a float ``u = (k + 0.5) / 2**16`` (``rounding_noise``), uniform on 65536 points symmetric about 1/2.

The Triton side of the stream lives in :mod:`composer_qsdp.kernels.noise`; both take the Philox constants from
:mod:`composer_qsdp.kernels.philox_constants`.
"""

from __future__ import annotations

import torch

from composer_qsdp.kernels.philox_constants import KEY_A, KEY_B, N_ROUNDS, NOISE_ROUNDS, ROUND_A, ROUND_B
from composer_qsdp.validate import check_int, check_noise_key

__all__ = [
    "randint4x", "randint", "uniform", "rounding_bits", "rounding_bits_range", "rounding_noise",
    "rounding_noise_range",
]

_MASK32 = 0xFFFFFFFF
# Triton's uint32 -> float scale: the largest float such that (2**31 - 1) * scale < 1 in fp32.
_UNIFORM_SCALE = 4.6566127342e-10


def _mul_hi_lo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32-bit halves of ``a * b`` for a uint32 constant ``a`` and uint32 values ``b`` held in int64.

    The full product needs 64 unsigned bits, so it is split on 16-bit halves of ``a`` to stay inside int64.
    """
    a_hi, a_lo = a >> 16, a & 0xFFFF
    p_hi = b * a_hi  # < 2**48
    p_lo = b * a_lo  # < 2**48
    hi = (p_hi + (p_lo >> 16)) >> 16
    lo = (((p_hi & 0xFFFF) << 16) + p_lo) & _MASK32
    return hi, lo


def _check_offsets(offsets: torch.Tensor) -> torch.Tensor:
    if not isinstance(offsets, torch.Tensor) or offsets.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"offsets must be an int64 or int32 tensor, got {offsets!r:.80}")
    return offsets.to(torch.int64)


def randint4x(
    seed: int, offsets: torch.Tensor, n_rounds: int = N_ROUNDS
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Four blocks of random 32-bit words, equal to ``tl.randint4x(seed, offsets)``.

    Args:
        seed: Philox key, a noise key in ``[0, 2**63)`` (:data:`~composer_qsdp.validate.NOISE_KEY_BITS`): the
            range of the Triton kernels' int64 key.
        offsets: int64 (or int32) counters, any shape and device.
        n_rounds: Philox rounds (Triton's default 10).

    Returns:
        Four int64 tensors shaped like ``offsets`` holding the unsigned 32-bit words (values in ``[0, 2**32)``).
    """
    seed = check_noise_key(seed)
    k0, k1 = seed & _MASK32, seed >> 32
    c = _check_offsets(offsets)
    c0 = c & _MASK32
    c1 = (c >> 32) & _MASK32
    c2 = torch.zeros_like(c0)
    c3 = torch.zeros_like(c0)
    for _ in range(n_rounds):
        hi_b, lo_b = _mul_hi_lo(ROUND_B, c2)
        hi_a, lo_a = _mul_hi_lo(ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + KEY_A) & _MASK32
        k1 = (k1 + KEY_B) & _MASK32
    return c0, c1, c2, c3


def randint(seed: int, offsets: torch.Tensor, n_rounds: int = N_ROUNDS) -> torch.Tensor:
    """Random 32-bit words equal to ``tl.randint(seed, offsets)`` (first word of :func:`randint4x`), in int64."""
    return randint4x(seed, offsets, n_rounds)[0]


def uniform(seed: int, offsets: torch.Tensor, n_rounds: int = N_ROUNDS) -> torch.Tensor:
    """Float32 uniforms in ``[0, 1)`` equal to ``tl.rand(seed, offsets)``.

    Triton reads the word as int32, folds negatives with ``-x - 1`` (31 random bits) and multiplies by
    ``4.6566127342e-10`` in fp32 after an int32 -> fp32 conversion; the same steps are done here.
    """
    word = randint(seed, offsets, n_rounds)
    signed = torch.where(word >= 2**31, word - 2**32, word)
    folded = torch.where(signed < 0, -signed - 1, signed).to(torch.int32)
    # A Python float is multiplied as fp32 (the tensor's dtype), as Triton does, and needs no copy to the device.
    return folded.to(torch.float32) * _UNIFORM_SCALE


def _bits_from_words(words: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """``[..., 8]`` 16-bit values (int64) from the four words of Philox calls: word-major, low half first."""
    stacked = torch.stack(words, dim=-1)  # [..., 4]
    return torch.stack((stacked & 0xFFFF, stacked >> 16), dim=-1).flatten(-2)


def _as_noise(bits: torch.Tensor) -> torch.Tensor:
    """``(k + 0.5) / 2**16`` as float32 (exact)."""
    return (bits.to(torch.float32) + 0.5) * (1.0 / 65536.0)


def rounding_bits(seed: int, counters: torch.Tensor) -> torch.Tensor:
    """The codecs' stochastic-rounding stream at arbitrary counters: int64 values in ``[0, 2**16)``.

    Counter ``c`` maps to half ``c % 2`` of word ``(c // 2) % 4`` of the ``NOISE_ROUNDS``-round Philox call
    ``c // 8``. Costs one Philox call per element; prefer :func:`rounding_bits_range` for a contiguous range.
    """
    c = _check_offsets(counters)
    if (c < 0).any():
        raise ValueError("counters must be >= 0")
    bits = _bits_from_words(randint4x(seed, c >> 3, NOISE_ROUNDS))  # [..., 8]
    return torch.gather(bits, -1, (c & 7).unsqueeze(-1)).squeeze(-1)


def rounding_bits_range(seed: int, start: int, count: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """:func:`rounding_bits` at counters ``start, ..., start + count - 1`` (1-D int64, ``count`` elements).

    Runs one Philox call per 8 counters.
    """
    check_int("start", start)
    check_int("count", count)
    first_call = start >> 3
    last_call = (start + count + 7) >> 3
    calls = torch.arange(first_call, last_call, dtype=torch.int64, device=device)
    bits = _bits_from_words(randint4x(seed, calls, NOISE_ROUNDS)).reshape(-1)
    skip = start - 8 * first_call
    return bits[skip : skip + count]


def rounding_noise(seed: int, counters: torch.Tensor) -> torch.Tensor:
    """:func:`rounding_bits` ``k`` as float32 ``u = (k + 0.5) / 2**16`` in ``(0, 1)``: ``floor(y + u)`` is unbiased to
    within ``2**-17`` of one step."""
    return _as_noise(rounding_bits(seed, counters))


def rounding_noise_range(seed: int, start: int, count: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """:func:`rounding_noise` at counters ``start, ..., start + count - 1`` (1-D float32, ``count`` elements)."""
    return _as_noise(rounding_bits_range(seed, start, count, device))
