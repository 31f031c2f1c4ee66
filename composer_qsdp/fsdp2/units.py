"""FSDP2's units: the ``fully_shard`` modules of a model that manage parameters, and their shard groups."""

from __future__ import annotations

import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from composer_qsdp.engine import Unit

__all__ = ["find_units", "managed_parameters", "shard_group"]


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


def find_units(model: nn.Module) -> list[Unit]:
    """Every FSDP2 module of ``model`` that manages parameters, in ``named_modules`` order (the same on every
    rank); modules with nothing to communicate get no collective from FSDP and are skipped."""
    units = []
    for name, module in model.named_modules():
        if isinstance(module, FSDPModule):
            params = managed_parameters(module)
            if params:
                units.append(Unit(name, module, sum(p.numel() for p in params), tuple(params)))
    return units


def shard_group(unit: nn.Module) -> dist.ProcessGroup:
    """The process group FSDP2 all-gathers and reduce-scatters ``unit`` over: the last dimension of its
    parameters' device mesh (the only one of a 1-D mesh; the shard dimension of an HSDP mesh).

    A unit left unsharded by a forward pass (the root keeps its parameters gathered after the forward) is
    resharded first (``FSDPModule.reshard``), which puts its sharded DTensor parameters back.

    Raises:
        ValueError: the unit's parameters are not sharded DTensors (the module was not given to
            ``fully_shard``).
    """
    param = managed_parameters(unit)[0]
    if not isinstance(param, DTensor) and isinstance(unit, FSDPModule):
        unit.reshard()
        param = managed_parameters(unit)[0]
    if not isinstance(param, DTensor):
        raise ValueError(f"{type(unit).__name__} manages a parameter that is not a DTensor; was fully_shard applied?")
    mesh = param.device_mesh
    return mesh.get_group(mesh.ndim - 1)
