"""``apply_qsdp``: install quantized comm objects on every FSDP2 unit of a model; ``remove_qsdp`` undoes it."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from torch.distributed.fsdp import FSDPModule

from composer_qsdp.comm import TrafficCounter
from composer_qsdp.fsdp.comms import QSDPAllGather, QSDPReduceScatter
from composer_qsdp.fsdp.config import QSDPConfig, Side
from composer_qsdp.fsdp.finite_check import WeightFiniteMonitor
from composer_qsdp.fsdp.policy import UnitPlan, plan_units
from composer_qsdp.fsdp.report import TrafficReport
from composer_qsdp.fsdp.seeding import StepSeeds

__all__ = ["QSDPHandle", "apply_qsdp", "check_custom_comm_support", "remove_qsdp"]

_HANDLE_ATTR = "_qsdp_handle"


def check_custom_comm_support() -> None:
    """Raise unless this torch has FSDP2's custom-collective API (torch >= 2.9).

    Raises:
        RuntimeError: naming the installed torch and the version needed.
    """
    if not hasattr(FSDPModule, "set_custom_all_gather"):
        raise RuntimeError(
            f"QSDP needs FSDP2's custom collectives (FSDPModule.set_custom_all_gather), added in torch 2.9; "
            f"this is torch {torch.__version__}. Install torch >= 2.9 (the project pins 2.11.0)."
        )


class QSDPHandle:
    """What :func:`apply_qsdp` installed on a model; reports traffic, checkpoints the seed step, removes it.

    Attributes:
        model: the model QSDP was applied to.
        config: its configuration.
        units: the plan of every FSDP unit that communicates, in unit-index order.
        seeds: the per-step seed schedule (``seeds.step`` = forward passes so far).
    """

    def __init__(self, model: nn.Module, config: QSDPConfig, units: list[UnitPlan]) -> None:
        self.model = model
        self.config = config
        self.units = tuple(units)
        self.seeds = StepSeeds(config.seed)
        self._monitor = WeightFiniteMonitor([u.name for u in units]) if config.check_finite else None
        interval = config.error_sample_interval
        self._all_gathers = [
            QSDPAllGather(u.index, u.weight_codec, self.seeds, interval, self._monitor) for u in units
        ]
        self._reduce_scatters = [QSDPReduceScatter(u.index, u.grad_codec, self.seeds, interval) for u in units]
        self._hook: torch.utils.hooks.RemovableHandle | None = None

    # ------------------------------------------------------------------ install / remove
    def _install(self) -> None:
        for unit, all_gather, reduce_scatter in zip(self.units, self._all_gathers, self._reduce_scatters):
            module: Any = unit.module
            module.set_custom_all_gather(all_gather)
            module.set_custom_reduce_scatter(reduce_scatter)
        # prepend: run before FSDP's own pre-forward hook when the model is itself an FSDP root.
        self._hook = self.model.register_forward_pre_hook(self._on_forward, prepend=True)
        setattr(self.model, _HANDLE_ATTR, self)

    def remove(self) -> None:
        """Restore FSDP's default all-gather and reduce-scatter on every unit and drop the forward hook."""
        from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

        for unit in self.units:
            module: Any = unit.module
            module.set_custom_all_gather(DefaultAllGather())
            module.set_custom_reduce_scatter(DefaultReduceScatter())
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if getattr(self.model, _HANDLE_ATTR, None) is self:
            delattr(self.model, _HANDLE_ATTR)

    def _on_forward(self, module: nn.Module, args: Any) -> None:
        if self._monitor is not None:
            self._monitor.poll()
        self.seeds.advance()

    # ------------------------------------------------------------------ reporting
    def traffic(self) -> TrafficReport:
        """Cumulative bytes sent by this rank (NCCL convention), per side, over all units."""
        return TrafficReport(
            sum((c.traffic for c in self._all_gathers), TrafficCounter()),
            sum((c.traffic for c in self._reduce_scatters), TrafficCounter()),
        )

    def take_quantization_errors(self) -> dict[Side, torch.Tensor]:
        """Mean relative quantization error per side over the units sampled since the previous call.

        Values are 0-dim fp32 device tensors (reading them syncs the host); a side without new samples is
        absent. Units sample every ``config.error_sample_interval`` calls.
        """
        errors: dict[Side, torch.Tensor] = {}
        sides: tuple[tuple[Side, list[Any]], ...] = (("weights", self._all_gathers), ("grads", self._reduce_scatters))
        for side, comms in sides:
            fresh = [e for e in (c.take_error() for c in comms) if e is not None]
            for error in fresh:
                if error.is_cuda:  # made on a comm stream, read on this one: keep its memory until then
                    error.record_stream(torch.cuda.current_stream(error.device))
            if fresh:
                errors[side] = torch.stack(fresh).mean()
        return errors

    def check_finite(self) -> None:
        """Raise if any weight all-gathered so far was non-finite (syncs the host; a no-op if disabled).

        Raises:
            NonFiniteWeightError: naming the units.
        """
        if self._monitor is not None:
            self._monitor.check()

    def describe(self) -> str:
        """One line per FSDP unit: its size and the codec of each side."""
        return "\n".join(u.describe() for u in self.units)

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        """The seed step and the byte counters: save them with the model to resume with identical noise."""
        return {
            "step": self.seeds.step,
            "weights": [c.traffic.state_dict() for c in self._all_gathers],
            "grads": [c.traffic.state_dict() for c in self._reduce_scatters],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output of a handle on the same model structure.

        Raises:
            ValueError: the saved counters are for a different number of FSDP units.
        """
        for key, comms in (("weights", self._all_gathers), ("grads", self._reduce_scatters)):
            if len(state[key]) != len(comms):
                raise ValueError(
                    f"QSDP state has {key} counters for {len(state[key])} FSDP units but this model has "
                    f"{len(comms)}; it was saved from a differently wrapped model"
                )
            for comm, counts in zip(comms, state[key]):
                comm.traffic.load_state_dict(counts)
        self.seeds.step = int(state["step"])


def apply_qsdp(model: nn.Module, config: QSDPConfig | None = None) -> QSDPHandle:
    """Quantize the weight all-gathers and gradient reduce-scatters of every FSDP2 unit of ``model``.

    Call after ``fully_shard`` (on the submodules, then the root) and before the first forward. Installs a
    :class:`~composer_qsdp.fsdp.comms.QSDPAllGather` and :class:`~composer_qsdp.fsdp.comms.QSDPReduceScatter`
    on every unit that communicates (unquantized units get counting pass-through objects), and a forward
    pre-hook on ``model`` that advances the per-step seed and checks for non-finite weights. Checkpoints are
    unaffected: FSDP's sharded parameters stay full precision; only the gathered copies are quantized.

    Args:
        model: a model whose submodules (or itself) were wrapped with ``torch.distributed.fsdp.fully_shard``.
            With Composer, the ``ComposerModel`` (``state.model``).
        config: the quantization settings; ``QSDPConfig()`` (W8G8, stochastic) when ``None``.

    Returns:
        The :class:`QSDPHandle`: traffic counters, ``state_dict`` for resuming, ``remove()``.

    Raises:
        RuntimeError: torch < 2.9.
        ValueError: ``model`` has no FSDP2 unit, or QSDP is already applied to it.
    """
    check_custom_comm_support()
    config = QSDPConfig() if config is None else config
    if not isinstance(config, QSDPConfig):
        raise ValueError(f"config must be a QSDPConfig, got {type(config).__name__}")
    if getattr(model, _HANDLE_ATTR, None) is not None:
        raise ValueError("QSDP is already applied to this model; call remove_qsdp(model) before applying again")
    if not any(isinstance(m, FSDPModule) for m in model.modules()):
        raise ValueError(
            f"{type(model).__name__} has no FSDP2 module: apply torch.distributed.fsdp.fully_shard to its blocks "
            "and root first (FSDP1's FullyShardedDataParallel is not supported)"
        )
    handle = QSDPHandle(model, config, plan_units(model, config))
    handle._install()
    return handle


def remove_qsdp(model: nn.Module) -> None:
    """Undo :func:`apply_qsdp`: FSDP's default collectives again, no forward hook.

    Raises:
        ValueError: QSDP is not applied to ``model``.
    """
    handle = getattr(model, _HANDLE_ATTR, None)
    if handle is None:
        raise ValueError(f"QSDP is not applied to this {type(model).__name__}")
    handle.remove()
