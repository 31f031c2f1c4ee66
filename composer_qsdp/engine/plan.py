"""Which units QSDP quantizes, and with which scheme on each side: the plan, whose schemes and codecs are built here,
once per unit, from the configuration's settings (:func:`composer_qsdp.schemes.build_scheme`)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

import torch
import torch.nn as nn

from composer_qsdp.config.settings import QSDPConfig, SideConfig
from composer_qsdp.schemes import GradScheme, WeightScheme, build_scheme

__all__ = ["Unit", "UnitPlan", "plan_units"]


@dataclass(frozen=True)
class Unit:
    """A unit an adapter found: a module that communicates the parameters it manages as one flat buffer.

    Attributes:
        name: qualified module name in the model QSDP is applied to (``''``: that model).
        module: the module.
        numel: unsharded parameter elements the unit communicates.
        params: the parameters it communicates (their version counters tell in-place changes).
    """

    name: str
    module: nn.Module
    numel: int
    params: tuple[torch.Tensor, ...] = ()


@dataclass(frozen=True)
class UnitPlan:
    """The decision for one unit.

    Attributes:
        index: position among the model's units (identical on every rank).
        name: qualified module name (``''``: the model itself).
        module: the module.
        numel: unsharded parameter elements the unit communicates.
        params: the parameters it communicates.
        weights: the unit's weight all-gather scheme (its own instance).
        grads: the unit's gradient reduce-scatter scheme (its own instance).
        note: why the unit is unquantized (``''`` when nothing excluded it).
    """

    index: int
    name: str
    module: nn.Module
    numel: int
    params: tuple[torch.Tensor, ...]
    weights: WeightScheme
    grads: GradScheme
    note: str

    @property
    def quantized(self) -> bool:
        """True when either side sends codes."""
        return self.weights.codec is not None or self.grads.codec is not None

    def describe(self) -> str:
        """One line: name, size and each side's scheme."""
        sides = f"weights={self.weights.describe()}, grads={self.grads.describe()}"
        return f"{self.name or '<root>'} ({self.numel} elements): {sides}{f' [{self.note}]' if self.note else ''}"


def plan_units(units: Sequence[Unit], config: QSDPConfig) -> list[UnitPlan]:
    """Decide the scheme of each side of every unit, and build it: a new scheme with a codec of its own per unit and
    side (:func:`~composer_qsdp.schemes.build_scheme`).

    Rules: ``exclude`` patterns, ``module_filter`` and ``min_numel`` leave the unit unquantized on both sides;
    else the first pattern of a side's ``bits_overrides`` that matches sets its bits; else the side's ``bits``.
    The first matching pattern of ``scheme_overrides`` sets the scheme, else the side's ``scheme``; unquantized
    sides take the default scheme.
    """
    _warn_unmatched(units, config)
    plans = []
    for index, unit in enumerate(units):
        note = _exclusion(unit, config)
        weights = build_scheme("weights", config.weights, None if note else _bits(config.weights, unit.name),
                               _scheme(config.weights, unit.name), config.error_sample_interval)
        grads = build_scheme("grads", config.grads, None if note else _bits(config.grads, unit.name),
                             _scheme(config.grads, unit.name), config.error_sample_interval)
        plans.append(UnitPlan(index, unit.name, unit.module, unit.numel, unit.params, weights, grads, note))
    _warn_costlier_than_bf16(plans)
    return plans


#: Bytes per element of an unquantized bf16 collective, the least FSDP sends without QSDP in mixed precision.
_BF16_BYTES = 2


def _warn_costlier_than_bf16(plans: Sequence[UnitPlan]) -> None:
    """Quantizing must send fewer bytes than bf16: per-bucket metadata outweighs the codes when buckets are tiny
    (``bucket_size=3`` at 8 bits sends about 1.8x bf16's bytes). Say so per side, naming the units."""
    for side in ("weights", "grads"):
        costly = [(p, getattr(p, side)) for p in plans if getattr(p, side).codec is not None
                  and getattr(p, side).codec.wire_bytes(p.numel) > _BF16_BYTES * p.numel]
        if not costly:
            continue
        plan, scheme = max(costly, key=lambda c: c[1].codec.wire_bytes(c[0].numel) / c[0].numel)
        codec = scheme.codec
        warnings.warn(
            f"QSDP {side} of unit(s) {[p.name or '<root>' for p, _ in costly]} send more bytes than bf16 would "
            f"(up to {codec.wire_bytes(plan.numel) / plan.numel:.2f} bytes per element against {_BF16_BYTES}: "
            f"{scheme.describe()}, bucket_size={codec.bucket_size}, whose per-bucket metadata outweighs the codes); "
            "use a larger bucket_size (the presets use 1024 and more) or exclude these units",
            stacklevel=3,
        )


def _warn_unmatched(units: Sequence[Unit], config: QSDPConfig) -> None:
    """A pattern that matches no unit is most likely a typo that leaves a unit quantized: say so, with the names."""
    names = [u.name for u in units]
    options = {
        "exclude": config.exclude,
        "weight_bits_overrides": tuple(config.weights.bits_overrides),
        "grad_bits_overrides": tuple(config.grads.bits_overrides),
        "weight_scheme_overrides": tuple(config.weights.scheme_overrides),
        "grad_scheme_overrides": tuple(config.grads.scheme_overrides),
    }
    for option, patterns in options.items():
        unmatched = [p for p in patterns if not any(fnmatchcase(n, p) for n in names)]
        if unmatched:
            warnings.warn(
                f"QSDP {option} pattern(s) {unmatched} match no unit; the units are {names} (fnmatch patterns on "
                "the names of the modules given to fully_shard, '' being the model itself)",
                stacklevel=3,
            )


def _exclusion(unit: Unit, config: QSDPConfig) -> str:
    excluded_by = next((p for p in config.exclude if fnmatchcase(unit.name, p)), None)
    if excluded_by is not None:
        return f"excluded by {excluded_by!r}"
    if config.module_filter is not None and not config.module_filter(unit.module, unit.name):
        return "excluded by module_filter"
    if unit.numel < config.min_numel:
        return f"smaller than min_numel={config.min_numel}"
    return ""


def _scheme(side: SideConfig, name: str) -> str | None:
    return next((s for p, s in side.scheme_overrides.items() if fnmatchcase(name, p)), None)


def _bits(side: SideConfig, name: str) -> int | None:
    override = next((p for p in side.bits_overrides if fnmatchcase(name, p)), None)
    return side.bits if override is None else side.bits_overrides[override]
