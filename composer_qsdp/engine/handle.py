"""``QSDPHandle``: the running state of QSDP on one model, the same for every framework adapter.

An adapter (FSDP2's comm objects, later FSDP1's hooks or a DDP comm hook) finds the units, builds the handle
and forwards three kinds of events to it: each unit's collectives (:meth:`QSDPHandle.all_gather`,
:meth:`QSDPHandle.reduce_scatter`), the start of every forward pass (:meth:`QSDPHandle.on_forward`) and the
optimizer step (:meth:`QSDPHandle.on_optimizer_step`, wired by :meth:`QSDPHandle.attach_optimizer`, or, where no
optimizer was named, by a global step hook on every ``torch.optim.Optimizer`` that holds one of the model's
parameters). The handle owns the seed schedule, the non-finite weight monitor, error sampling, byte counts and
checkpoint state.

The step boundary cannot be inferred from the parameters: a ``foreach`` update (torch's default optimizer
implementation on CUDA) of FSDP2's DTensor parameters bumps neither their version counters nor their local
tensors'. Weights that change outside an optimizer step (a checkpoint loaded into the model, an in-place edit)
would leave schemes that keep gathered weights (``keeps_weights``) stale: before each quantized gather of such a
unit the handle compares its parameters' version counters (read by the adapter, :meth:`QSDPHandle.weight_versions`:
torch keeps them private) with those of the last step or check and tells its scheme (``on_weights_changed``). The
check sits at the gather, not at the model's forward, because forwards that bypass the model's hooks gather too
(Composer's ``eval_forward``, with weights Composer's EMA swapped in for the evaluation). A change that bypasses
version counters (``param.data.copy_(...)``, a ``foreach`` op) needs :meth:`QSDPHandle.refresh`.

Evaluation can gather the exact weights (:meth:`QSDPHandle.set_weight_gathers`, :meth:`QSDPHandle.exact_weights`):
then every unit's weight all-gather is the framework's own collective on the full-precision shards, so the model
evaluated is the one trained and saved, and the handle's training state (seed schedule, scheme state such as a
weight-difference reference, byte counters of the schemes, the non-finite monitor) is left as if no evaluation had
happened. Its bytes are counted apart (:meth:`QSDPHandle.exact_traffic`) and included in :meth:`QSDPHandle.traffic`.

A checkpoint holds the settings it was written under (the configuration and the world's shape); a handle that
loads one written under other settings (W8G8 -> W4G4, another scheme, another world size) continues with its own
settings and warns with :class:`ResumeSettingsWarning`, naming every setting that changed. Scheme state that
no longer fits is rebuilt (a weight-difference reference becomes a keyframe); the byte counters keep their totals.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from composer_qsdp.comm import StepSeeds, Topology, TrafficCounter, TrafficReport, twin_group
from composer_qsdp.config.settings import EVAL_WEIGHTS, QSDPConfig
from composer_qsdp.engine.finite_check import WeightFiniteMonitor
from composer_qsdp.engine.plan import UnitPlan
from composer_qsdp.engine.speculation import SpeculativeUpdate
from composer_qsdp.schemes import GatherLayout, GradScheme, Scheme, WeightScheme

__all__ = ["QSDPHandle", "ResumeSettingsWarning", "settings_changes"]

_STATE_FORMAT = 2
#: The model attribute that holds the handle QSDP installed on it.
_HANDLE_ATTR = "_qsdp_handle"


class ResumeSettingsWarning(UserWarning):
    """QSDP resumed from a checkpoint written under other settings, or from one without QSDP's state."""


def settings_changes(saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """``"key: saved -> now"`` for every setting that differs (keys dotted, e.g. ``"grads.bits: 8 -> 4"``), in
    key order; a key only one side has shows ``<absent>`` on the other."""
    old, new = _flatten(saved), _flatten(now)
    return [f"{key}: {old.get(key, '<absent>')!r} -> {new.get(key, '<absent>')!r}"
            for key in sorted(old.keys() | new.keys()) if old.get(key, "<absent>") != new.get(key, "<absent>")]


def _resume_changes(saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """The run-wide changes one by one; the units' schemes in one entry (a model has many units, and a changed
    configuration changes most of them)."""
    changes = settings_changes({k: v for k, v in saved.items() if k != "units"},
                               {k: v for k, v in now.items() if k != "units"})
    units = settings_changes(saved.get("units", {}), now.get("units", {}))
    if units:
        changes.append(f"the schemes of {len(units)} of {len(now.get('units', {}))} unit(s), e.g. {units[0]}")
    return changes


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _weak_step_hook(handle: weakref.ref[QSDPHandle]) -> Callable[..., None]:
    """A global optimizer step hook for ``handle``, through a weak reference: the global hooks must not keep a
    dropped model and its handle alive."""

    def hook(optimizer: torch.optim.Optimizer, *_: Any) -> None:
        alive = handle()
        if alive is not None:
            alive._on_any_step(optimizer)

    return hook


class QSDPHandle:
    """What QSDP installed on a model: the units' schemes and the state shared by their collectives.

    Attributes:
        model: the model QSDP was applied to.
        config: its configuration.
        units: the plan of every unit that communicates, in unit-index order.
        topology: the run's topology.
        seeds: the seed schedule (optimizer step, microbatch).
        adapter: which adapter installed the handle and how it reaches the framework's collectives (for logs; set
            by the adapter, e.g. ``"fsdp2 (custom): ..."``).
        layout_of: ``layout_of(unit_index)``, the unit's :class:`GatherLayout`, for schemes that keep gathered
            weights and are chosen after setup (:meth:`reconfigure`); given to :meth:`install` by adapters that have
            layouts.
        wire_dtypes: the dtype of the latest all-gather (``"weights"``) and reduce-scatter (``"grads"``) input:
            what the framework actually sends, for measurements that must send the same.
        resume_changes: the settings that differ from those of the checkpoint last loaded (``"key: old -> new"``;
            empty when none did, or before a load).
        speculation: the speculative update (the config's ``speculative_update``), else ``None``.
    """

    adapter: str = ""
    layout_of: Callable[[int], GatherLayout] | None = None

    def __init__(self, model: nn.Module, config: QSDPConfig, units: Sequence[UnitPlan], topology: Topology) -> None:
        self.model = model
        self.config = config
        self.units = tuple(units)
        self.topology = topology
        self.seeds = StepSeeds(config.seed)
        self._monitor = WeightFiniteMonitor([u.name for u in units]) if config.check_finite else None
        self._optimizer_hooks: list[torch.utils.hooks.RemovableHandle] = []
        self._any_step_hook: torch.utils.hooks.RemovableHandle | None = None
        self._versions = self._current_versions()
        self.wire_dtypes: dict[str, torch.dtype] = {}
        self.resume_changes: list[str] = []
        self._forward_hook: torch.utils.hooks.RemovableHandle | None = None
        self._weight_gathers = "quantized"
        self._exact_traffic = TrafficCounter()
        self._optimizers: list[torch.optim.Optimizer] = []
        self.speculation: SpeculativeUpdate | None = None

    # ------------------------------------------------------------------ the model it is applied to
    @staticmethod
    def applied(model: nn.Module) -> QSDPHandle | None:
        """The handle QSDP installed on ``model`` (by any adapter), or ``None``."""
        return getattr(model, _HANDLE_ATTR, None)

    @staticmethod
    def check_not_applied(model: nn.Module) -> None:
        """Raise unless ``model`` is free of QSDP (one handle per model, whichever adapter).

        Raises:
            ValueError: QSDP is already applied to ``model``.
        """
        if QSDPHandle.applied(model) is not None:
            raise ValueError("QSDP is already applied to this model; call remove_qsdp(model) before applying again")

    @staticmethod
    def remove_from(model: nn.Module) -> None:
        """Remove the handle applied to ``model`` (its adapter restores the framework's collectives).

        Raises:
            ValueError: QSDP is not applied to ``model``.
        """
        handle = QSDPHandle.applied(model)
        if handle is None:
            raise ValueError(f"QSDP is not applied to this {type(model).__name__}")
        handle.remove()

    def install(
        self,
        groups: Sequence[dist.ProcessGroup],
        layout_of: Callable[[int], GatherLayout] | None = None,
        optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None = None,
    ) -> None:
        """Put the handle to work on its model (collective: every rank, same order). Adapters call it once, right
        after constructing the handle: it sets up every unit's schemes on the unit's process group (the gradient
        scheme on that group's twin, :func:`~composer_qsdp.comm.twin_group`, with the config's
        ``separate_grad_group``), hooks the optimizers' steps, routes the framework's collectives to
        :meth:`all_gather` and :meth:`reduce_scatter` (the adapter's :meth:`install_collectives`), and registers on
        the model: a forward pre-hook that marks each microbatch (:meth:`on_forward`), prepended so that it runs
        before the pre-forward hook of a model that is itself an FSDP root (which gathers weights), and the model
        attribute :meth:`applied` reads.

        Args:
            groups: each unit's process group, in unit-index order.
            layout_of: ``layout_of(unit_index)``, the unit's :class:`GatherLayout`, where the adapter has them:
                schemes that keep gathered weights need one, at setup and at :meth:`reconfigure`.
            optimizers: the optimizer(s) whose steps are the step boundary (:meth:`attach_optimizer`); ``None``:
                the step of any ``torch.optim.Optimizer`` holding one of the model's parameters (a global step
                hook, until :meth:`attach_optimizer` names the optimizers). Updates that are no optimizer's
                ``step()`` call :meth:`on_optimizer_step` themselves.
        """
        self.layout_of = layout_of
        for unit, group in zip(self.units, groups, strict=True):
            needs_layout = unit.weights.needs_layout and layout_of is not None
            unit.weights.setup(group, self.topology, layout_of(unit.index) if needs_layout else None)
            unit.grads.setup(twin_group(group) if self.config.separate_grad_group else group, self.topology)
        if self.config.speculative_update and type(self).gather_input is QSDPHandle.gather_input:
            raise self._no_speculation()
        if self.config.speculative_update and optimizers is None:
            raise ValueError("speculative_update computes each unit's update ahead with its optimizer: name the "
                             "optimizers (apply_qsdp(model, config, optimizers=...)); Composer's QSDP does")
        if optimizers is not None:
            self.attach_optimizer(optimizers)
        else:
            self._any_step_hook = register_optimizer_step_post_hook(_weak_step_hook(weakref.ref(self)))
        if self.config.speculative_update:
            self.speculation = SpeculativeUpdate(self.units, self.seeds, self.unit_parameters, self.gather_input,
                                                 self._optimizers)
        self.install_collectives(groups)
        self._forward_hook = self.model.register_forward_pre_hook(lambda *_: self.on_forward(), prepend=True)
        setattr(self.model, _HANDLE_ATTR, self)

    def unit_parameters(self, unit_index: int) -> Sequence[torch.Tensor]:
        """Unit ``unit_index``'s sharded parameters in the order of its all-gather input; adapters that support the
        speculative update override it (and :meth:`gather_input`).

        Raises:
            ValueError: this adapter does not support the speculative update.
        """
        raise self._no_speculation()

    def gather_input(self, unit_index: int, shards: Sequence[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        """This rank's all-gather input of unit ``unit_index`` as the framework builds it from the local ``shards``
        of :meth:`unit_parameters` (in that order), in ``dtype``; see :meth:`unit_parameters`."""
        raise self._no_speculation()

    def _no_speculation(self) -> ValueError:
        return ValueError(f"speculative_update is not supported by {self.adapter or type(self).__name__}: it needs "
                          "FSDP2 (composer_qsdp.fsdp2.apply_qsdp)")

    def install_collectives(self, groups: Sequence[dist.ProcessGroup]) -> None:
        """The adapter's part of :meth:`install`: make each unit's framework collectives call :meth:`all_gather`
        and :meth:`reduce_scatter` with the unit's index. Adapters override it (and :meth:`remove`, to undo it).

        Args:
            groups: each unit's process group, in unit-index order.
        """
        raise NotImplementedError(f"{type(self).__name__} installs no collectives: an adapter's handle overrides "
                                  "install_collectives")

    # ------------------------------------------------------------------ events from the adapter
    def all_gather(
        self,
        unit_index: int,
        output: torch.Tensor,
        input: torch.Tensor,
        group: dist.ProcessGroup | None = None,
        async_op: bool = False,
    ) -> dist.Work | None:
        """Unit ``unit_index``'s weight all-gather (semantics of ``all_gather_into_tensor``).

        A unit whose weights QSDP leaves unquantized (a passthrough scheme) runs the framework's collective as the
        framework would, ``async_op`` included, and nothing else: no seed, no non-finite check (its weights are
        the framework's own, where a NaN stays a NaN). A quantized gather runs on the current stream. Under
        :meth:`set_weight_gathers` ``("exact")`` every unit runs the framework's collective on its exact shard
        (:meth:`~composer_qsdp.schemes.WeightScheme.exact_all_gather`), counted in :meth:`exact_traffic` only.

        Returns:
            The collective's ``Work`` for an unquantized or exact gather with ``async_op``, else ``None``.
        """
        weights = self.units[unit_index].weights
        self.wire_dtypes["weights"] = input.dtype
        if self._weight_gathers == "exact":
            traffic, work = weights.exact_all_gather(output, input, group, async_op)
            self._exact_traffic.add(traffic)
            return work
        if weights.passthrough:
            return weights.plain_all_gather(output, input, group, async_op)
        if unit_index in self._versions:
            self._check_versions(unit_index)
        weights.all_gather(output, input, self.seeds.seed(unit_index, weights.seed_stream), group)
        if self._monitor is not None and output.is_floating_point():
            self._monitor.record(unit_index, output)
        return None

    def secondary_all_gather(self, unit_index: int, output: torch.Tensor, input: torch.Tensor,
                             group: dist.ProcessGroup) -> None:
        """Unit ``unit_index``'s re-gather of the secondary weight shard FSDP2 keeps after a forward under
        ``reshard_after_forward=<int>`` (:meth:`~composer_qsdp.schemes.WeightScheme.secondary_all_gather`); under
        :meth:`set_weight_gathers` ``("exact")`` its bytes go to :meth:`exact_traffic`, not to the scheme."""
        weights = self.units[unit_index].weights
        if self._weight_gathers == "exact":
            self._exact_traffic.add(weights.secondary_all_gather(output, input, group, count=False))
        else:
            weights.secondary_all_gather(output, input, group)

    def reduce_scatter(
        self,
        unit_index: int,
        output: torch.Tensor,
        input: torch.Tensor,
        op: dist.ReduceOp | dist.ReduceOp.RedOpType,
        group: dist.ProcessGroup | None = None,
        async_op: bool = False,
    ) -> dist.Work | None:
        """Unit ``unit_index``'s gradient reduce-scatter (semantics of ``reduce_scatter_tensor``, except that
        ``input`` may be overwritten: both adapters pass FSDP's scratch buffer, which FSDP itself divides in place).

        Unquantized gradients (a passthrough scheme) run the framework's collective as the framework would,
        ``async_op`` and ``op`` included, and nothing else; a quantized reduce-scatter runs on the current stream.
        With the config's ``separate_grad_group`` either runs on the twin of ``group`` instead.

        Returns:
            The collective's ``Work`` for an unquantized reduce-scatter with ``async_op``, else ``None``.
        """
        grads = self.units[unit_index].grads
        self.wire_dtypes["grads"] = input.dtype
        if self.config.separate_grad_group:
            group = grads.group  # the twin it was set up on
        if grads.passthrough:
            work = grads.plain_reduce_scatter(output, input, op, group, async_op)
        else:
            grads.reduce_scatter(output, input, op, self.seeds.seed(unit_index, grads.seed_stream), group,
                                 overwrite_input=True)
            work = None
        if self.speculation is not None:  # after this unit's collective is queued: the link goes first
            self.speculation.on_reduce_scatter(unit_index)
        return work

    def on_forward(self) -> None:
        """A forward pass of the model begins: report non-finite weights seen so far, start a new microbatch.

        Under :meth:`set_weight_gathers` ``("exact")`` it does nothing: an evaluation's forward is no microbatch of
        the seed schedule, and the weights it reads are not training's.

        Raises:
            NonFiniteWeightError: naming the units whose all-gathered weights were non-finite.
        """
        if self._weight_gathers == "exact":
            return
        if self._monitor is not None:
            self._monitor.poll()
        self.seeds.begin_microbatch()

    def _check_versions(self, unit_index: int) -> None:
        """Before a quantized gather of a unit whose scheme keeps gathered weights: tell the scheme if its weights
        changed in place since the last optimizer step or check (module docstring)."""
        now = self.weight_versions(self.units[unit_index].params)
        if now != self._versions[unit_index]:
            self.units[unit_index].weights.on_weights_changed()
            self._versions[unit_index] = now

    # ------------------------------------------------------------------ exact weights for evaluation
    @property
    def weight_gathers(self) -> str:
        """The current weight all-gather mode, ``"quantized"`` or ``"exact"`` (see :meth:`set_weight_gathers`)."""
        return self._weight_gathers

    def set_weight_gathers(self, mode: str) -> str:
        """Choose what the weight all-gathers send from now on; returns the previous mode.

        ``"quantized"`` (the default, training): each unit's scheme, as in training. ``"exact"``: every unit's
        weight all-gather is the framework's own collective on its full-precision shard
        (:meth:`~composer_qsdp.schemes.WeightScheme.exact_all_gather`), quantized units included, so a forward
        computes what plain FSDP computes with the same weights. For evaluation: in ``"exact"`` mode nothing of the
        training state moves, so training after it continues bit for bit as if no evaluation had happened: no
        seed is drawn and the microbatch counter does not advance (:meth:`on_forward` does nothing), no scheme is
        called (a weight-difference reference, LoCo residuals, learned levels and the schemes' byte counters stay
        as they are), the non-finite monitor records nothing (the gathered weights are the framework's own), and
        weight versions are not compared. Its bytes (in the gathered dtype, as plain FSDP sends: bf16 under bf16
        mixed precision) are counted in :meth:`exact_traffic`, which :meth:`traffic` includes on the weight side.
        Gradients are untouched: a backward in ``"exact"`` mode reduce-scatters as in training.

        A change of mode also releases any weights a unit still holds gathered (the adapter's
        :meth:`release_gathered_weights`: FSDP keeps the root unit's weights gathered after a forward without a
        backward, and a later forward would reuse them), so that no forward computes with the other mode's
        weights.

        Call it between forward passes (not inside one), on every rank alike: the gathers are collectives.

        Args:
            mode: ``"quantized"`` or ``"exact"``.

        Raises:
            ValueError: another mode, naming the allowed ones.
        """
        if mode not in EVAL_WEIGHTS:  # the same two modes as an evaluator's QSDPConfig.eval_weights
            raise ValueError(f"weight gather mode {mode!r} is invalid; allowed: {', '.join(map(repr, EVAL_WEIGHTS))}")
        previous, self._weight_gathers = self._weight_gathers, mode
        if mode != previous:
            self.release_gathered_weights()
        return previous

    @contextlib.contextmanager
    def exact_weights(self) -> Iterator[QSDPHandle]:
        """``with handle.exact_weights(): evaluate(model)``: :meth:`set_weight_gathers` ``("exact")`` inside, the
        previous mode restored on exit, an exception included."""
        previous = self.set_weight_gathers("exact")
        try:
            yield self
        finally:
            self.set_weight_gathers(previous)

    def exact_traffic(self) -> TrafficCounter:
        """Bytes this rank sent in weight all-gathers under :meth:`set_weight_gathers` ``("exact")``, cumulative
        (resumes included): unquantized, so ``sent`` equals ``native`` and ``bf16`` counts what bf16 would send."""
        return self._exact_traffic

    def release_gathered_weights(self) -> None:
        """Free the gathered weights of every unit that still holds them, so that its next forward gathers again.
        Adapters override it with their framework's reshard; the base has nothing to release."""

    def on_optimizer_step(self) -> None:
        """The optimizer has updated the weights: the step boundary of every scheme and of the seeds (and, with the
        speculative update, the verdict on this step's guesses: collective over the default group)."""
        if self.speculation is not None:
            self.speculation.after_step()
        self.seeds.end_optimizer_step()
        for scheme in self._schemes():
            scheme.on_optimizer_step()
        if self.speculation is not None:
            self.speculation.settle()
        self._versions = self._current_versions()

    def reconfigure(self, schemes: Sequence[tuple[WeightScheme | None, GradScheme | None]]) -> None:
        """Replace the units' schemes: ``schemes[i]`` is unit ``i``'s new ``(weights, grads)``, ``None`` keeps a
        side's scheme. Collective: every rank calls it with the same choices, in the same place.

        Call it only at an optimizer-step boundary (after ``step()``, before the next forward): a step's forward
        and backward gathers must see one scheme, and so must every microbatch of an accumulated step. New
        schemes are set up on the unit's process group (and layout, for schemes that keep weights) and continue
        the old schemes' byte counters; state of the old schemes (a weight-difference reference) is dropped, so a
        new difference scheme starts with a full-precision keyframe.

        Args:
            schemes: one pair per unit, new and not set up.

        Raises:
            ValueError: not one pair per unit, a scheme already set up, or a scheme that needs a gather layout
                where the adapter gives none; nothing is changed then.
        """
        if len(schemes) != len(self.units):
            raise ValueError(f"reconfigure needs one (weights, grads) pair per unit: {len(self.units)}, got "
                             f"{len(schemes)}")
        for unit, (weights, grads) in zip(self.units, schemes):
            if any(s is not None and s.group is not None for s in (weights, grads)):
                raise ValueError(f"unit {unit.name or '<root>'}: reconfigure needs new schemes, not set-up ones")
            if weights is not None and weights.needs_layout and self.layout_of is None:
                raise ValueError(f"unit {unit.name or '<root>'}: the {weights.name} weight scheme needs the unit's "
                                 f"gather layout, which this adapter ({self.adapter or 'unknown'}) does not give")
        units = []
        for unit, (weights, grads) in zip(self.units, schemes):
            if weights is not None:
                layout = self.layout_of(unit.index) if weights.needs_layout else None  # type: ignore[misc]
                weights.setup(unit.weights.group, unit.weights.topology, layout)
                weights.traffic = unit.weights.traffic  # the run's byte counts continue
            if grads is not None:
                grads.setup(unit.grads.group, unit.grads.topology)
                grads.traffic = unit.grads.traffic
            units.append(dataclasses.replace(unit, weights=weights or unit.weights, grads=grads or unit.grads))
        self.units = tuple(units)
        self._versions = self._current_versions()

    def refresh(self) -> None:
        """Weights changed in a way version counters do not show (``param.data`` edits): schemes that keep
        gathered weights rebuild them at the next gather (a full-precision keyframe)."""
        for unit_index in self._versions:
            self.units[unit_index].weights.on_weights_changed()

    def attach_optimizer(self, optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer]) -> None:
        """Call :meth:`on_optimizer_step` after every ``step()`` of ``optimizers`` (a step-post hook each).

        A step a gradient scaler skips is no step: the weights did not change, so neither does QSDP's state.

        Raises:
            ValueError: something that is not a ``torch.optim.Optimizer``.
        """
        optimizers = [optimizers] if isinstance(optimizers, torch.optim.Optimizer) else list(optimizers)
        for optimizer in optimizers:
            if not isinstance(optimizer, torch.optim.Optimizer):
                raise ValueError(f"optimizers must be torch.optim.Optimizer objects, got {type(optimizer).__name__}")
        self._remove_any_step_hook()
        self._optimizers.extend(optimizers)
        for optimizer in optimizers:
            self._optimizer_hooks.append(optimizer.register_step_post_hook(lambda *_: self.on_optimizer_step()))
            if self.config.speculative_update:
                self._optimizer_hooks.append(optimizer.register_step_pre_hook(lambda *_: self.on_backward_end()))

    def on_backward_end(self) -> None:
        """Every microbatch of the step has run its backward: with the speculative update, the last unit's guess
        goes out now. The optimizer's step pre-hook does the same; a framework whose ``step`` runs the backward in a
        closure (Composer) calls this after it."""
        if self.speculation is not None:
            self.speculation.flush()

    def _on_any_step(self, optimizer: torch.optim.Optimizer) -> None:
        model_params = {id(p) for p in self.model.parameters()}
        if any(id(p) in model_params for group in optimizer.param_groups for p in group["params"]):
            self.on_optimizer_step()

    def _remove_any_step_hook(self) -> None:
        if self._any_step_hook is not None:
            self._any_step_hook.remove()
            self._any_step_hook = None

    def remove(self) -> None:
        """Detach from the optimizers and the model; adapters also restore their framework's collectives."""
        self._remove_any_step_hook()
        for hook in self._optimizer_hooks:
            hook.remove()
        self._optimizer_hooks.clear()
        if self._forward_hook is not None:
            self._forward_hook.remove()
            self._forward_hook = None
        if QSDPHandle.applied(self.model) is self:
            delattr(self.model, _HANDLE_ATTR)

    # ------------------------------------------------------------------ reporting
    def traffic(self) -> TrafficReport:
        """Cumulative bytes sent by this rank (NCCL convention), per side and per hop, over all units; the weight
        side includes the exact gathers of evaluations (:meth:`exact_traffic`)."""
        return TrafficReport(
            sum((u.weights.traffic for u in self.units), self._exact_traffic),
            sum((u.grads.traffic for u in self.units), TrafficCounter()),
        )

    def take_quantization_errors(self) -> dict[str, torch.Tensor]:
        """Mean relative quantization error per side (``"weights"``, ``"grads"``) over the units sampled since
        the previous call.

        Values are 0-dim fp32 device tensors (reading them syncs the host); a side without new samples is
        absent. Units sample every ``config.error_sample_interval`` calls.
        """
        errors: dict[str, torch.Tensor] = {}
        for side, schemes in (("weights", [u.weights for u in self.units]), ("grads", [u.grads for u in self.units])):
            fresh = [e for e in (s.take_error() for s in schemes) if e is not None]
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

    def nonfinite_units(self) -> list[str]:
        """Names of the units whose full-precision (sharded) parameters hold a NaN or Inf on any rank: what a
        checkpoint would save. Collective over the default process group (every rank calls it; one host sync).
        """
        flags = []
        for unit in self.units:
            flag = torch.zeros((), dtype=torch.bool, device=unit.params[0].device)
            for param in unit.params:
                local = param.to_local() if hasattr(param, "to_local") else param
                if local.numel():
                    low, high = torch.aminmax(local.detach())
                    flag |= ~(torch.isfinite(low) & torch.isfinite(high))
            flags.append(flag)
        if not flags:
            return []
        found = torch.stack(flags).to(torch.uint8)
        if dist.is_initialized():
            dist.all_reduce(found, op=dist.ReduceOp.MAX)
        return [unit.name or "<root>" for unit, bad in zip(self.units, found.tolist()) if bad]

    def memory_bytes(self) -> int:
        """Device memory the schemes keep between steps (bytes per rank), e.g. weight-difference references."""
        return sum(s.memory_bytes() for s in self._schemes())

    def host_memory_bytes(self) -> int:
        """Host memory the schemes keep between steps in place of device memory (bytes per rank), e.g. a
        weight-difference reference kept on the host."""
        return sum(s.host_memory_bytes() for s in self._schemes())

    def describe(self) -> str:
        """The adapter (when set), then one line per unit: its size and each side's scheme."""
        lines = [u.describe() for u in self.units]
        return "\n".join([self.adapter, *lines] if self.adapter else lines)

    # ------------------------------------------------------------------ checkpointing
    def settings(self) -> dict[str, Any]:
        """What a checkpoint records of how it was written: the configuration (:meth:`QSDPConfig.summary`'s keys),
        ``world_size``, ``ranks_per_node`` and ``units`` (each unit's schemes, :meth:`UnitPlan.describe`), as plain
        values."""
        world = dist.get_world_size() if dist.is_initialized() else 1
        return {**self.config.summary(), "world_size": world,
                "ranks_per_node": self.topology.ranks_per_node,
                "units": {u.name or "<root>": u.describe().partition(": ")[2] for u in self.units}}

    def state_dict(self) -> dict[str, Any]:
        """The seed schedule, every scheme's state (byte counters, references...), the speculative update's counts
        and the :meth:`settings`: save it with the model so a resumed run continues exactly (or says what
        changed)."""
        return {
            "format": _STATE_FORMAT,
            "settings": self.settings(),
            "seeds": self.seeds.state_dict(),
            "units": [{"weights": u.weights.state_dict(), "grads": u.grads.state_dict()} for u in self.units],
            "exact_traffic": self._exact_traffic.state_dict(),
            **({"speculation": self.speculation.state_dict()} if self.speculation is not None else {}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output of a handle on the same model structure.

        Also reads the first format (``{"step", "weights", "grads"}``: a forward counter and byte counters).

        A state written under other :meth:`settings` (bits, codecs, schemes, world size...) loads too: the handle
        keeps its own settings, each scheme takes what still fits (a weight-difference reference saved by another
        scheme, or not at all, means a full-precision keyframe at the next gather), the byte counters keep the
        saved totals, and a :class:`ResumeSettingsWarning` names every change (also kept in
        :attr:`resume_changes`).

        Raises:
            ValueError: the state is for a different number of units, naming both counts.
        """
        if state.get("format") != _STATE_FORMAT:  # the first format: a forward-pass counter, counters per side
            state = {
                "seeds": {"optimizer_step": 0, "microbatch": int(state["step"])},
                "units": [{"weights": {"traffic": w}, "grads": {"traffic": g}}
                          for w, g in zip(state["weights"], state["grads"], strict=True)],
            }
        if len(state["units"]) != len(self.units):
            raise ValueError(
                f"QSDP state has {len(state['units'])} units but this model has {len(self.units)}; it was saved "
                "from a differently wrapped model"
            )
        self.resume_changes = _resume_changes(state["settings"], self.settings()) if "settings" in state else []
        if self.resume_changes:
            # The totals stay cumulative (true bytes sent over the whole run); the per-batch metrics computed from
            # their differences reflect the new settings from the first new batch on.
            warnings.warn(
                "QSDP resumes from a checkpoint written under other settings and continues with the new ones: "
                + "; ".join(self.resume_changes) + ". Scheme state that does not fit the new settings is rebuilt; "
                "the byte counters keep the checkpoint's totals (bytes sent under the old settings included), and "
                "the per-batch byte metrics reflect the new settings.", ResumeSettingsWarning, stacklevel=2)
        for unit, saved in zip(self.units, state["units"]):
            unit.weights.load_state_dict(saved["weights"])
            unit.grads.load_state_dict(saved["grads"])
        self.seeds.load_state_dict(state["seeds"])
        self._exact_traffic = TrafficCounter()
        if "exact_traffic" in state:  # absent from checkpoints written before exact evaluation
            self._exact_traffic.load_state_dict(state["exact_traffic"])
        if self.speculation is not None and "speculation" in state:  # else it starts counting at this resume
            self.speculation.load_state_dict(state["speculation"])
        # The saved state belongs to the weights loaded with it (load the model first, then QSDP's state).
        self._versions = self._current_versions()

    def _schemes(self) -> list[Scheme]:
        return [s for u in self.units for s in (u.weights, u.grads)]

    def weight_versions(self, params: Sequence[torch.Tensor]) -> tuple[int, ...]:
        """The version counters of a unit's ``params``, which every in-place change of the weights advances.

        Adapters override it with their framework's reader (the counters are private to torch, so each adapter
        reads them in its compat module). The base reads none (an empty tuple): it sees weight changes only at
        optimizer steps and :meth:`refresh`.
        """
        return ()

    def _current_versions(self) -> dict[int, tuple[int, ...]]:
        """The version counters of every unit whose scheme keeps gathered weights, by unit index."""
        return {i: self.weight_versions(u.params) for i, u in enumerate(self.units) if u.weights.keeps_weights}
