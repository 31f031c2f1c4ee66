"""FSDP1's units (the ``FullyShardedDataParallel`` instances of a model that manage a flat parameter) and roots."""

from __future__ import annotations

import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel

from composer_qsdp.fsdp1 import compat
from composer_qsdp.engine import Unit

__all__ = ["find_roots", "find_units", "unit_name"]

_WRAPPED = "_fsdp_wrapped_module."


def unit_name(qualified_name: str) -> str:
    """The name of an FSDP1 instance without FSDP1's wrapper segments (``model._fsdp_wrapped_module.blocks.0`` ->
    ``model.blocks.0``): the module path of the wrapped module, as FSDP2 units are named, so the same ``exclude`` and
    override patterns select the same units under both."""
    return qualified_name.replace(_WRAPPED, "")


def find_units(model: nn.Module) -> list[Unit]:
    """Every FSDP1 instance of ``model`` that manages a flat parameter, in ``named_modules`` order (the same on every
    rank). ``Unit.numel`` counts the original parameters' elements; ``Unit.params`` are the tensors whose version
    counters show in-place weight changes (:func:`composer_qsdp.fsdp1.compat.unit_params`)."""
    units = []
    for name, module in model.named_modules():
        if isinstance(module, FullyShardedDataParallel):
            handle = compat.flat_handle(module)
            if handle is not None:
                numel = sum(n for key, _, n in compat.flat_pieces(handle) if key is not None)
                units.append(Unit(unit_name(name), module, numel, compat.unit_params(handle)))
    return units


def find_roots(model: nn.Module) -> list[FullyShardedDataParallel]:
    """The outermost FSDP1 instances of ``model`` (``model`` itself when it is one; with Composer, each wrapped child
    of the ``ComposerModel``): the instances whose forward unshards and which take the communication hook."""
    roots, stack = [], [model]
    while stack:
        module = stack.pop()
        if isinstance(module, FullyShardedDataParallel):
            roots.append(module)
        else:
            stack.extend(reversed(list(module.children())))
    return roots
