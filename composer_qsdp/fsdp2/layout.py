"""``FSDP2GatherLayout``: where each parameter of an FSDP2 unit sits in the unit's all-gather output.

FSDP2 shards every parameter on dim 0, padding it to ``ceil(size(0) / W)`` rows per rank, and each rank's
all-gather input is its padded shards of the unit's parameters, one after another, in FSDP's parameter order.
So the output ``[W * n]`` viewed as ``[W, n]`` holds, in row ``r``, rank ``r``'s padded shard of every parameter.
The order and padded sizes come from FSDP2's parameter group (``FSDPParam``, private: read by
:func:`composer_qsdp.fsdp2.compat.sharded_params`, with a clear error here if a torch release moves it).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from composer_qsdp.fsdp2.compat import sharded_params
from composer_qsdp.schemes import GatherLayout

__all__ = ["FSDP2GatherLayout"]


class FSDP2GatherLayout(GatherLayout):
    """The all-gather layout of one FSDP2 unit over ``world_size`` ranks.

    Args:
        unit: a module given to ``fully_shard`` that manages parameters.
        world_size: ranks of its shard group.

    Raises:
        RuntimeError: this torch's FSDP2 keeps its parameter group elsewhere.
        ValueError: a parameter sharded on another dim than 0 (``shard_placement_fn``).
    """

    def __init__(self, unit: nn.Module, world_size: int) -> None:
        try:
            params = sharded_params(unit)
        except AttributeError as err:
            raise RuntimeError(
                f"cannot read FSDP2's parameter group of {type(unit).__name__} on torch {torch.__version__} ({err}); "
                "schemes that keep gathered weights need it"
            ) from None
        self.world_size = world_size
        self.entries: list[tuple[str, torch.Size, int]] = []  # (key, full shape, rows per rank)
        paths = {id(module): path for path, module in unit.named_modules()}
        for param in params:
            shape, padded = param.shape, param.padded_shard
            if len(shape) == 0 or tuple(padded[1:]) != tuple(shape[1:]) or padded[0] * world_size < shape[0]:
                raise ValueError(
                    f"parameter {param.name!r} of shape {tuple(shape)} is sharded as {tuple(padded)} per rank, not "
                    "on dim 0; schemes that keep gathered weights support FSDP2's default dim-0 sharding only"
                )
            path = paths.get(id(param.module), "")
            self.entries.append((f"{path}.{param.name}" if path else param.name, shape, padded[0]))
        self.shard_numel = sum(numel for _, numel in self.segments())

    def _columns(self, gathered: torch.Tensor) -> list[tuple[str, torch.Size, torch.Tensor]]:
        rows = gathered.view(self.world_size, self.shard_numel)
        out, start = [], 0
        for key, shape, per_rank in self.entries:
            width = per_rank * math.prod(shape[1:])
            out.append((key, shape, rows[:, start : start + width]))
            start += width
        return out

    def segments(self) -> list[tuple[str, int]]:
        return [(key, rows * math.prod(shape[1:])) for key, shape, rows in self.entries]

    def shapes(self) -> dict[str, torch.Size]:
        return {key: shape for key, shape, _ in self.entries}

    def split(self, gathered: torch.Tensor) -> dict[str, torch.Tensor]:
        return {
            key: cols.reshape(self.world_size * cols.shape[1] // math.prod(shape[1:]), *shape[1:])[: shape[0]]
            for key, shape, cols in self._columns(gathered)
        }

    def join(self, params: dict[str, torch.Tensor], out: torch.Tensor) -> None:
        self.check_saved(params)
        out.zero_()
        for key, shape, cols in self._columns(out):
            padded_rows = self.world_size * cols.shape[1] // math.prod(shape[1:])
            full = torch.zeros((padded_rows, *shape[1:]), dtype=out.dtype, device=out.device)
            full[: shape[0]] = params[key]
            cols.copy_(full.view(self.world_size, -1))
