"""Every name a user types, in one place: the presets, codecs, weight, gradient and all-reduce schemes, policies and
the automatic policy's candidates, each table a :class:`Registry` whose entries are imported on first use.

An entry is a ``"module:attribute"`` string, so registering it imports nothing and a table can name objects of any
layer without importing that layer; :meth:`Registry.lookup` imports the module when the name is first used. A codec
or scheme may also name its option class (``options=``), which the configuration checks its options against. Every
table rejects an unknown name the same way (:meth:`Registry.check`), with a ``ValueError`` that names it, the
closest registered name and the allowed ones. This module imports nothing from the rest of ``composer_qsdp`` but
the suggestions of ``composer_qsdp._names`` (which imports nothing), so every layer can use it.

Extension goes through these tables: register a codec (a :class:`~composer_qsdp.quant.Codec` subclass) or a scheme
(a :class:`~composer_qsdp.schemes.WeightScheme` / :class:`~composer_qsdp.schemes.GradScheme` subclass) by its
``"module:Class"`` path, and configurations, recipes and the builders accept its name (``docs/api.md``, "For an
extender", has an example).
"""

from __future__ import annotations

import importlib
from typing import Any, Generic, TypeVar

from composer_qsdp._names import did_you_mean

__all__ = [
    "ALL_REDUCE_SCHEMES", "CANDIDATES", "CODECS", "GRAD_SCHEMES", "POLICIES", "PRESETS", "Registry",
    "WEIGHT_SCHEMES",
]

T = TypeVar("T")


class Registry(Generic[T]):
    """A table of names, each standing for an object (usually a class) imported lazily, in registration order.

    Args:
        kind: what the names stand for, in the singular (``"codec"``); it begins the error messages.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._targets: dict[str, str] = {}
        self._options: dict[str, str] = {}

    def register(self, name: str, target: str, *, options: str | None = None) -> None:
        """Add ``name``, standing for the attribute ``attr`` of module ``module`` given as ``"module:attr"``.

        Args:
            options: ``"module:attr"`` of the option class (a frozen dataclass that checks its fields) of the codec
                or scheme ``target``; ``None``: its options stay a mapping, checked by its constructor.

        Raises:
            ValueError: ``name`` is not a non-empty string or is already registered, or ``target`` (or
                ``options``) is not of the form ``"module:attr"``.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name {name!r} is invalid; it must be a non-empty string")
        if name in self._targets:
            raise ValueError(f"{self.kind} {name!r} is already registered (as {self._targets[name]!r})")
        for path in (target, *(() if options is None else (options,))):
            module, _, attr = path.partition(":") if isinstance(path, str) else ("", "", "")
            if not module or not attr:
                raise ValueError(f"target {path!r} of {self.kind} {name!r} is invalid; it must be 'module:attr'")
        self._targets[name] = target
        if options is not None:
            self._options[name] = options

    def check(self, name: object) -> str:
        """``name`` if it is registered, importing nothing.

        Raises:
            ValueError: ``name`` is not a registered name (whatever its type), naming it, the closest registered
                name (where one is close) and the allowed names.
        """
        if not isinstance(name, str) or name not in self._targets:
            hint = did_you_mean(name, self._targets) if isinstance(name, str) else ""
            raise ValueError(f"unknown {self.kind} {name!r}{hint}; allowed: {', '.join(sorted(self._targets))}")
        return name

    def lookup(self, name: object) -> T:
        """The object ``name`` stands for, importing its module if needed.

        Raises:
            ValueError: as :meth:`check`.
        """
        return _load(self._targets[self.check(name)])

    def options(self, name: object) -> type | None:
        """The option class registered with ``name`` (imported), or ``None`` when it has none.

        Raises:
            ValueError: as :meth:`check`.
        """
        path = self._options.get(self.check(name))
        return None if path is None else _load(path)

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._targets)


def _load(path: str) -> Any:
    module, attr = path.split(":")
    return getattr(importlib.import_module(module), attr)


_OPTIONS = "composer_qsdp.config.options"

#: The presets of ``QSDPConfig.from_preset``: each name stands for its flat options (``composer_qsdp.config.presets``
#: describes them); the first is the default.
PRESETS: Registry[dict[str, Any]] = Registry("QSDP preset")
for _name, _attr in (("w8g8", "W8G8"), ("w8g4", "W8G4"), ("w8g4-paper", "W8G4_PAPER"), ("w4g4", "W4G4"),
                     ("zeropp", "ZEROPP"), ("tlq-hs", "TLQ_HS"), ("sdp4bit", "SDP4BIT"), ("qwd-w4g4", "QWD_W4G4"),
                     ("qwd-w4g2-loco", "QWD_W4G2_LOCO"), ("qwd-w4g3-loco", "QWD_W4G3_LOCO"),
                     ("qwd-w3g3-loco", "QWD_W3G3_LOCO"), ("qwd-w3g2-loco", "QWD_W3G2_LOCO")):
    PRESETS.register(_name, f"composer_qsdp.config.presets:{_attr}")

#: Codecs (``SideConfig.codec``, ``make_codec(name)``): each name stands for a ``Codec`` class.
CODECS: Registry[Any] = Registry("codec")
CODECS.register("minmax", "composer_qsdp.quant.minmax:MinMaxCodec", options=f"{_OPTIONS}:CodecOptions")
CODECS.register("random_shift", "composer_qsdp.quant.random_shift:RandomShiftCodec", options=f"{_OPTIONS}:CodecOptions")
CODECS.register("learned", "composer_qsdp.quant.learned:LearnedLevelsCodec", options=f"{_OPTIONS}:LearnedOptions")
CODECS.register("symmetric", "composer_qsdp.quant.symmetric:SymmetricCodec", options=f"{_OPTIONS}:CodecOptions")
CODECS.register("sign", "composer_qsdp.quant.sign:SignCodec", options=f"{_OPTIONS}:CodecOptions")

#: Weight all-gather schemes (``QSDPConfig.weights.scheme``); the first is the default.
WEIGHT_SCHEMES: Registry[Any] = Registry("weight scheme")
WEIGHT_SCHEMES.register("direct", "composer_qsdp.schemes.direct:DirectAllGather", options=f"{_OPTIONS}:DirectOptions")
WEIGHT_SCHEMES.register("difference", "composer_qsdp.schemes.difference:DifferenceAllGather",
                        options=f"{_OPTIONS}:DifferenceOptions")
#: Gradient reduce-scatter schemes (``QSDPConfig.grads.scheme``); the first is the default.
GRAD_SCHEMES: Registry[Any] = Registry("grad scheme")
GRAD_SCHEMES.register("flat", "composer_qsdp.schemes.flat:FlatReduceScatter", options=f"{_OPTIONS}:FlatOptions")
GRAD_SCHEMES.register("two_level", "composer_qsdp.schemes.two_level:TwoLevelReduceScatter",
                      options=f"{_OPTIONS}:TwoLevelOptions")
GRAD_SCHEMES.register("loco", "composer_qsdp.schemes.loco:LoCoReduceScatter", options=f"{_OPTIONS}:LoCoOptions")
GRAD_SCHEMES.register("two_level_loco", "composer_qsdp.schemes.two_level_loco:TwoLevelLoCoReduceScatter",
                      options=f"{_OPTIONS}:TwoLevelLoCoOptions")
#: All-reduce schemes (full replicas: DDP, 0/1 Adam); the first is the default.
ALL_REDUCE_SCHEMES: Registry[Any] = Registry("all-reduce scheme")
ALL_REDUCE_SCHEMES.register("onebit", "composer_qsdp.schemes.onebit:OneBitAllReduce")

#: Policies (``QSDPConfig.policy``): ``"fixed"``, the configured settings throughout (the handle alone), or
#: ``"auto"``, the automatic policy, whose options are ``QSDPConfig.auto_options``.
POLICIES: Registry[Any] = Registry("policy")
POLICIES.register("fixed", "composer_qsdp.engine:QSDPHandle")
POLICIES.register("auto", "composer_qsdp.auto:AutoPolicy", options=f"{_OPTIONS}:AutoOptions")

#: The automatic policy's candidates per side (``AutoOptions.weight_candidates`` / ``grad_candidates``), most
#: accurate first: each name stands for a ``composer_qsdp.auto.Candidate``.
CANDIDATES: dict[str, Registry[Any]] = {"weights": Registry("weight candidate"), "grads": Registry("grad candidate")}
for _side, _entries in (("weights", (("off", "OFF_WEIGHTS"), ("w8", "W8"), ("qwd4", "QWD4"), ("qwd3", "QWD3"))),
                        ("grads", (("off", "OFF_GRADS"), ("g8", "G8"), ("g4", "G4"), ("g3loco", "G3LOCO")))):
    for _name, _attr in _entries:
        CANDIDATES[_side].register(_name, f"composer_qsdp.auto.choice:{_attr}")
del _name, _attr, _side, _entries
