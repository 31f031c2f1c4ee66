"""Wire sizes from the wire formats' definitions, for checking byte counters: nothing here calls the package's codecs,
so a test or a record that compares a run's counters with these is an independent count (numel x bits / 8 +
scales)."""

from __future__ import annotations

__all__ = ["cdiv", "hadamard_minmax_bytes", "symmetric_bytes"]


def cdiv(a: int, b: int) -> int:
    """``a / b`` rounded up (integers)."""
    return -(-a // b)


def symmetric_bytes(n: int, bits: int, group: int) -> int:
    """Symmetric codes of ``n`` elements: packed per group (the last one partial), padded to 4 bytes, then one fp32
    scale per group."""
    groups = cdiv(n, group)
    codes = (groups - 1) * cdiv(group * bits, 8) + cdiv((n - (groups - 1) * group) * bits, 8)
    return cdiv(codes, 4) * 4 + 4 * groups


def hadamard_minmax_bytes(n: int, bits: int, group: int) -> int:
    """Hadamard-rotated min-max codes of ``n`` elements: zero-padded to whole groups, codes padded to 4 bytes, then
    two fp32 words (min, scale) per group."""
    padded = cdiv(n, group) * group
    return cdiv(padded * bits // 8, 4) * 4 + 8 * (padded // group)
