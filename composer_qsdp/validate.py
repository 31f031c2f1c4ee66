"""Argument checks shared by every layer: each returns its value unchanged or raises a ``ValueError`` that names
the argument, the bad value and what is allowed.

This module imports nothing from the rest of ``composer_qsdp`` but :mod:`composer_qsdp._names`, so every layer
can use it.
"""

from __future__ import annotations

from composer_qsdp._names import did_you_mean

__all__ = ["NOISE_KEY_BITS", "SEED_BITS", "check_bool", "check_choice", "check_int", "check_noise_key", "check_seed",
           "is_fraction"]

#: A seed a user gives (QSDP's ``seed`` option, a recipe's ``seed``) is an integer in ``[0, 2**SEED_BITS)``:
#: Composer's range (``reproducibility.seed_all`` seeds numpy, whose seeds are 32-bit), so one number is valid
#: wherever a seed is asked for.
SEED_BITS = 32
#: A noise key (the ``seed`` argument of a codec or of :mod:`composer_qsdp.quant.philox`) is an integer in
#: ``[0, 2**NOISE_KEY_BITS)``: the non-negative int64 the Triton kernels take as their Philox key.
#: :func:`composer_qsdp.comm.seeds.mix_seed` derives one from the run's seed, the step, the unit, the side and the
#: rank.
NOISE_KEY_BITS = 63


def check_int(name: str, value: object, minimum: int = 0) -> int:
    """Return ``value`` if it is an int (not a bool) ``>= minimum``, else raise a ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} is invalid; it must be an integer >= {minimum}")
    return value


def is_fraction(value: object) -> bool:
    """True when ``value`` is a real number (not a bool) in ``[0, 1)``: an error-feedback moving-average coefficient."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0.0 <= value < 1.0


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


def check_seed(seed: object, name: str = "seed") -> int:
    """Return ``seed`` if it is a user's seed, an int (not a bool) in ``[0, 2**SEED_BITS)``, else raise a
    ``ValueError`` naming ``name``, the value and the range."""
    return _check_below(name, seed, SEED_BITS)


def check_noise_key(key: object, name: str = "seed") -> int:
    """Return ``key`` if it is a noise key, an int (not a bool) in ``[0, 2**NOISE_KEY_BITS)``, else raise a
    ``ValueError`` naming ``name``, the value and the range."""
    return _check_below(name, key, NOISE_KEY_BITS)


def _check_below(name: str, value: object, bits: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**bits:
        raise ValueError(f"{name}={value!r} is invalid; it must be an integer in [0, 2**{bits})")
    return value
