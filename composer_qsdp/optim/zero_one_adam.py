# Over 600 lines on purpose: one optimizer class and its specification (this docstring); its flat layout, its
# variance_rescale statistics and the checks of its options are modules of their own.
"""``ZeroOneAdam``: Adam for plain data parallelism that communicates 1 bit per element, and rarely (0/1 Adam).

Lu, Li, Zhang, De Sa, He, "Maximizing Communication Efficiency for Large-scale Training via 0/1 Adam" (ICLR 2023),
with the options, defaults and schedules of DeepSpeed's ``ZeroOneAdam`` (``deepspeed/runtime/fp16/onebit/zoadam.py``).
Each rank holds a full replica and its *local* gradient; the optimizer does all the communication. Per step ``t``
(the schedules ``T_v`` and ``T_u`` are :class:`~composer_qsdp.optim.schedule.ZeroOneSchedule`'s), with ``lr``,
``beta1``, ``beta2``, ``eps``, ``wd`` of the parameter's group, ``d = sqrt(v) + eps`` and ``B`` the step bound::

    variance phase (t <= var_freeze_step):
        if t in T_v: g = mean over ranks of the gradient (exact fp32, or variance_codec's all-reduce without error
                         feedback);  v = beta2 * v + (1 - beta2) * g * g
        else:        g = d * (1-bit mean over ranks of g_local / d, with error feedback)
        m = beta1 * m + (1 - beta1) * g
        x = x - lr * (clamp(m / d, -B, B) + wd * x)
    local-step phase (t > var_freeze_step; v frozen; the error buffers are zeroed once on entry):
        m = beta1 * m + (1 - beta1) * g_local
        update = clamp(m / d, -B, B) + wd * x;   x = x - lr * update;   S = S + lr
        if t in T_u:
            u = x - x_sync                 # the accumulated local updates (DeepSpeed's momentum_accumulator)
            u = 1-bit mean over ranks of u, with error feedback
            m = -u * d / S                 # the lr-weighted mean momentum of the interval
            x = x_sync + u;   x_sync = x;   S = 0

``variance_rescale=True`` keeps the frozen variance's magnitude current, per bucket ``b`` of the codec's flat
layout (``bucket_size`` elements of one tensor), from one fp32 per bucket per synchronization::

    every step:            q_b = beta2 * q_b + (1 - beta2) * sum over b of g_rank^2   # this rank's, as the step uses
                           e_b = beta2 * e_b                                            # it (clipped): local
    T_v steps, T_u steps:  e_b = e_b + (mean over ranks of q_b);   q_b = 0              # one fp32 all-reduce
                           c_b = e_b / (1 - beta2^t)                                    # bias-corrected EMA
    T_v steps:             r_b = c_b                                  # the reference: when v was last written
    local-step phase:      d = sqrt(v * clamp(c_b / r_b, 1/100, 100)) + eps   (ratio 1 where r_b = 0)

``c_b / r_b`` is how much the ranks' squared gradients in the bucket changed since the variance was last updated;
the ratio is set at a synchronization and used until the next one, computed from all-reduced values only, so the
replicas stay bit-identical. ``v`` itself stays frozen (the checkpoints hold it, ``e``, ``r``, the ratio and every
rank's ``q``). The bounds (:data:`~composer_qsdp.optim.bucket_statistics.RESCALE_BOUNDS`: a tenfold change of
``sqrt(v)`` either way) keep a bucket whose gradient is rarely non-zero (an embedding row of a rare token) from
taking a hundredfold step when one comes.

``B = max(1, sqrt((1 - beta1) / (1 - beta2)))`` (``bound_updates=True``, the default) is a bound that Adam with a
current variance never exceeds (see ``_update_bound``); with a stale or frozen ``v`` an element whose gradient grew
above its last variance update would otherwise step hundreds of learning rates (GPT-125M diverged within 10-30
steps of every freeze). ``max_grad_norm`` clips the mean gradient on ``T_v`` steps (DDP's clipping; with
``variance_codec``, the decoded mean) and each rank's gradient before it is compressed or used locally on the other
steps (so the mean is within the bound too, but a mean below it is scaled down when a rank's gradient is above it).

``bias_correction=True`` applies Adam's bias corrections: ``m / (1 - beta1^t)`` for ``m`` and
``v / (1 - beta2^n)`` for ``v``, ``n`` counting the variance updates so far (frozen with ``v``); a synchronization
then sets ``m`` so that its corrected value is ``-u * d / S``. DeepSpeed accepts ``bias_correction`` (default
True) but never applies it; the default here, False, is its update.

What differs from DeepSpeed, on purpose:

* 1-bit synchronizations compress in Adam's preconditioned coordinates: ``g / d`` in the variance phase, ``u``
  itself in the local-step phase (DeepSpeed compresses ``g`` and ``u * d``). Sign compression gives every element
  of a bucket the bucket's magnitude; in raw gradient units an element with a small ``d`` among larger ones receives
  a large gradient and divides it by its small ``d``, while in preconditioned units the elements of a bucket have
  comparable sizes. ``d`` is the same on every rank, so the mean is unchanged; only the compression error moves.
* Each element's step ``m / d`` is bounded by ``B`` (``bound_updates``); DeepSpeed has no bound.
* ``variance_codec`` (off by default) sends the variance updates through a codec (8-bit symmetric: about a quarter of
  an fp32 all-reduce), so that the variance can be updated at every step until the freeze: with ``beta2 = 0.95``
  Adam's ``v`` averages about 20 steps, and DeepSpeed's doubling ``T_v`` leaves it stale in between. Its error
  does not feed back: error feedback makes a sum of the sent values exact, not a sum of their squares, and a
  residue carried into the next update would enter ``v`` twice.
* ``variance_rescale`` (off by default): the frozen variance follows the gradients' synchronized per-bucket
  statistics (above); DeepSpeed and the paper freeze ``v`` as it is.
* ``max_grad_norm`` clips (DeepSpeed accepts it and ignores it; its engine clips before the optimizer, on the
  local gradient).

* The weights at the last synchronization, ``x_sync``, are kept instead of the accumulator ``u`` (the same memory):
  DeepSpeed accumulates ``u`` step by step and computes ``(x - u) + mean / (sqrt(v) + eps)``, whose rounding differs
  from rank to rank, so its replicas drift apart by a few ulps at every synchronization, for good. Here every rank
  computes ``x_sync + mean / (sqrt(v) + eps)`` from identical values: after each synchronization the replicas are
  bit-identical again, as they are throughout the variance phase.
* Checkpoints continue exactly. :meth:`ZeroOneAdam.state_dict` holds the schedule, every rank's error buffers and,
  between two synchronizations of the local-step phase (when the ranks' weights and momenta differ), every rank's
  copy of those; :meth:`ZeroOneAdam.load_state_dict` gives each rank back its own. DeepSpeed drops the error
  buffers and the accumulator on load. Consequently ``state_dict()`` is collective: every rank calls it, as
  Composer's checkpointing does.
* The first step trains (DeepSpeed's first step only allocates its buffers); the schedules count from it.
* One compressed all-reduce per step over all parameters as one flat buffer, with one scale per bucket of
  ``bucket_size`` elements (DeepSpeed: one all-reduce and one worker scale per parameter tensor).
* Elements whose variance is exactly zero (every variance update saw a zero gradient: a dead unit, an embedding row
  of a token never seen) do not move and take no part in the 1-bit synchronizations, until a variance update sees
  a gradient for them. Their Adam step would be ``m / eps``, and 1-bit compression, which cannot represent zero,
  hands every element of a bucket ``+-scale``; DeepSpeed's answer is a momentum mask (``exp_avg_mask``) the user
  supplies for parameters known to have constant-zero gradients, derived here from the variance.
* A parameter frozen during training (it no longer requires a gradient, or no parameter group holds it: Composer's
  ``LayerFreezing`` does both) keeps its value and its state, as torch's optimizers skip a parameter without a
  gradient, and takes no part in the 1-bit synchronizations (its error buffers are dropped). One frozen between two
  synchronizations of the local-step phase, where the ranks' copies differ, takes its last synchronized value, the
  same on every rank; it still occupies its place in the flat buffers. Unfrozen, it continues from its state.
* Every parameter starts on a codec bucket in the flat layout, so a bucket's scale never mixes two tensors (a bias
  with a weight matrix): DeepSpeed's scales are per tensor for the same reason.
* A synchronization whose interval saw only zero learning rates (``S = 0``) leaves ``m`` as it was instead of
  dividing by zero.
* Not supported: AMSGrad (neither in DeepSpeed), ``exp_avg_mask`` momentum masks, ``eps_inside_sqrt`` (accepted and
  unused by DeepSpeed), MPI/HCCL back ends (any ``torch.distributed`` back end
  works).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from composer_qsdp.comm import Topology, TrafficCounter, error_feedback_chunk_numel
from composer_qsdp.optim.bucket_statistics import LOCAL_BUFFER, SHARED_BUFFERS, BucketStatistics
from composer_qsdp.optim.flat_layout import FlatLayout
from composer_qsdp.optim.schedule import ScheduledStep, ZeroOneSchedule
from composer_qsdp.optim.zero_one_options import (bits_per_element, check_group, check_max_grad_norm, check_param,
                                                   default_bucket_size, make_variance_codec, param_tensors)
from composer_qsdp.quant import make_codec
from composer_qsdp.schemes import AllReduceScheme, OneBitAllReduce, make_all_reduce_scheme
from composer_qsdp.validate import check_int

__all__ = ["ZeroOneAdam"]

#: Per-parameter state tensors, kept as views of one flat fp32 buffer each (``synced_param``: ``x_sync``).
_TENSORS = ("exp_avg", "exp_avg_sq", "synced_param")
#: Per-parameter tensors that differ between ranks between two synchronizations of the local-step phase.
_LOCAL = {"param": "local_param", "exp_avg": "local_exp_avg"}
#: Keys a saved per-parameter entry holds beyond the standard ones.
_EXTRA = ("worker_error", "server_error", "zero_one", LOCAL_BUFFER, *_LOCAL.values())


class ZeroOneAdam(torch.optim.Optimizer):
    """0/1 Adam (see the module docstring for the update and how it differs from DeepSpeed's).

    Every rank of ``group`` must construct it over the same parameters in the same order, call :meth:`step` at
    the same steps, and call :meth:`state_dict` together. With world size 1 (or no process group) nothing is
    communicated and the update runs with exact means.

    Args:
        params: fp32 parameters (or parameter groups) of a full replica, on one device. Parameters that do not
            require gradients are left alone; one that stops requiring them later, or that leaves every parameter
            group, is frozen (module docstring). A parameter without a gradient at a step counts as a zero
            gradient, so that every rank communicates the same layout.
        lr: learning rate.
        betas: ``(beta1, beta2)`` of the momentum and the variance.
        eps: added to ``sqrt(v)``; must be > 0 (an element whose variance decayed to zero would divide by it).
        weight_decay: decoupled weight decay (as AdamW: ``x -= lr * wd * x``).
        bias_correction: apply Adam's bias corrections (default False: DeepSpeed's update).
        var_freeze_step: the last step that may update the variance (``max T_v``); usually the end of the
            learning-rate warm-up (DeepSpeed's default 100000).
        var_update_scaler: variance updates between doublings of the variance interval (kappa; default 16).
        local_step_scaler: local-phase steps between doublings of the synchronization interval (default 32678).
        local_step_clipper: the largest synchronization interval (H; default 16).
        max_grad_norm: clip the global L2 norm of the gradient to this (None: no clipping): the exact mean on
            variance-update steps, each rank's gradient on the others.
        bound_updates: bound each element's ``|m / (sqrt(v) + eps)|`` by ``max(1, sqrt((1 - beta1) / (1 - beta2)))``,
            which Adam with a current variance never exceeds (default True; False: DeepSpeed's unbounded step).
        amsgrad: must be False (0/1 Adam has no AMSGrad variant).
        codec: the compressor of the synchronizations: a deterministic codec name (``"sign"``: 0/1 Adam's 1-bit
            signs with an L2 scale), or ``None`` for exact fp32 means (an ablation without compression).
        variance_codec: the compressor of the variance updates' all-reduce (``T_v`` steps): ``None`` (default:
            exact fp32), a deterministic codec name (``"symmetric"``: 8 bits with one fp32 scale per bucket,
            ``8 + 32 / bucket_size`` bits per element) or a mapping of :func:`~composer_qsdp.quant.make_codec`
            options with its ``name`` (``{"name": "symmetric", "bits": 6}``); at ``bucket_size`` unless given (a
            divisor of it).
        variance_rescale: scale the frozen variance per bucket by the change of the ranks' squared gradients since
            the last variance update (see the module docstring; default False). Costs one fp32 per bucket on every
            variance update and local-phase synchronization.
        bucket_size: elements sharing one codec scale. Default: :func:`default_bucket_size`, at most 256 (1.125 bits
            per element) and a divisor of every matrix's rows, so that a scale covers one embedding token's row or
            one unit's weights only: an element whose gradients are far smaller than its bucket's would get the
            bucket's scale, and Adam divides that by its small ``sqrt(v)``.
        group: the process group of the replicas (default: the default group).
        ranks_per_node: ranks sharing a node, for the per-hop byte count (default: ``LOCAL_WORLD_SIZE``).

    Raises:
        ValueError: an option out of range, naming it and what is allowed; sharded (DTensor or FSDP1 flat)
            parameters; parameters that are not fp32 or not on one device.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        *,
        bias_correction: bool = False,
        var_freeze_step: int = 100000,
        var_update_scaler: int = 16,
        local_step_scaler: int = 32678,
        local_step_clipper: int = 16,
        max_grad_norm: float | None = None,
        bound_updates: bool = True,
        amsgrad: bool = False,
        codec: str | None = "sign",
        variance_codec: str | Mapping[str, Any] | None = None,
        variance_rescale: bool = False,
        bucket_size: int | None = None,
        group: dist.ProcessGroup | None = None,
        ranks_per_node: int | None = None,
    ) -> None:
        check_max_grad_norm(max_grad_norm)
        if not isinstance(bound_updates, bool):
            raise ValueError(f"bound_updates={bound_updates!r} is invalid; allowed: True, False")
        if not isinstance(variance_rescale, bool):
            raise ValueError(f"variance_rescale={variance_rescale!r} is invalid; allowed: True, False")
        self._rescale = variance_rescale
        self._max_grad_norm = max_grad_norm
        self._bound_updates = bound_updates
        if amsgrad:
            raise ValueError("amsgrad=True is not supported: 0/1 Adam has no AMSGrad variant (allowed: False)")
        self._schedule = ZeroOneSchedule(
            check_int("var_freeze_step", var_freeze_step, minimum=1),
            check_int("var_update_scaler", var_update_scaler, minimum=1),
            check_int("local_step_scaler", local_step_scaler, minimum=1),
            check_int("local_step_clipper", local_step_clipper, minimum=1),
        )
        # Read twice (for the default bucket, then by torch's Optimizer): generators become lists.
        params = [{**item, "params": param_tensors(item)} if isinstance(item, dict) else item for item in params]
        if bucket_size is None:
            bucket_size = default_bucket_size(t for item in params for t in param_tensors(item))
        bucket_size = check_int("bucket_size", bucket_size, minimum=1)
        self._codec = None if codec is None else make_codec(codec, bucket_size=bucket_size)
        if self._codec is not None and self._codec.unbiased:
            raise ValueError(f"codec={codec!r} rounds stochastically; 0/1 Adam's error feedback needs a "
                             "deterministic codec (allowed: 'sign', 'symmetric', or None)")
        self._variance_codec = make_variance_codec(variance_codec, bucket_size)
        self._group = group
        self._ranks_per_node = ranks_per_node
        # The flat layout, filled by add_param_group in group order: every parameter starts on a codec bucket, so
        # that no bucket (one scale, one variance statistic) mixes two tensors' elements; the gaps carry no data.
        bucketed = self._codec is not None or self._variance_codec is not None or variance_rescale
        self._layout = FlatLayout(bucket_size if bucketed else 1)
        self._constructed = False
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                    "bias_correction": bias_correction}
        super().__init__(params, defaults)
        self._constructed = True
        # Lazy: the parameters may still move to their device (Composer moves the model after the optimizer is
        # built), and the process group may not exist yet. Entries exist from the start so that
        # torch.distributed.checkpoint never initializes the state with a fake zero-gradient step.
        for p in self._layout.params:
            self.state[p] = {}
        self._flat: dict[str, torch.Tensor] | None = None
        self._stats: BucketStatistics | None = None  # variance_rescale's per-bucket statistics
        self._valid: torch.Tensor | None = None  # the flat elements that belong to a parameter
        # Layout indices of the frozen parameters at the last step, and their flat mask (None: none frozen).
        self._frozen: tuple[int, ...] = ()
        self._frozen_mask: torch.Tensor | None = None
        self._scheme: OneBitAllReduce | None = None
        # The variance updates' all-reduce with variance_codec, and variance_rescale's all-reduce of the per-bucket
        # statistics (exact): None when unused or with world size 1.
        self._variance_scheme: AllReduceScheme | None = None
        self._stats_scheme: AllReduceScheme | None = None
        self._world_size: int | None = None
        self._lrs = [0.0] * len(self.param_groups)  # S: the learning rates summed since the last synchronization
        self._restored_params: dict[torch.Tensor, torch.Tensor] = {}

    # ------------------------------------------------------------------ construction
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group at construction (its trainable parameters join the flat layout).

        Raises:
            ValueError: after construction (every rank communicates one fixed layout), or invalid options.
        """
        if self._constructed:
            raise ValueError("ZeroOneAdam takes its parameter groups at construction only: the ranks communicate one "
                             "fixed flat layout of all parameters")
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        check_group(group, len(self.param_groups) - 1)
        trainable = [p for p in group["params"] if p.requires_grad]
        known = self._layout.params
        for index, p in enumerate(trainable):
            check_param(p, len(known) + index, (known or trainable)[0])
        self._layout.add_group(trainable)

    # ------------------------------------------------------------------ public
    @property
    def schedule(self) -> ZeroOneSchedule:
        """The step counters and intervals (read them; :meth:`step` advances them)."""
        return self._schedule

    @property
    def max_grad_norm(self) -> float | None:
        """The gradient-norm bound (None: no clipping); settable before the first step."""
        return self._max_grad_norm

    @max_grad_norm.setter
    def max_grad_norm(self, value: float | None) -> None:
        check_max_grad_norm(value)
        self._max_grad_norm = value

    @property
    def bound_updates(self) -> bool:
        """Whether each element's Adam step is bounded (see the module docstring)."""
        return self._bound_updates

    @property
    def bits_per_element(self) -> float:
        """Bits a 1-bit synchronization sends per element, scales included (32 without a codec)."""
        return bits_per_element(self._codec)

    @property
    def variance_bits_per_element(self) -> float:
        """Bits a variance update (a ``T_v`` step) sends per element, scales included: 32 (an fp32 all-reduce)
        without ``variance_codec``."""
        return bits_per_element(self._variance_codec)

    @property
    def stats_bits_per_element(self) -> float:
        """Bits per element that ``variance_rescale`` adds to every variance update and local-phase
        synchronization (one fp32 statistic per bucket: ``32 / bucket_size``); 0 without it."""
        return 32.0 / self._layout.align if self._rescale else 0.0

    @property
    def variance_rescale(self) -> bool:
        """Whether the frozen variance follows the synchronized gradient statistics (see the module docstring)."""
        return self._rescale

    @property
    def world_size(self) -> int:
        """Ranks the optimizer synchronizes (1 before the first step or without a process group)."""
        return self._world_size or 1

    def traffic(self) -> TrafficCounter:
        """Bytes this rank sent since training began (resumes included), per rank in NCCL's convention.

        ``sent``, ``inter_node`` and ``calls`` count this optimizer's collectives; ``bf16`` and ``native`` are what
        DDP's all-reduce of the gradients would have sent over the same optimizer steps, in bf16 and in fp32, so
        ``ratio_vs_native`` is the saving against plain data parallelism.
        """
        if self._scheme is None:
            return TrafficCounter()
        counted = self._counted()
        # DDP's all-reduce of the gradients: a reduce-scatter and an all-gather of W chunks each.
        elements = 2 * (self.world_size - 1) * -(-sum(p.numel() for p in self._layout.params) // self.world_size)
        steps = self._schedule.step
        return TrafficCounter(calls=counted.calls, sent=counted.sent, bf16=steps * elements * 2,
                              native=steps * elements * 4, inter_node=counted.inter_node)

    def _counted(self) -> TrafficCounter:
        """What this optimizer's collectives sent (every scheme's counter; zeros with world size 1)."""
        return sum((s.traffic for s in self._schemes()), TrafficCounter())

    def _schemes(self) -> list[AllReduceScheme]:
        return [s for s in (self._scheme, self._variance_scheme, self._stats_scheme) if s is not None]

    def restore_local_params(self) -> bool:
        """Put back this rank's own weights loaded by :meth:`load_state_dict` from a checkpoint taken between two
        synchronizations of the local-step phase, after something overwrote them with rank 0's (constructing
        ``DistributedDataParallel`` broadcasts rank 0's parameters). Returns whether there was anything to restore;
        the copies are released at the first :meth:`step`."""
        with torch.no_grad():
            for p, value in self._restored_params.items():
                p.copy_(value)
        return bool(self._restored_params)

    # ------------------------------------------------------------------ the step
    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """One 0/1 Adam step over every parameter group (collective when the world size is above 1)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        flat = self._materialize()
        self._restored_params = {}
        plan = self._schedule.advance()
        scheme = self._scheme
        frozen = self._freeze(plan)
        grads = self._layout.flat_grads()
        if frozen is not None:
            grads.masked_fill_(frozen, 0)
        silent = None
        if not plan.update_variance:
            # Elements whose variance is zero (every variance step saw a zero gradient, as for a dead unit or an
            # unused embedding row) have no Adam step size: their update would be m / eps, and 1-bit compression,
            # which cannot represent zero, would hand them +-scale. They do not move until a variance step sees a
            # gradient: DeepSpeed's exp_avg_mask, derived from the variance instead of given by the user.
            silent = flat["exp_avg_sq"] == 0
            grads.masked_fill_(silent, 0)
        if plan.enter_local:
            self._flat["synced_param"].copy_(self._layout.flat_params(self._layout.whole))
            if scheme is not None:
                # The error buffers held the gradients' residue; from now on they compress the accumulated updates.
                scheme.reset_errors()
        clip = self._max_grad_norm
        if clip is not None and not plan.update_variance:
            # A compressed or local step: each rank clips the gradient it contributes, so the mean is within the
            # bound too. Clipping the decoded 1-bit mean instead would clip the error feedback's residue with it.
            _clip_norm_(grads, clip)
        # variance_rescale's statistic: this rank's squared gradient per bucket, as the step uses it (clipped).
        stats = self._stats
        squares = None if stats is None else stats.sums_of_squares(grads)
        if not plan.local and scheme is not None:
            valid = self._valid if silent is None else ~silent
            if frozen is not None:
                valid = valid & ~frozen
            if plan.update_variance and self._variance_scheme is not None:
                self._variance_scheme.all_reduce(grads, valid=valid)
            elif plan.update_variance:
                scheme.all_reduce(grads, exact=True, valid=valid)
            else:
                # Compressed in Adam's preconditioned coordinates, g / (sqrt(v) + eps), where the elements of a
                # bucket have comparable sizes: 1-bit compression gives every element its bucket's magnitude, which
                # for raw gradients an element with a small sqrt(v) turns into a large step.
                denoms = [self._denominator(group, flat["exp_avg_sq"][part]) for group, part in self._group_slices()]
                for (_, part), denom in zip(self._group_slices(), denoms):
                    grads[part].div_(denom)
                scheme.all_reduce(grads, valid=valid)
                for (_, part), denom in zip(self._group_slices(), denoms):
                    grads[part].mul_(denom)
        if clip is not None and plan.update_variance:
            factor = _clip_norm_(grads, clip)  # the exact mean, as DDP's clipping
            if squares is not None:
                squares.mul_(factor * factor)
        if stats is not None:
            stats.accumulate(squares, self._bucket_parts())
        # A frozen variance follows the gradients' synchronized statistics (variance_rescale): v * ratio per bucket.
        ratio = stats.element_ratio() if stats is not None and plan.local else None
        denoms = []
        for index, (group, part) in enumerate(self._group_slices()):
            beta1, beta2 = group["betas"]
            g, m, v = grads[part], flat["exp_avg"][part], flat["exp_avg_sq"][part]
            keep = None if frozen is None else frozen[part]
            kept = None if keep is None else (m[keep], v[keep])  # a frozen parameter's state stays as it is
            if plan.update_variance:
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            m.mul_(beta1).add_(g, alpha=1 - beta1)
            if kept is not None:
                m[keep], v[keep] = kept
            denom = self._denominator(group, v if ratio is None else v * ratio[part])
            update = self._corrected_momentum(group, m, plan.step) / denom
            if self._bound_updates:
                bound = _update_bound(group)
                update.clamp_(-bound, bound)
            if group["weight_decay"] > 0:
                update.add_(self._layout.flat_params(part), alpha=group["weight_decay"])
            still = v == 0 if keep is None else (v == 0) | keep
            self._layout.add_to_params(part, update.masked_fill_(still, 0), -group["lr"])
            if plan.local:
                self._lrs[index] += group["lr"]
            denoms.append(denom)
        if plan.local and plan.sync:
            self._synchronize(plan, denoms, frozen)
        if stats is not None and (plan.update_variance or (plan.local and plan.sync)):
            stats.synchronize(plan.step, plan.update_variance, self._bucket_parts(), self._stats_scheme)
        return loss

    def _synchronize(self, plan: ScheduledStep, denoms: list[torch.Tensor], frozen: torch.Tensor | None) -> None:
        """The local-step phase's synchronization (after this step's local update); ``frozen``: the elements of
        frozen parameters (they take no part)."""
        synced = self._flat["synced_param"]
        u = self._layout.flat_params(self._layout.whole).sub_(synced)
        slices = list(self._group_slices())
        if self._scheme is not None:
            # u is compressed as it is, in the preconditioned coordinates (lr-weighted m / (sqrt(v) + eps)), for
            # the reason the variance phase's 1-bit steps are; DeepSpeed compresses u * (sqrt(v) + eps).
            valid = self._flat["exp_avg_sq"] != 0  # the variance is frozen: as in step
            self._scheme.all_reduce(u, valid=valid if frozen is None else valid & ~frozen)
        for index, ((group, part), denom) in enumerate(zip(slices, denoms)):
            if self._lrs[index] > 0:
                mean_momentum = u[part] * denom / -self._lrs[index]
                m = self._flat["exp_avg"][part]
                keep = None if frozen is None else frozen[part]
                kept = None if keep is None else m[keep]
                m.copy_(self._uncorrect_momentum(group, mean_momentum, plan.step))
                if kept is not None:
                    m[keep] = kept
            synced[part].add_(u[part])
            self._lrs[index] = 0.0
        self._layout.copy_to_params(synced)

    def _freeze(self, plan: ScheduledStep) -> torch.Tensor | None:
        """The flat elements of the frozen parameters for this step (None: none), after returning each newly frozen
        one to its last synchronized value in the local-step phase.

        A parameter is frozen when it no longer requires a gradient or no parameter group holds it any more
        (Composer's ``LayerFreezing`` does both). Between two synchronizations the ranks' copies of a parameter
        differ; the last synchronized value is the same on every rank, so a parameter frozen there keeps that one.
        """
        held = {id(p) for group in self.param_groups for p in group["params"]}
        now = tuple(i for i, p in enumerate(self._layout.params) if not p.requires_grad or id(p) not in held)
        if now == self._frozen:
            return self._frozen_mask
        if plan.local and not plan.enter_local:
            newly = [i for i in now if i not in self._frozen]
            synced = self._layout.views(self._layout.whole, self._flat["synced_param"])
            torch._foreach_copy_([self._layout.params[i] for i in newly], [synced[i] for i in newly])
        self._frozen = now
        self._frozen_mask = self._layout.mask(now) if now else None
        return self._frozen_mask

    def _bucket_parts(self) -> list[tuple[float, slice]]:
        """Each group's ``beta2`` and its part of variance_rescale's per-bucket buffers."""
        return [(g["betas"][1], self._layout.bucket_part(part)) for g, part in self._group_slices()]

    # ------------------------------------------------------------------ math helpers
    def _denominator(self, group: dict[str, Any], v: torch.Tensor) -> torch.Tensor:
        """``sqrt(v) + eps``, with ``v`` bias-corrected by its number of updates when the group asks for it."""
        if group["bias_correction"]:
            v = v / (1 - group["betas"][1] ** self._schedule.var_updates)
        return v.sqrt().add_(group["eps"])

    @staticmethod
    def _corrected_momentum(group: dict[str, Any], m: torch.Tensor, step: int) -> torch.Tensor:
        """``m``, bias-corrected for ``step`` when the group asks for it."""
        return m / (1 - group["betas"][0] ** step) if group["bias_correction"] else m

    @staticmethod
    def _uncorrect_momentum(group: dict[str, Any], corrected: torch.Tensor, step: int) -> torch.Tensor:
        """The stored momentum whose bias-corrected value at ``step`` is ``corrected``."""
        return corrected * (1 - group["betas"][0] ** step) if group["bias_correction"] else corrected

    # ------------------------------------------------------------------ flat layout
    def _group_slices(self) -> Iterable[tuple[dict[str, Any], slice]]:
        return zip(self.param_groups, self._layout.slices)

    def _materialize(self) -> dict[str, torch.Tensor]:
        """The flat state buffers (zeros at first use, on the parameters' device) and the communication."""
        layout, device = self._layout, self._layout.device
        if self._flat is None:
            self._flat = {k: torch.zeros(layout.numel, device=device) for k in _TENSORS}
            if self._rescale:
                self._stats = BucketStatistics(layout.numel // layout.align, layout.align, device)
            self._valid = layout.valid()
            self._point_state_at_flat()
            self._setup_communication()
        elif self._flat["exp_avg"].device != device:
            raise RuntimeError(f"ZeroOneAdam's state is on {self._flat['exp_avg'].device} but the parameters moved "
                               f"to {device}; build the optimizer after moving the model")
        return self._flat

    def _point_state_at_flat(self) -> None:
        """Make every parameter's state tensors views of the flat buffers, keeping values already there."""
        views = {key: self._layout.views(self._layout.whole, self._flat[key]) for key in _TENSORS}
        if self._stats is not None:
            views.update({key: self._layout.bucket_views(self._stats.buffers[key]) for key in SHARED_BUFFERS})
        for key, per_param in views.items():
            for p, view in zip(self._layout.params, per_param):
                current = self.state[p].get(key)
                if current is not None and current is not view:
                    view.copy_(current)
                self.state[p][key] = view

    def _setup_communication(self) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            self._world_size = 1
            return
        group = self._group or dist.group.WORLD
        self._world_size = group.size()
        if self._world_size > 1:
            topology = Topology.detect(self._ranks_per_node)
            self._scheme = make_all_reduce_scheme("onebit", self._codec)
            if self._variance_codec is not None:
                # Each variance update's squares would not cancel a carried error: every call on its own.
                self._variance_scheme = make_all_reduce_scheme("onebit", self._variance_codec, error_feedback=False)
            if self._rescale:
                self._stats_scheme = make_all_reduce_scheme("onebit", None)
            for scheme in self._schemes():
                scheme.setup(group, topology)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Adam's per-parameter state plus what 0/1 Adam needs to continue exactly (collective: every rank calls it).

        Each parameter's entry holds ``step``, ``exp_avg``, ``exp_avg_sq`` and ``synced_param`` (this rank's),
        ``zero_one`` (the schedule's counters, its group's learning-rate sum, the world size and the byte
        counters), and with a world size above 1 ``worker_error`` (``[W, *shape]``: every rank's) and
        ``server_error`` (the servers' errors of this parameter's elements). Between two synchronizations of the
        local-step phase it also holds ``local_param`` and ``local_exp_avg`` (``[W, *shape]``), every rank's own
        copy (``synced_param`` is the same on every rank).
        """
        flat = self._materialize()
        saved = super().state_dict()
        keys = [k for g in saved["param_groups"] for k in g["params"]]
        index_of = {id(group): i for i, group in enumerate(self.param_groups)}
        group_of = {id(p): index_of[id(group)] for group in self.param_groups for p in group["params"]}
        extras = self._gathered_extras(flat)
        traffic = self._counted().state_dict()
        offset_of = {id(p): o for p, o in zip(self._layout.params, self._layout.offsets)}
        for key, p in zip(keys, (p for g in self.param_groups for p in g["params"])):
            if id(p) not in offset_of:
                continue
            offset = offset_of[id(p)]
            # A copy: super().state_dict() hands out the live per-parameter dicts.
            entry = saved["state"][key] = dict(saved["state"][key])
            entry["step"] = self._schedule.step
            entry["zero_one"] = {**self._schedule.state_dict(), "lrs": self._lrs[group_of[id(p)]],
                                 "world_size": self.world_size, "traffic": traffic}
            for name, (tensor, per_rank) in extras.items():
                if name == LOCAL_BUFFER:  # per bucket: [W, buckets of p]
                    entry[name] = tensor[:, self._layout.bucket_slice(p, offset)]
                    continue
                values = tensor[:, offset : offset + p.numel()] if per_rank else tensor[offset : offset + p.numel()]
                entry[name] = values.reshape(*values.shape[:-1], *p.shape)
        return saved

    @torch.no_grad()
    def _gathered_extras(self, flat: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, bool]]:
        """name -> (flat tensor, whether it has a leading rank dimension) of the state that differs between ranks,
        gathered from every rank."""
        local_squares = None if self._stats is None else self._stats.buffers[LOCAL_BUFFER]
        if self._scheme is None:
            return {} if local_squares is None else {LOCAL_BUFFER: (local_squares.view(1, -1).clone(), True)}
        group, world = self._scheme.group, self.world_size
        worker, server = self._scheme.worker_error, self._scheme.server_error
        if worker is None:  # no synchronization yet: the errors are zeros
            chunk = error_feedback_chunk_numel(self._layout.numel, world, self._codec)
            worker, server = flat["exp_avg"].new_zeros(world * chunk), flat["exp_avg"].new_zeros(chunk)
        extras = {"worker_error": (_all_gather(worker, group).view(world, -1)[:, : self._layout.numel], True),
                  "server_error": (_all_gather(server, group)[: self._layout.numel], False)}
        if self._schedule.between_syncs:
            local = {"param": self._layout.flat_params(self._layout.whole), "exp_avg": flat["exp_avg"]}
            extras.update({_LOCAL[k]: (_all_gather(v, group).view(world, -1), True) for k, v in local.items()})
        if local_squares is not None:
            extras[LOCAL_BUFFER] = (_all_gather(local_squares, group).view(world, -1), True)
        return extras

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output: the shared state, and this rank's own error buffers, and between two
        synchronizations its own weights and momentum.

        Raises:
            ValueError: entries that disagree on the schedule, or a checkpoint taken between two synchronizations
                of the local-step phase by another number of ranks (each rank's weights then differ). From
                another number of ranks at any other point, the error buffers restart from zero with a warning.
        """
        flat = self._materialize()
        keys = [k for g in state_dict["param_groups"] for k in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        # Without variance_rescale its saved statistics are dropped (the run continues without them).
        dropped = set(_EXTRA) | (set() if self._rescale else set(SHARED_BUFFERS))
        cleaned = {key: {k: v for k, v in entry.items() if k not in dropped}
                   for key, entry in state_dict["state"].items()}
        extras = {p: state_dict["state"][key] for key, p in zip(keys, params) if key in state_dict["state"]}
        super().load_state_dict({**state_dict, "state": cleaned})
        for buffer in flat.values():  # what the checkpoint does not hold starts from zero
            buffer.zero_()
        if self._stats is not None:
            self._stats.reset()
        self._point_state_at_flat()
        entries = [extras.get(p, {}) for p in self._layout.params]
        if not any("zero_one" in e for e in entries):
            return  # a state saved before the first step, or by another optimizer: Adam's tensors only
        if not all("zero_one" in e for e in entries):
            raise ValueError("the checkpoint holds 0/1 Adam's state for some trainable parameters only; it was "
                             "saved over other parameters")
        if self._rescale and not all(SHARED_BUFFERS[0] in e for e in entries):
            raise ValueError("variance_rescale=True, but the checkpoint was saved without it (no grad_sq_ema "
                             "statistics to scale the frozen variance by); resume with variance_rescale=False")
        run = {k: v for k, v in entries[0]["zero_one"].items() if k != "lrs"}  # lrs: per group
        if any({k: v for k, v in e["zero_one"].items() if k != "lrs"} != run for e in entries):
            raise ValueError("the checkpoint's parameters disagree on the 0/1 Adam schedule (zero_one entries differ)")
        self._schedule.load_state_dict(run)
        for index, (group, _) in enumerate(self._group_slices()):
            members = [extras[p]["zero_one"]["lrs"] for p in group["params"] if "zero_one" in extras.get(p, {})]
            self._lrs[index] = float(members[0]) if members else 0.0
        self._load_rank_state(entries, int(run["world_size"]), run["traffic"])

    def _load_rank_state(self, entries: list[dict[str, Any]], saved_world: int, traffic: dict[str, int]) -> None:
        rank = 0 if self._scheme is None else self._scheme.group.rank()
        local = _LOCAL["param"] in entries[0]
        for scheme in self._schemes():  # the checkpoint's counter holds every scheme's bytes: the main one's now
            scheme.traffic.load_state_dict(TrafficCounter().state_dict())
        if self._stats is not None and saved_world == self.world_size:  # else this rank's squares restart from zero
            for view, e in zip(self._layout.bucket_views(self._stats.buffers[LOCAL_BUFFER]), entries):
                view.copy_(e[LOCAL_BUFFER][rank])
        if saved_world != self.world_size:
            if local:
                raise ValueError(f"the checkpoint was taken by {saved_world} ranks between two synchronizations of "
                                 f"the local-step phase (each rank's weights differ); this run has {self.world_size} "
                                 "ranks: resume with the same number")
            if saved_world > 1 and self._scheme is not None:
                warnings.warn(f"0/1 Adam resumes {saved_world}-rank error-feedback state on {self.world_size} ranks: "
                              "the error buffers restart from zero", stacklevel=3)
            if self._scheme is not None:
                self._scheme.traffic.load_state_dict(traffic)
            return
        if local:
            views = self._layout.views(self._layout.whole, self._flat["exp_avg"])
            for p, view, e in zip(self._layout.params, views, entries):
                view.copy_(e["local_exp_avg"][rank])
                own = e["local_param"][rank].to(p.device)
                with torch.no_grad():
                    p.copy_(own)
                self._restored_params[p] = own
        if self._scheme is None:
            return
        chunk = error_feedback_chunk_numel(self._layout.numel, self.world_size, self._codec)
        device = self._flat["exp_avg"].device
        worker = torch.zeros(self.world_size * chunk, device=device)
        servers = torch.zeros(self.world_size * chunk, device=device)
        for view, e in zip(self._layout.views(self._layout.whole, worker), entries):
            view.copy_(e["worker_error"][rank])
        for view, e in zip(self._layout.views(self._layout.whole, servers), entries):
            view.copy_(e["server_error"])
        self._scheme.load_state_dict({"traffic": traffic, "worker_error": worker,
                                      "server_error": servers[rank * chunk : (rank + 1) * chunk]})


def _update_bound(group: dict[str, Any]) -> float:
    """The largest ``|m_hat / (sqrt(v_hat) + eps)|`` an element may take: ``sqrt((1 - beta1) / (1 - beta2))``, at
    least 1.

    Adam whose variance is updated at every step with the gradients its momentum averages never exceeds it (for
    beta1 <= beta2): ``m_hat^2 <= sum_i w1_i g_i^2`` (Cauchy-Schwarz over the momentum's weights ``w1_i``), and
    each ``w1_i <= (1 - beta1) / (1 - beta2) * w2_i``, the variance's weights. A stale or frozen variance has no
    such bound: a gradient far above the last variance update gives a step of hundreds of learning rates.
    """
    beta1, beta2 = group["betas"]
    return max(1.0, math.sqrt((1 - beta1) / (1 - beta2)))


def _clip_norm_(flat: torch.Tensor, max_norm: float) -> torch.Tensor:
    """Scale ``flat`` in place to an L2 norm of at most ``max_norm`` (torch's ``clip_grad_norm_`` rule); returns
    the factor (a 0-dim tensor, at most 1)."""
    norm = torch.linalg.vector_norm(flat)
    factor = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    flat.mul_(factor)
    return factor


def _all_gather(tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    out = tensor.new_empty(group.size() * tensor.numel())
    dist.all_gather_into_tensor(out, tensor.contiguous(), group=group)
    return out
