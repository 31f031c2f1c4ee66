"""The recipe's error, and the checks that raise it naming a recipe key."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["RecipeError", "check", "check_time"]


class RecipeError(ValueError):
    """A recipe that cannot run: the message names the offending key and what is allowed."""


def check(ok: bool, key: str, value: Any, allowed: str) -> None:
    """Raise a :class:`RecipeError` naming ``key``, its ``value`` and what is ``allowed`` unless ``ok``."""
    if not ok:
        raise RecipeError(f"recipe key '{key}' = {value!r} is invalid; {allowed}")


def check_time(key: str, value: Any, *, positive: bool, units: Sequence[str] | None = None) -> Any:
    """``value`` must be a Composer duration, > 0 (``positive``) or >= 0, in one of ``units`` when given; returns
    it as Composer's ``Time``."""
    from composer.core import Time

    try:
        time = value if isinstance(value, Time) else Time.from_timestring(value)
    except (ValueError, TypeError, AttributeError):
        raise RecipeError(f"recipe key '{key}' = {value!r} is not a duration; use e.g. 4800ba, 1ep, "
                          "2500000000tok") from None
    check(time.value > 0 if positive else time.value >= 0, key, value, f"it must be {'>' if positive else '>='} 0")
    check(units is None or time.unit.value in units, key, value, f"its unit must be one of {', '.join(units or ())}")
    return time

