"""FSDP2's units: the ``fully_shard`` modules of a model that manage parameters, and their shard groups."""

from __future__ import annotations

import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FSDPModule

from composer_qsdp.engine import Unit
from composer_qsdp.fsdp2.compat import param_group

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
    """The process group FSDP2 all-gathers and reduce-scatters ``unit`` over: the shard group of the mesh given
    to ``fully_shard`` (the only dimension of a 1-D mesh, the shard dimension of an HSDP mesh).

    Read from FSDP2's own parameter group, not from the parameters' ``device_mesh``: DTensor hands out one
    cached mesh for every mesh of the same shape, so a model sharded over a second mesh (a second
    ``init_device_mesh``, which on a CUDA host with a gloo default group creates a new group each time) has
    parameters naming the first mesh's group while FSDP2 communicates over its own.

    Raises:
        ValueError: ``unit`` was not given to ``fully_shard``, or it manages no parameters (FSDP2 sends no
            collective for it).
    """
    return param_group(unit).mesh_info.shard_process_group
