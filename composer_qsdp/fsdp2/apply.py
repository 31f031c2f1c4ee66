"""``apply_qsdp``: install QSDP's comm objects on every FSDP2 unit of a model (through the comm path this torch
supports, :mod:`composer_qsdp.fsdp2.compat`); ``remove_qsdp`` undoes it."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FSDPModule

from composer_qsdp.comm import Topology
from composer_qsdp.fsdp2.comms import QSDPAllGather, QSDPReduceScatter
from composer_qsdp.fsdp2.compat import (
    COMM_PATHS,
    check_comm_path,
    default_comm_path,
    install_comms,
    restore_comms,
    sharded_params,
    weight_versions,
)
from composer_qsdp.fsdp2.hsdp import hsdp_note
from composer_qsdp.fsdp2.layout import FSDP2GatherLayout
from composer_qsdp.fsdp2.units import find_units, shard_group
from composer_qsdp.config import QSDPConfig
from composer_qsdp.engine import QSDPHandle, plan_units

__all__ = ["FSDP2Handle", "apply_qsdp", "remove_qsdp"]


log = logging.getLogger(__name__)


class FSDP2Handle(QSDPHandle):
    """A :class:`~composer_qsdp.engine.QSDPHandle` installed on FSDP2 units through ``comm_path`` (see
    :mod:`composer_qsdp.fsdp2.compat`): ``remove()`` restores FSDP's default collectives and drops the forward
    hook.

    Attributes:
        comm_path: ``"custom"`` or ``"proxy"``.
    """

    def __init__(self, *args: Any, comm_path: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.comm_path = comm_path
        self.adapter = f"fsdp2 ({comm_path}: {COMM_PATHS[comm_path]}), torch {torch.__version__}"

    def weight_versions(self, params: Sequence[torch.Tensor]) -> tuple[int, ...]:
        """The version counters of a unit's sharded parameters (:func:`composer_qsdp.fsdp2.compat.weight_versions`)."""
        return weight_versions(params)

    def unit_parameters(self, unit_index: int) -> Sequence[torch.Tensor]:
        """The unit's sharded parameters (DTensors) in FSDP2's order, the order of its all-gather input."""
        return [getattr(p.module, p.name) for p in sharded_params(self.units[unit_index].module)]

    def gather_input(self, unit_index: int, shards: Sequence[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        """The unit's all-gather input as FSDP2 builds it: each parameter's local shard, zero-padded to its segment
        of the unit's :class:`FSDP2GatherLayout` (the padded shard), cast to ``dtype``, one after another."""
        layout = self.units[unit_index].weights.layout or self.layout_of(unit_index)
        sizes = [numel for _, numel in layout.segments()]
        flat = torch.zeros(sum(sizes), dtype=dtype, device=shards[0].device)
        start = 0
        for shard, size in zip(shards, sizes, strict=True):
            flat[start : start + shard.numel()].copy_(shard.reshape(-1))
            start += size
        return flat

    def release_gathered_weights(self) -> None:
        """Reshard every unit (``FSDPModule.reshard()``, a no-op on a sharded one). FSDP2 keeps the root's weights
        gathered after its forward (for the backward it expects) and, under ``reshard_after_forward=<int>``, the
        other units' secondary shards: after a forward without a backward (an evaluation), the next forward would
        reuse weights gathered in the other mode."""
        for unit in self.units:
            if isinstance(unit.module, FSDPModule):
                unit.module.reshard()

    def install_collectives(self, groups: Sequence[dist.ProcessGroup]) -> None:
        """Each unit's all-gather and reduce-scatter become comm objects that call the handle (through
        ``comm_path``); they run on the groups FSDP2 passes them, the units' shard groups."""
        for unit in self.units:
            install_comms(unit.module, QSDPAllGather(self, unit.index), QSDPReduceScatter(self, unit.index),
                          self.comm_path)

    def remove(self) -> None:
        """Restore FSDP's default all-gather and reduce-scatter on every unit, drop the forward and optimizer
        hooks."""
        super().remove()
        for unit in self.units:
            restore_comms(unit.module, self.comm_path)


def apply_qsdp(
    model: nn.Module,
    config: QSDPConfig | None = None,
    *,
    optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None = None,
    comm_path: str | None = None,
) -> FSDP2Handle:
    """Quantize the weight all-gathers and gradient reduce-scatters of every FSDP2 unit of ``model``.

    Call after ``fully_shard`` (on the submodules, then the root) and before the first forward. Every unit that
    communicates gets a comm object on each side, backed by the schemes :func:`~composer_qsdp.engine.plan_units`
    chose (unquantized units get counting pass-through schemes), and ``model`` gets a forward pre-hook that
    starts each microbatch and checks for non-finite weights. Checkpoints are unaffected: FSDP's sharded
    parameters stay full precision; only the copies on the wire are quantized.

    Args:
        model: a model whose submodules (or itself) were wrapped with ``torch.distributed.fsdp.fully_shard``.
            With Composer, the ``ComposerModel`` (``state.model``).
        config: the quantization settings; ``QSDPConfig()`` (W8G8, stochastic) when ``None``.
        optimizers: the optimizer(s) that update ``model``: their steps are QSDP's step boundary (seeds, and
            the state of stateful schemes). ``None``: the step of any ``torch.optim.Optimizer`` that holds one of
            ``model``'s parameters; an update that is no optimizer's ``step()`` calls
            ``handle.on_optimizer_step()`` itself.
        comm_path: how FSDP2's collectives reach QSDP: ``"custom"`` (FSDP2's custom-collective API, torch >= 2.9)
            or ``"proxy"`` (FSDP2's internal collective calls, for torch 2.6-2.8); ``None`` picks ``"custom"``
            where this torch has the API (see :mod:`composer_qsdp.fsdp2.compat`).

    Returns:
        The :class:`FSDP2Handle`: traffic counters, ``state_dict`` for resuming, ``remove()``; its ``adapter``
        names the comm path.

    Raises:
        RuntimeError: the comm path cannot run on this torch (``"custom"`` before 2.9, ``"proxy"`` where FSDP2's
            internals moved), naming the version.
        ValueError: an unknown ``comm_path``, ``model`` has no FSDP2 unit, or QSDP is already applied to it.
    """
    comm_path = default_comm_path() if comm_path is None else comm_path
    check_comm_path(comm_path)
    config = QSDPConfig() if config is None else config
    if not isinstance(config, QSDPConfig):
        raise ValueError(f"config must be a QSDPConfig, got {type(config).__name__}")
    QSDPHandle.check_not_applied(model)
    if not any(isinstance(m, FSDPModule) for m in model.modules()):
        raise ValueError(
            f"{type(model).__name__} has no FSDP2 module: apply torch.distributed.fsdp.fully_shard to its blocks "
            "and root first (for FSDP1's FullyShardedDataParallel use composer_qsdp.fsdp1.apply_qsdp)"
        )
    units = find_units(model)
    handle = FSDP2Handle(model, config, plan_units(units, config), Topology.detect(config.ranks_per_node),
                         comm_path=comm_path)
    note = hsdp_note(units, handle.topology)
    if note is not None:
        log.warning(note)
    groups = [shard_group(u.module) for u in units]
    handle.install(groups, lambda index: FSDP2GatherLayout(units[index].module, groups[index].size()), optimizers)
    return handle


def remove_qsdp(model: nn.Module) -> None:
    """Undo :func:`apply_qsdp`: FSDP's default collectives again, no hooks.

    Raises:
        ValueError: QSDP is not applied to ``model``.
    """
    QSDPHandle.remove_from(model)
