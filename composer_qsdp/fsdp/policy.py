"""Which FSDP units QSDP quantizes, on which side, with which codec."""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

import torch.nn as nn
from torch.distributed.fsdp import FSDPModule

from composer_qsdp.fsdp.config import QSDPConfig, Side
from composer_qsdp.quant import Codec

__all__ = ["UnitPlan", "managed_parameters", "plan_units"]


@dataclass(frozen=True)
class UnitPlan:
    """The decision for one FSDP unit (a module given to ``fully_shard`` that manages parameters).

    Attributes:
        index: position among the model's units (``named_modules`` order, identical on every rank).
        name: qualified module name in the model QSDP was applied to (``''``: that model).
        module: the ``FSDPModule``.
        numel: unsharded parameter elements the unit all-gathers (its own parameters, not nested units').
        weight_codec: codec of the weight all-gather, ``None`` for unquantized.
        grad_codec: codec of the gradient reduce-scatter, ``None`` for unquantized.
        note: why a configured side is unquantized (``''`` when nothing was overridden).
    """

    index: int
    name: str
    module: nn.Module
    numel: int
    weight_codec: Codec | None
    grad_codec: Codec | None
    note: str

    def codec(self, side: Side) -> Codec | None:
        """The codec of ``side``."""
        return self.weight_codec if side == "weights" else self.grad_codec

    def describe(self) -> str:
        """One line: name, size and the codec of each side."""
        sides = ", ".join(f"{side}={self.codec(side) or 'unquantized'}" for side in ("weights", "grads"))
        return f"{self.name or '<root>'} ({self.numel} elements): {sides}{f' [{self.note}]' if self.note else ''}"


def managed_parameters(unit: nn.Module) -> list[nn.Parameter]:
    """Parameters an FSDP unit communicates: those in its subtree that no nested FSDP unit manages."""
    params: dict[int, nn.Parameter] = {}
    stack = [unit]
    while stack:
        module = stack.pop()
        for param in module.parameters(recurse=False):
            params.setdefault(id(param), param)
        stack.extend(child for child in module.children() if not isinstance(child, FSDPModule))
    return list(params.values())


def plan_units(model: nn.Module, config: QSDPConfig) -> list[UnitPlan]:
    """Decide, for every FSDP unit of ``model`` that manages parameters, the codec of each side.

    Order of the rules per side: ``exclude`` patterns and ``min_numel`` leave the unit unquantized; else the
    first matching pattern of the side's overrides sets the bits; else the side's default bits.
    """
    plans: list[UnitPlan] = []
    for name, module in model.named_modules():
        if not isinstance(module, FSDPModule):
            continue
        params = managed_parameters(module)
        if not params:
            continue  # nothing to communicate: FSDP gives such a unit no collective
        numel = sum(p.numel() for p in params)
        excluded_by = next((p for p in config.exclude if fnmatchcase(name, p)), None)
        if excluded_by is not None:
            note = f"excluded by {excluded_by!r}"
        elif numel < config.min_numel:
            note = f"smaller than min_numel={config.min_numel}"
        else:
            note = ""
        codecs: dict[str, Codec | None] = {}
        for side in ("weights", "grads"):
            override = next((p for p in config.overrides(side) if fnmatchcase(name, p)), None)
            bits = config.bits(side) if override is None else config.overrides(side)[override]
            codecs[side] = None if note or bits is None else config.make_codec(side, bits)
        plans.append(UnitPlan(len(plans), name, module, numel, codecs["weights"], codecs["grads"], note))
    return plans
