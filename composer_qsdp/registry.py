"""Name -> object tables whose entries are imported on first use: the one way the package maps the names a user
writes (a codec name in a recipe, ...) to classes.

An entry is a ``"module:attribute"`` string, so registering it imports nothing and a table can name classes of
any layer without importing that layer; :meth:`Registry.lookup` imports the module when the name is first used.
Every table rejects an unknown name the same way, with a ``ValueError`` that names it, the closest registered
name and the allowed ones. This module imports nothing from the rest of ``composer_qsdp`` but the suggestions of
``composer_qsdp._names`` (which imports nothing), so every layer can use it.
"""

from __future__ import annotations

import importlib
from typing import Generic, TypeVar

from composer_qsdp._names import did_you_mean

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """A table of names, each standing for an object (usually a class) imported lazily.

    Args:
        kind: what the names stand for, in the singular (``"codec"``); it begins the error messages.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._targets: dict[str, str] = {}

    def register(self, name: str, target: str) -> None:
        """Add ``name``, standing for the attribute ``attr`` of module ``module`` given as ``"module:attr"``.

        Raises:
            ValueError: ``name`` is not a non-empty string or is already registered, or ``target`` is not of
                the form ``"module:attr"``.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name {name!r} is invalid; it must be a non-empty string")
        if name in self._targets:
            raise ValueError(f"{self.kind} {name!r} is already registered (as {self._targets[name]!r})")
        module, _, attr = target.partition(":") if isinstance(target, str) else ("", "", "")
        if not module or not attr:
            raise ValueError(f"target {target!r} of {self.kind} {name!r} is invalid; it must be 'module:attr'")
        self._targets[name] = target

    def lookup(self, name: object) -> T:
        """The object ``name`` stands for, importing its module if needed.

        Raises:
            ValueError: ``name`` is not a registered name (whatever its type), naming it, the closest registered
                name (where one is close) and the allowed names.
        """
        if not isinstance(name, str) or name not in self._targets:
            hint = did_you_mean(name, self._targets) if isinstance(name, str) else ""
            raise ValueError(f"unknown {self.kind} {name!r}{hint}; allowed: {', '.join(sorted(self._targets))}")
        module, attr = self._targets[name].split(":")
        return getattr(importlib.import_module(module), attr)

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._targets)
