"""0/1 Adam as a Composer algorithm: a DDP run whose optimizer communicates 1 bit per element, and rarely."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable
from typing import Any

import torch
from composer.algorithms import GradientClipping
from composer.core import Algorithm, Event, Precision, State, Time, TimeUnit
from composer.loggers import Logger
from composer.optim import DecoupledAdamW
from composer.utils import dist
from torch.nn.parallel import DistributedDataParallel

from composer_qsdp.comm import TrafficCounter, TrafficReport
from composer_qsdp.ddp import LocalGradients, apply_zero_one_adam
from composer_qsdp.optim import SchedulePlan, ZeroOneAdam

__all__ = ["ZeroOneAdamDDP", "planned_ratio", "to_zero_one_adam"]


def _duration(name: str, value: str) -> Time:
    """A duration option given as a Composer time string: batches (``"100ba"``) or a fraction of the run
    (``"0.05dur"``)."""
    try:
        duration = Time.from_timestring(value)
    except ValueError as e:
        raise ValueError(f"{name}={value!r} is invalid; it must be an integer of steps, or a duration in batches "
                         "('100ba') or as a fraction of the run ('0.05dur')") from e
    if duration.unit not in (TimeUnit.BATCH, TimeUnit.DURATION) or not duration.value > 0:
        raise ValueError(f"{name}={value!r} is invalid; allowed units: ba (batches), dur (fraction of max_duration), "
                         "with a value > 0")
    return duration


def _batches(duration: Time, state: State, name: str) -> int:
    """``duration`` in optimizer steps (batches) of ``state``'s run."""
    if duration.unit == TimeUnit.BATCH:
        return int(duration.value)
    if duration.unit == TimeUnit.EPOCH and state.dataloader_len is not None:
        return int(duration.value) * int(state.dataloader_len)
    raise ValueError(f"0/1 Adam needs {name} in batches (or epochs of a sized dataloader) to place its schedule, "
                     f"got {duration}")

log = logging.getLogger(__name__)

#: The options of ZeroOneAdam the algorithm sets when it builds the optimizer.
OPTIONS = ("var_freeze_step", "var_update_scaler", "local_step_scaler", "local_step_clipper", "bias_correction",
           "max_grad_norm", "bound_updates", "codec", "variance_codec", "variance_rescale", "bucket_size",
           "ranks_per_node")
#: The options that may be durations of the run (resolved against ``max_duration`` at ``Event.FIT_START``).
DURATIONS = ("var_freeze_step", "local_step_scaler")


def planned_ratio(optimizer: ZeroOneAdam, plan: SchedulePlan) -> float:
    """DDP's fp32 all-reduce bytes over ``plan``'s run divided by what ``optimizer`` is expected to send (its 1-bit
    codec, its variance updates' codec and ``variance_rescale``'s statistics)."""
    return plan.ratio_vs_fp32(optimizer.bits_per_element, optimizer.variance_bits_per_element,
                              optimizer.stats_bits_per_element)


def to_zero_one_adam(optimizer: torch.optim.Optimizer, **options: Any) -> ZeroOneAdam:
    """A :class:`~composer_qsdp.optim.ZeroOneAdam` over ``optimizer``'s parameter groups, with their learning rates,
    betas, eps and the same weight decay per step.

    Composer's ``DecoupledAdamW`` multiplies the weights by ``1 - wd * lr / initial_lr``; ZeroOneAdam (as AdamW) by
    ``1 - lr * wd``, so its ``weight_decay`` becomes ``wd / initial_lr``. torch's ``AdamW`` carries over as is, and
    ``Adam`` without weight decay (its weight decay is an L2 term in the gradient, which 0/1 Adam does not have).

    Args:
        optimizer: a fresh (never stepped) ``DecoupledAdamW``, ``torch.optim.AdamW`` or ``torch.optim.Adam``.
        **options: ZeroOneAdam's own options (``var_freeze_step``, ``local_step_clipper``, ...).

    Raises:
        ValueError: another optimizer, one with state, AMSGrad or ``maximize``, or Adam's L2 weight decay.
    """
    kind = type(optimizer).__name__
    if not isinstance(optimizer, torch.optim.Adam):
        raise ValueError(f"0/1 Adam replaces an Adam optimizer, got {kind}; allowed: composer.optim.DecoupledAdamW, "
                         "torch.optim.AdamW, torch.optim.Adam, or pass a composer_qsdp.optim.ZeroOneAdam yourself")
    if any(optimizer.state.values()):
        raise ValueError(f"the {kind} optimizer has state from earlier steps, which 0/1 Adam would drop; pass a fresh "
                         "optimizer, or a ZeroOneAdam")
    groups = []
    for index, group in enumerate(optimizer.param_groups):
        for flag in ("amsgrad", "maximize"):
            if group.get(flag):
                raise ValueError(f"{kind} parameter group {index} has {flag}=True; 0/1 Adam supports neither")
        wd = group["weight_decay"]
        if isinstance(optimizer, DecoupledAdamW) and wd:
            if not group["initial_lr"]:
                raise ValueError(f"DecoupledAdamW parameter group {index} has weight_decay={wd} with initial_lr=0: "
                                 "its decay does not scale with the learning rate, which 0/1 Adam's does")
            wd = wd / group["initial_lr"]
        elif not isinstance(optimizer, torch.optim.AdamW) and wd:
            raise ValueError(f"Adam parameter group {index} has weight_decay={wd} (an L2 term in the gradient); 0/1 "
                             "Adam decays decoupled, as AdamW: use AdamW or DecoupledAdamW, or weight_decay=0")
        groups.append({"params": group["params"], "lr": group["lr"], "betas": tuple(group["betas"]),
                       "eps": group["eps"], "weight_decay": wd})
    return ZeroOneAdam(groups, **options)


class ZeroOneAdamDDP(Algorithm):
    """Train a Composer DDP run with 0/1 Adam (Lu et al., ICLR 2023): DDP all-reduces nothing, the optimizer
    synchronizes the replicas with a 1-bit error-feedback all-reduce, freezes Adam's variance adaptively and, after
    ``var_freeze_step``, skips synchronizations with local steps.

    At ``Event.INIT`` it replaces the run's optimizer (``DecoupledAdamW``, ``AdamW`` or ``Adam``) by a
    :class:`~composer_qsdp.optim.ZeroOneAdam` with its learning rates, betas, eps and weight decay and the options
    given here (before Composer builds the schedulers and loads checkpoints, which therefore hold ZeroOneAdam's
    state); a run built with a ``ZeroOneAdam`` keeps it (give the options to the optimizer then). At
    ``Event.FIT_START``, once Composer has wrapped the model in ``DistributedDataParallel``, it registers the comm
    hook that keeps local gradients, and turns duration options into steps of the run (logging the run's plan and
    warning about schedules that never freeze or leave the steps unbounded). After every step's backward passes it
    checks that DDP used the hook. Logs the bytes sent and the schedule at every ``BATCH_END``.

    Example::

        from composer import Trainer
        from composer.optim import DecoupledAdamW
        from composer_qsdp.algorithms.zero_one_adam import ZeroOneAdamDDP

        trainer = Trainer(model=model, optimizers=DecoupledAdamW(model.parameters(), lr=6e-4),
                          algorithms=[ZeroOneAdamDDP(var_freeze_step=100)], ...)  # no FSDP: DDP
        trainer.fit()

    Args:
        var_freeze_step: the last step that may update Adam's variance; the end of the LR warm-up, as in the paper
            (ZeroOneAdam's default: 100000). Steps, or a duration: ``"100ba"``, or ``"0.1dur"`` of ``max_duration``.
        var_update_scaler: variance updates between doublings of the variance interval (default 16).
        local_step_scaler: local-phase steps between doublings of the synchronization interval (default 32678);
            steps or a duration, as ``var_freeze_step``.
        local_step_clipper: the largest synchronization interval (default 16).
        max_grad_norm: gradient-norm clipping in the optimizer (default: a run's ``GradientClipping`` threshold,
            which the algorithm takes over at ``Event.INIT``; None without one).
        bound_updates: bound each element's Adam step (default True; see ZeroOneAdam).
        bias_correction: Adam's bias corrections (default False, DeepSpeed's update; True matches AdamW's).
        codec: the compressor, ``"sign"`` (default) or ``None`` for exact fp32 synchronizations.
        variance_codec: the codec of the variance updates' all-reduce (default None: fp32), e.g. ``"symmetric"``
            (8 bits, about a quarter of the bytes); see ZeroOneAdam.
        variance_rescale: scale the frozen variance per bucket by the change of the synchronized squared gradients
            since the last variance update (default False); see ZeroOneAdam.
        bucket_size: elements per codec scale (default: at most 256 and a divisor of every matrix's rows).
        ranks_per_node: ranks sharing a node, for the per-hop byte count (default: ``LOCAL_WORLD_SIZE``).

    Raises:
        ValueError: at construction, an option out of range (naming it); at ``Event.INIT``, FSDP or tensor
            parallelism, ``amp_fp16`` precision, several optimizers, an optimizer it cannot convert, options
            given while the run's optimizer already is a ZeroOneAdam, a ``GradientClipping`` other than one by
            norm, or one together with ``max_grad_norm``; at ``Event.FIT_START``, a ``max_duration`` not in batches
            (or epochs of a sized dataloader) when a duration option needs it.
        RuntimeError: at ``Event.FIT_START``, a multi-process model that Composer did not wrap in DDP; after a
            step's backward passes, gradients that DDP synchronized without the hook (``ddp_sync_strategy=
            'forced_sync'``).
    """

    def __init__(self, **options: Any) -> None:
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise ValueError(f"unknown ZeroOneAdamDDP option(s) {', '.join(unknown)}; allowed: {', '.join(OPTIONS)}")
        self.options = options
        self._durations = {k: _duration(k, options[k]) for k in DURATIONS if isinstance(options.get(k), str)}
        checked = {**options, **{k: 1 for k in self._durations}}
        ZeroOneAdam([torch.nn.Parameter(torch.zeros(1))], **checked)  # the optimizer's checks, now
        self.optimizer: ZeroOneAdam | None = None
        self._hook: LocalGradients | None = None
        self._installed = False
        self._logged = TrafficCounter()

    def __repr__(self) -> str:
        return f"ZeroOneAdamDDP({', '.join(f'{k}={v!r}' for k, v in self.options.items())})"

    def match(self, event: Event, state: State) -> bool:
        if event == Event.INIT:
            return True
        if event == Event.FIT_START:
            return self.optimizer is not None and not self._installed
        if event == Event.AFTER_TRAIN_BATCH:
            return self._hook is not None
        return event == Event.BATCH_END and self.optimizer is not None

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        if event == Event.INIT:
            self._init(state, logger)
        elif event == Event.FIT_START:
            self._install(state)
        elif event == Event.AFTER_TRAIN_BATCH:
            assert self._hook is not None
            self._hook.end_step()
        else:
            self._log_batch(logger)

    def check_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Raise the ``ValueError`` that ``Event.INIT`` would raise for a run whose optimizer is ``optimizer`` (a
        fresh one): one 0/1 Adam cannot replace (not Adam-like: SGD, Lion, ...), or a ZeroOneAdam while this
        algorithm has options. Recipes call it before anything is built."""
        self._zero_one_adam(optimizer)

    def _zero_one_adam(self, optimizer: torch.optim.Optimizer) -> ZeroOneAdam:
        """``optimizer`` if it is a ZeroOneAdam, else the ZeroOneAdam that replaces it."""
        if isinstance(optimizer, ZeroOneAdam):
            if self.options:
                raise ValueError(f"the run's optimizer already is a ZeroOneAdam; give the options "
                                 f"({', '.join(self.options)}) to it instead of to ZeroOneAdamDDP")
            return optimizer
        # Durations become steps at FIT_START, once Composer knows max_duration; 1 until then.
        return to_zero_one_adam(optimizer, **{**self.options, **{k: 1 for k in self._durations}})

    def traffic(self) -> TrafficReport:
        """Bytes this rank sent since training began (resumes included): all of 0/1 Adam's communication, under
        ``grads``; its ``bf16``/``native`` are what DDP's gradient all-reduce would have sent over the same steps,
        so ``grads.ratio_vs_native`` is the saving against plain DDP. Zero with world size 1."""
        grads = TrafficCounter() if self.optimizer is None else self.optimizer.traffic()
        return TrafficReport(TrafficCounter(), grads)

    # ------------------------------------------------------------------ events
    def _init(self, state: State, logger: Logger) -> None:
        if state.fsdp_config is not None or state.tp_config is not None:
            raise ValueError("0/1 Adam synchronizes full replicas (plain data parallelism) and, as in DeepSpeed (not "
                             "compatible with ZeRO), does not work with FSDP or tensor parallelism: remove "
                             "parallelism_config (Composer then uses DDP), or use QSDP for FSDP runs")
        if state.precision == Precision.AMP_FP16:
            raise ValueError("precision='amp_fp16' is not supported with 0/1 Adam: its gradient scaler would skip the "
                             "step on the ranks whose local gradients overflow and step on the others, and the "
                             "optimizer's collectives would hang; allowed: 'fp32', 'amp_bf16'")
        optimizers = list(state.optimizers)
        if len(optimizers) != 1:
            raise ValueError(f"0/1 Adam takes exactly one optimizer, the run has {len(optimizers)}")
        if dist.get_world_size() == 1:
            warnings.warn("ZeroOneAdamDDP does nothing with world size 1: there is nothing to communicate, so the "
                          f"run keeps its optimizer ({type(optimizers[0]).__name__})", stacklevel=2)
            return
        optimizer = self._zero_one_adam(optimizers[0])
        if optimizer is not optimizers[0]:
            state.optimizers = (optimizer,)
        self.optimizer = optimizer
        self._take_over_clipping(state)
        s = optimizer.schedule
        logger.log_hyperparameters({"zero_one_adam/var_freeze_step": s.var_freeze_step,
                                    "zero_one_adam/var_update_scaler": s.var_update_scaler,
                                    "zero_one_adam/local_step_scaler": s.local_step_scaler,
                                    "zero_one_adam/local_step_clipper": s.local_step_clipper})

    def _install(self, state: State) -> None:
        assert self.optimizer is not None
        if state.optimizers[0] is not self.optimizer:
            now = type(state.optimizers[0]).__name__
            raise RuntimeError(f"the run's optimizer changed after Event.INIT (now {now}); ZeroOneAdamDDP must be the "
                               "only algorithm that replaces it")
        if not isinstance(state.model, DistributedDataParallel):
            raise RuntimeError(f"ZeroOneAdamDDP expected Composer to wrap the model in DistributedDataParallel at "
                               f"world size {dist.get_world_size()}, found {type(state.model).__name__}")
        self._resolve_schedule(state)
        self._hook = apply_zero_one_adam(state.model, self.optimizer)
        self._installed = True
        self._logged = self.optimizer.traffic()
        log.info("0/1 Adam installed on %d ranks", dist.get_world_size())

    def _take_over_clipping(self, state: State) -> None:
        """Composer's ``GradientClipping`` would clip each rank's local gradient (DDP keeps them local): the
        optimizer clips instead, the exact mean on variance steps as DDP's clipping does (see ZeroOneAdam)."""
        clippers = [a for a in state.algorithms if isinstance(a, GradientClipping)]
        if not clippers:
            return
        assert self.optimizer is not None
        kinds = sorted({c.clipping_type for c in clippers})
        if len(clippers) > 1 or kinds != ["norm"]:
            raise ValueError(f"0/1 Adam clips the global gradient norm itself (max_grad_norm); the run has "
                             f"GradientClipping with clipping_type {', '.join(kinds)}, which would clip each rank's "
                             "local gradient: allowed: one GradientClipping(clipping_type='norm'), or none")
        if self.optimizer.max_grad_norm is not None:
            raise ValueError(f"0/1 Adam was given max_grad_norm={self.optimizer.max_grad_norm} and the run also has "
                             "GradientClipping: the gradients would be clipped twice; keep one")
        self.optimizer.max_grad_norm = float(clippers[0].clipping_threshold)
        state.algorithms = [a for a in state.algorithms if a is not clippers[0]]
        log.info("0/1 Adam clips the gradient norm to %s in the optimizer (GradientClipping removed)",
                 self.optimizer.max_grad_norm)

    def _resolve_schedule(self, state: State) -> None:
        """Turn the duration options into steps of this run, report the run's plan, and warn about schedules that
        do not exercise 0/1 Adam or are known to diverge."""
        assert self.optimizer is not None
        schedule = self.optimizer.schedule
        total = _batches(state.max_duration, state, "max_duration")
        for name, steps in self._steps(total).items():
            setattr(schedule, name, steps)
        plan = schedule.plan(total)
        log.info("0/1 Adam over %d steps: %s; about %.1fx fewer bytes than DDP's fp32 all-reduce", total, plan,
                 planned_ratio(self.optimizer, plan))
        if plan.first_local_step is None:
            warnings.warn(f"0/1 Adam's variance never freezes in this run (var_freeze_step={schedule.var_freeze_step}"
                          f" >= max_duration {total} steps): no local steps; 1-bit and fp32 steps only", stacklevel=2)
        elif not self.optimizer.bound_updates:
            warnings.warn("bound_updates=False with a frozen variance: an element whose gradient grows above its "
                          "frozen variance takes a step of hundreds of learning rates (GPT-125M diverged so); keep "
                          "bound_updates=True", stacklevel=2)

    def plan(self, params: Iterable[torch.Tensor], total_steps: int) -> tuple[SchedulePlan, float]:
        """What a run of ``total_steps`` optimizer steps over ``params`` does with these options (the duration
        options resolved against it), and about how many times fewer bytes than DDP's fp32 all-reduce it sends:
        the plan the algorithm logs at ``Event.FIT_START``, before any process group exists.

        Args:
            params: the model's trainable parameters (only their shapes matter: meta tensors do).
            total_steps: the run's optimizer steps (``max_duration`` in batches).
        """
        optimizer = ZeroOneAdam(params, **{**self.options, **self._steps(total_steps)})
        plan = optimizer.schedule.plan(total_steps)
        return plan, planned_ratio(optimizer, plan)

    def _steps(self, total: int) -> dict[str, int]:
        """The duration options in optimizer steps of a run of ``total`` steps (at least 1)."""
        return {name: max(1, round(d.value * total) if d.unit == TimeUnit.DURATION else int(d.value))
                for name, d in self._durations.items()}

    def _log_batch(self, logger: Logger) -> None:
        assert self.optimizer is not None
        now = self.optimizer.traffic()
        schedule = self.optimizer.schedule
        logger.log_metrics({
            "zero_one_adam/bytes_sent": now.sent - self._logged.sent,
            "zero_one_adam/total_bytes_sent": now.sent,
            "zero_one_adam/compression_vs_fp32_allreduce": now.ratio_vs_native,
            "zero_one_adam/var_interval": schedule.var_interval,
            "zero_one_adam/local_step_interval": schedule.local_step_interval,
            "zero_one_adam/variance_frozen": int(schedule.step > schedule.var_freeze_step),
        })
        self._logged = now
