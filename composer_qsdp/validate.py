"""Argument checks shared by every layer: each returns its value unchanged or raises a ``ValueError`` that names
the argument, the bad value and what is allowed.

This module imports nothing from the rest of ``composer_qsdp`` but :mod:`composer_qsdp._names`, so every layer
can use it.
"""

from __future__ import annotations

from composer_qsdp._names import did_you_mean

__all__ = ["MAX_SEED", "check_bool", "check_choice", "check_int", "check_seed"]

#: Largest seed (a 64-bit Philox key) any QSDP option accepts.
MAX_SEED = 2**64 - 1


def check_int(name: str, value: object, minimum: int = 0) -> int:
    """Return ``value`` if it is an int (not a bool) ``>= minimum``, else raise a ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} is invalid; it must be an integer >= {minimum}")
    return value


def check_bool(name: str, value: object) -> bool:
    """Return ``value`` if it is a bool, else raise a ``ValueError`` naming ``name`` (a truthy string such as
    ``"false"`` must not switch an option on)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name}={value!r} is invalid; it must be True or False")
    return value


def check_choice(name: str, value: object, allowed: tuple[str, ...]) -> str:
    """Return ``value`` if it is one of the strings ``allowed``, else raise a ``ValueError`` naming ``name`` and
    ``allowed`` (with the closest allowed string when one is close)."""
    if not isinstance(value, str) or value not in allowed:
        hint = did_you_mean(value, allowed) if isinstance(value, str) else ""
        raise ValueError(f"{name}={value!r} is not supported; allowed: {', '.join(allowed)}{hint}")
    return value


def check_seed(seed: object) -> int:
    """Return ``seed`` if it is a valid Philox key, an int (not a bool) in ``[0, 2**64)``, else raise a
    ``ValueError`` naming it."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed={seed!r} is invalid; it must be an integer in [0, 2**64)")
    return seed
