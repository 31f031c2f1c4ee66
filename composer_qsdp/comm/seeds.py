"""Derive independent 63-bit random-stream keys from tuples of integers (step, unit, side, rank...)."""

from __future__ import annotations

__all__ = ["mix_seed"]

_MASK64 = (1 << 64) - 1


def _splitmix64(z: int) -> int:
    # SplitMix64 finalizer: a bijection on 64-bit ints with full avalanche, so nearby tuples give unrelated keys.
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def mix_seed(*parts: int) -> int:
    """Hash integers in ``[0, 2**64)`` into one codec seed in ``[0, 2**63)``.

    Order matters: ``mix_seed(a, b) != mix_seed(b, a)`` in general. Used so that every (base seed, step,
    FSDP unit, weights/gradients, rank) combination draws its rounding noise from its own stream.

    Raises:
        ValueError: a part is not a non-negative integer.
    """
    h = 0
    for part in parts:
        if isinstance(part, bool) or not isinstance(part, int) or not 0 <= part <= _MASK64:
            raise ValueError(f"seed part {part!r} is invalid; seed parts must be integers in [0, 2**64)")
        h = _splitmix64(h ^ _splitmix64(part))
    return h >> 1
