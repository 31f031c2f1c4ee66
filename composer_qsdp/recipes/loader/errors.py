"""The recipe's error, and the checks that raise it naming a recipe key."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from omegaconf.errors import MissingMandatoryValue

__all__ = ["Problems", "RecipeError", "check", "check_time"]


class RecipeError(ValueError):
    """A recipe that cannot run: the message names the offending key and what is allowed.

    Attributes:
        problems: the independent problems it reports, each a message naming its key (one: the message itself;
            several: numbered in the message, from :meth:`Problems.raise_if_any`).
    """

    def __init__(self, message: str, problems: Sequence[str] | None = None) -> None:
        super().__init__(message)
        self.problems: tuple[str, ...] = tuple(problems) if problems else (message,)


class Problems:
    """The independent problems of one recipe, gathered so that one :class:`RecipeError` reports them all.

    Each independent check runs in :meth:`collect`: its :class:`RecipeError` is recorded and the next check runs.
    A check that depends on a value an earlier problem left unset (omegaconf's ``MissingMandatoryValue``: a key
    reported missing or of the wrong type) is skipped silently. :meth:`raise_if_any` then raises one error: the
    message of a single problem as it is, several numbered.
    """

    def __init__(self) -> None:
        self.messages: list[str] = []
        self._first: RecipeError | None = None  # raised as it is where it stays the only problem

    def add(self, err: RecipeError) -> None:
        """Record the problems of ``err``, each once."""
        self._first = err if self._first is None else self._first
        self.messages.extend(m for m in err.problems if m not in self.messages)

    @contextlib.contextmanager
    def collect(self) -> Iterator[None]:
        """Run one independent check: a :class:`RecipeError` inside is recorded, not raised."""
        try:
            yield
        except RecipeError as err:
            self.add(err)
        except MissingMandatoryValue:
            if not self.messages:  # not a key an earlier problem left unset: a bug to show as it is
                raise

    def raise_if_any(self) -> None:
        """Raise the recorded problems as one :class:`RecipeError`, if there are any."""
        if len(self.messages) == 1:
            raise self._first if self._first is not None and self._first.problems == (self.messages[0],) \
                else RecipeError(self.messages[0])
        if self.messages:
            numbered = "\n".join(f"  {i}. {m}" for i, m in enumerate(self.messages, 1))
            raise RecipeError(f"{len(self.messages)} problems in the recipe (each independent of the others; fix "
                              f"them all before the next launch):\n{numbered}", self.messages)


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

