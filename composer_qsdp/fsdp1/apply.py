"""``apply_qsdp`` for FSDP1: QSDP on every flat-parameter unit of a ``FullyShardedDataParallel`` model;
``remove_qsdp`` undoes it.

Each unit gets two comm objects that forward to the :class:`~composer_qsdp.engine.QSDPHandle`, like FSDP2's: the
weight all-gather replaces the unit's flat-parameter gather, the gradient reduce-scatter is the unit's
communication-hook state (:mod:`composer_qsdp.fsdp1.compat` says how each is reached).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

from composer_qsdp.comm import Topology
from composer_qsdp.fsdp1 import compat
from composer_qsdp.fsdp1.layout import FSDP1GatherLayout
from composer_qsdp.fsdp1.units import find_roots, find_units
from composer_qsdp.config import QSDPConfig
from composer_qsdp.engine import QSDPHandle, plan_units

__all__ = ["FSDP1AllGather", "FSDP1Handle", "FSDP1ReduceScatter", "apply_qsdp", "remove_qsdp"]

_SHARDED = (ShardingStrategy.FULL_SHARD, ShardingStrategy.SHARD_GRAD_OP)


class FSDP1AllGather:
    """A unit's weight all-gather, in place of its ``FlatParamHandle._all_gather_flat_param``.

    Args:
        handle: the handle whose scheme runs the collective.
        unit_index: the unit's index in ``handle.units``.
        flat_handle: the unit's ``FlatParamHandle``.
        group: the unit's process group.
    """

    def __init__(self, handle: QSDPHandle, unit_index: int, flat_handle: Any, group: dist.ProcessGroup) -> None:
        self.handle = handle
        self.unit_index = unit_index
        self.flat_handle = flat_handle
        self.group = group

    def __call__(self, padded_unsharded_flat_param: torch.Tensor) -> torch.Tensor:
        # The flat parameter's data is this rank's shard at this point: the low-precision copy under mixed precision.
        shard = self.flat_handle.flat_param.data
        self.handle.all_gather(self.unit_index, padded_unsharded_flat_param, shard, self.group)
        return padded_unsharded_flat_param


class FSDP1ReduceScatter:
    """A unit's gradient reduce-scatter: the unit's FSDP1 communication-hook state (:func:`reduce_scatter_hook`).

    Divides as FSDP1's own reduce-scatter does, by ``predivide`` before a SUM and ``postdivide`` after (their
    product is the world size), so an unquantized unit reduces bit-identically to FSDP1 without QSDP.

    Args:
        handle: the handle whose scheme runs the collective.
        unit_index: the unit's index in ``handle.units``.
        group: the unit's process group.
        predivide: FSDP1's gradient pre-division factor.
        postdivide: FSDP1's gradient post-division factor.
    """

    def __init__(self, handle: QSDPHandle, unit_index: int, group: dist.ProcessGroup, predivide: float,
                 postdivide: float) -> None:
        self.handle = handle
        self.unit_index = unit_index
        self.group = group
        self.predivide = predivide
        self.postdivide = postdivide

    def __call__(self, padded_unsharded_grad: torch.Tensor, new_sharded_grad: torch.Tensor) -> None:
        if self.predivide > 1:
            padded_unsharded_grad.div_(self.predivide)
        self.handle.reduce_scatter(self.unit_index, new_sharded_grad, padded_unsharded_grad, dist.ReduceOp.SUM,
                                   self.group)
        if self.postdivide > 1:
            new_sharded_grad.div_(self.postdivide)


def reduce_scatter_hook(state: Any, padded_unsharded_grad: torch.Tensor,
                        new_sharded_grad: torch.Tensor | None = None) -> None:
    """The FSDP1 communication hook QSDP registers: FSDP calls it with the reducing instance's state, the unit's
    :class:`FSDP1ReduceScatter`.

    Raises:
        RuntimeError: an unsharded reduction (``NO_SHARD``, which :func:`apply_qsdp` refuses).
    """
    if new_sharded_grad is None:
        raise RuntimeError("QSDP's FSDP1 hook was called for an unsharded (NO_SHARD) all-reduce")
    state(padded_unsharded_grad, new_sharded_grad)


def _not_a_unit(*_: Any) -> None:
    # The hook state of FSDP instances without parameters: FSDP never reduces for them.
    raise RuntimeError("QSDP's FSDP1 hook was called for an FSDP instance that manages no parameters")


class FSDP1Handle(QSDPHandle):
    """A :class:`~composer_qsdp.engine.QSDPHandle` installed on FSDP1 units: ``remove()`` restores FSDP1's own
    all-gathers and reduce-scatters and drops the forward hook."""

    adapter = (f"fsdp1 (gradients: register_comm_hook; weights: FlatParamHandle._all_gather_flat_param), "
               f"torch {torch.__version__}")

    def __init__(self, *args: Any, roots: list[FullyShardedDataParallel], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._roots = roots

    def weight_versions(self, params: Sequence[torch.Tensor]) -> tuple[int, ...]:
        """The version counters of a unit's flat and original parameters
        (:func:`composer_qsdp.fsdp1.compat.weight_versions`)."""
        return compat.weight_versions(params)

    def release_gathered_weights(self) -> None:
        """Free each unit's gathered flat parameter that FSDP1 kept after a forward (the root's, after a forward
        without a backward): its next forward gathers again, in the handle's current mode."""
        for unit in self.units:
            compat.release_unsharded(unit.module)  # type: ignore[arg-type]

    def install_collectives(self, groups: Sequence[dist.ProcessGroup]) -> None:
        """Each unit's flat-parameter all-gather and its reduce-scatter (the roots' communication hook) call the
        handle."""
        states: dict[nn.Module, FSDP1ReduceScatter] = {}
        for unit, group in zip(self.units, groups):
            fsdp_module: Any = unit.module
            flat = compat.flat_handle(fsdp_module)
            compat.install_all_gather(flat, FSDP1AllGather(self, unit.index, flat, group))
            states[fsdp_module] = FSDP1ReduceScatter(self, unit.index, group, *compat.division_factors(fsdp_module))
        for root in self._roots:
            compat.install_reduce_scatter(root, states, reduce_scatter_hook, _not_a_unit)

    def remove(self) -> None:
        """Restore FSDP1's all-gathers and reduce-scatters on every unit, drop the forward and optimizer hooks."""
        super().remove()
        for unit in self.units:
            compat.restore_all_gather(compat.flat_handle(unit.module))
        for root in self._roots:
            compat.restore_reduce_scatter(root)


def apply_qsdp(
    model: nn.Module,
    config: QSDPConfig | None = None,
    *,
    optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None = None,
) -> FSDP1Handle:
    """Quantize the weight all-gathers and gradient reduce-scatters of every FSDP1 unit of ``model``.

    Call after wrapping with ``FullyShardedDataParallel`` and before the first forward. Units are the FSDP
    instances that manage a flat parameter, named by their module path without FSDP1's ``_fsdp_wrapped_module``
    segments (so ``exclude`` and override patterns match FSDP2's names). The same schemes, seeds, checks and state
    as FSDP2's adapter; ``use_orig_params`` either way; mixed precision gathers ``param_dtype`` and reduces
    ``reduce_dtype``. ``summon_full_params`` and full state dicts gather exact weights.

    Args:
        model: an FSDP1 model: a ``FullyShardedDataParallel`` root, or a module whose children are roots (Composer's
            ``ComposerModel``).
        config: the quantization settings; ``QSDPConfig()`` (W8G8, stochastic) when ``None``.
        optimizers: the optimizer(s) that update ``model``: their steps are QSDP's step boundary. ``None``: the
            step of any ``torch.optim.Optimizer`` that holds one of ``model``'s parameters.

    Returns:
        The :class:`FSDP1Handle`: traffic counters, ``state_dict`` for resuming, ``remove()``.

    Raises:
        ValueError: ``model`` has no FSDP1 unit, QSDP (or another communication hook) is already installed, a unit
            uses a strategy other than ``FULL_SHARD``/``SHARD_GRAD_OP`` or offloads parameters to the CPU, or the
            config asks for per-parameter pieces (``align_buckets``, ``unquantized_params``).
        RuntimeError: this torch's FSDP1 moved a private name the adapter uses.
    """
    config = QSDPConfig() if config is None else config
    if not isinstance(config, QSDPConfig):
        raise ValueError(f"config must be a QSDPConfig, got {type(config).__name__}")
    QSDPHandle.check_not_applied(model)
    roots = find_roots(model)
    units = find_units(model)
    if not units:
        raise ValueError(
            f"{type(model).__name__} has no FSDP1 unit with parameters: wrap it with "
            "torch.distributed.fsdp.FullyShardedDataParallel first (for fully_shard use composer_qsdp.apply_qsdp)"
        )
    compat.check_fsdp1_support(units[0].module)  # type: ignore[arg-type]
    for unit in units:
        _check_unit(unit.name, unit.module)  # type: ignore[arg-type]
    for unit in units:
        compat.zero_padding(compat.flat_handle(unit.module))
    handle = FSDP1Handle(model, config, plan_units(units, config), Topology.detect(config.ranks_per_node),
                         roots=roots)
    handle.install([u.module.process_group for u in units],  # type: ignore[union-attr]
                   lambda index: FSDP1GatherLayout(compat.flat_pieces(compat.flat_handle(units[index].module))),
                   optimizers)
    return handle


def _check_unit(name: str, module: FullyShardedDataParallel) -> None:
    strategy = compat.sharding_strategy(module)
    if strategy not in _SHARDED:
        raise ValueError(
            f"FSDP1 unit {name or '<root>'!r} uses sharding_strategy={strategy.name}; QSDP supports "
            f"{' and '.join(s.name for s in _SHARDED)}: NO_SHARD has no all-gather or reduce-scatter to quantize "
            "(FSDP1 also picks it at world size 1), and FSDP1 refuses communication hooks for the hybrid strategies "
            "(use FSDP2 for HSDP)"
        )
    if compat.offloads_params(module):
        raise ValueError(
            f"FSDP1 unit {name or '<root>'!r} offloads parameters to the CPU (CPUOffload(offload_params=True)); "
            "QSDP's FSDP1 adapter supports offload_params=False only"
        )
    if compat.has_comm_hook(module):
        raise ValueError(f"FSDP1 unit {name or '<root>'!r} already has a communication hook; QSDP installs its own")


def remove_qsdp(model: nn.Module) -> None:
    """Undo :func:`apply_qsdp`: FSDP1's own collectives again, no hooks.

    Raises:
        ValueError: QSDP is not applied to ``model``.
    """
    QSDPHandle.remove_from(model)
