"""The automatic policy at run time (``QSDPConfig.from_preset(policy="auto")``): measure, agree, decide, reconfigure, re-check.

:class:`AutoPolicy` drives a :class:`~composer_qsdp.engine.QSDPHandle` whose units start unquantized (the safe
setting: exact, and what the timings are taken with). Its :meth:`AutoPolicy.on_step_end` is called at every
optimizer-step boundary, on every rank:

1. Steps ``1 .. warmup_steps`` run unquantized. From the end of step 1 (the first step pays for allocations and
   lazy initialization) it times every unit's forward (:class:`ForwardTimer`), counts microbatches and each
   unit's gathers per microbatch (FSDP's re-gather for backward, or none), and the step time.
2. At the end of step ``warmup_steps``: every rank's numbers are all-reduced to their maximum, the network is probed
   (:func:`probe_network`: each candidate's real collective on the units' FSDP group at three sizes, timings
   all-reduced to their maximum, a latency + bandwidth line fitted per candidate),
   :func:`~composer_qsdp.auto.choice.decide` chooses, and the handle is reconfigured, all at this step boundary.
   Every input of the decision is identical on every rank, so the decision is too.
3. The next step is skipped (a new difference scheme's first gather is a full-precision keyframe), then the steps
   up to ``2 * warmup_steps`` are timed again. When their mean differs from the prediction by more than
   ``recheck_tolerance`` (relative), it measures the network again, uses the forward times of this window and
   decides once more (``"rechecked"``); otherwise it keeps the choice (``"confirmed"``). Then it stops measuring.

The network is probed at the end of the warm-up rather than at install: only then are the dtypes FSDP sends
known (mixed precision) and the device warm, and the re-check probes the same way.

Backward compute is ``backward_ratio`` x the measured forward (2: a layer's backward does twice its forward's
matrix-product FLOPs; 3 with activation checkpointing): timing backward per unit would need hooks inside FSDP's
own backward machinery, and the whole backward's wall time includes the waits the model is meant to predict.
On FSDP1 the forward window includes the wait for the unit's weights (FSDP1 gathers inside ``forward``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from composer_qsdp.comm import Topology
from composer_qsdp.auto.choice import (Candidate, Decision, LinkFit, UnitProfile, candidates, decide, fit_link,
                                       pack_profiles, predict_step, unpack_profiles)
from composer_qsdp.config.options import AutoOptions
from composer_qsdp.engine.handle import QSDPHandle

__all__ = ["AutoPolicy", "AutoRecord", "ForwardTimer", "probe_network", "probe_sizes"]

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------- network probe
def probe_sizes(numels: Sequence[int], world_size: int, max_numel: int = 2**24, points: int = 3) -> list[int]:
    """Probe message sizes (elements, multiples of ``world_size``): the largest unit capped at ``max_numel``, and
    that divided by 4, 16... (``points`` sizes, ascending, at least ``1024 * world_size`` and distinct)."""
    top = max(min(max(numels), max_numel), 4 ** (points - 1) * 1024 * world_size)
    sizes = {-(-(top // 4**k) // world_size) * world_size for k in range(points)}
    return sorted(sizes)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def probe_network(
    group: dist.ProcessGroup,
    candidates: Sequence[Candidate],
    sizes: Sequence[int],
    *,
    weight_dtype: torch.dtype,
    grad_dtype: torch.dtype,
    device: torch.device,
    topology: Topology | None = None,
    repeats: int = 3,
) -> tuple[dict[str, LinkFit], dict[str, list[tuple[int, float]]]]:
    """Time each candidate's collective on ``group`` at each size and fit a :class:`LinkFit` per candidate.

    Collective: every rank of ``group`` calls it with the same arguments. Each (candidate, size) gets a new scheme
    (a stateful one, such as the ``loco`` scheme's per-unit residual, serves one message size), one untimed call, a
    barrier, then ``repeats`` calls timed one by one (host clock around device syncs), of which the median
    counts. Every rank's medians are all-reduced to their maximum (a collective ends when its slowest rank does),
    so every rank fits the same lines.
    Cost: ``len(candidates) * len(sizes) * (repeats + 1)`` collectives of up to ``max(sizes)`` elements.

    Args:
        group: the units' FSDP (shard) group.
        candidates: what to time (:meth:`Candidate.probe_candidate` of each is what runs).
        sizes: unsharded message sizes, elements (multiples of the group size).
        weight_dtype, grad_dtype: the dtypes FSDP all-gathers and reduce-scatters.
        device: where the messages live (the device FSDP communicates from).
        topology: the run's topology (default: one node).
        repeats: timed calls per size.

    Returns:
        ``{candidate key: LinkFit}`` and the samples ``{candidate key: [(wire bytes per rank, seconds)]}``.
    """
    world = group.size()
    topology = topology or Topology.detect(world_size=dist.get_world_size())
    gen = torch.Generator(device="cpu").manual_seed(1234)
    wire: dict[str, list[int]] = {}
    seconds: list[float] = []
    for candidate in candidates:
        wire[candidate.key] = []
        for numel in sizes:
            scheme = candidate.probe_candidate().build()
            scheme.setup(group, topology)
            n = numel // world
            if candidate.side == "weights":
                shard = torch.randn(n, generator=gen).to(device=device, dtype=weight_dtype)
                out = torch.empty(numel, device=device, dtype=weight_dtype)

                def call(seed: int) -> Any:
                    return scheme.all_gather(out, shard, seed)  # type: ignore[union-attr]
            else:
                full = torch.randn(numel, generator=gen).to(device=device, dtype=grad_dtype)
                out = torch.empty(n, device=device, dtype=grad_dtype)

                def call(seed: int) -> Any:
                    return scheme.reduce_scatter(out, full, dist.ReduceOp.AVG, seed)  # type: ignore[union-attr]
            traffic = call(0)
            # A barrier on the device (NCCL's barrier must guess the device): every rank starts timing together.
            dist.all_reduce(torch.zeros(1, device=device), group=group)
            _sync(device)
            calls = []
            for r in range(repeats):  # one at a time, the median: robust to a stray slow call
                start = time.perf_counter()
                call(r + 1)
                _sync(device)
                calls.append(time.perf_counter() - start)
            seconds.append(statistics.median(calls))
            wire[candidate.key].append(traffic.sent)
    times = torch.tensor(seconds, dtype=torch.float64, device=device)
    dist.all_reduce(times, op=dist.ReduceOp.MAX, group=group)
    times_list = times.tolist()
    samples: dict[str, list[tuple[int, float]]] = {}
    for i, candidate in enumerate(candidates):
        row = times_list[i * len(sizes):(i + 1) * len(sizes)]
        samples[candidate.key] = list(zip(wire[candidate.key], row))
    return {key: fit_link(rows) for key, rows in samples.items()}, samples


# ---------------------------------------------------------------------------------------------- compute timer
class ForwardTimer:
    """Each unit's forward compute, excluding its nested units and its wait for weights (module forward hooks).

    Per unit, an *inner* window runs from after FSDP's pre-forward hook (weights gathered: on CUDA the compute
    stream has waited for them) to before FSDP's post-forward hook, and an *outer* window around both hooks. A
    unit's compute is its inner windows minus the outer windows of the units directly nested in it. Stamps are
    ``time.perf_counter`` on CPU and CUDA events on the compute stream on GPU (read, with one sync, at
    :meth:`stop`). Only training-mode forwards count (evaluation is not the step being tuned).

    Args:
        handle: the handle whose units to time.
    """

    def __init__(self, handle: QSDPHandle) -> None:
        self.units = handle.units
        param = self.units[0].params[0] if self.units[0].params else None
        self.device = param.device if param is not None else torch.device("cpu")
        self.active = False
        self.microbatches = 0
        self._hooks: list[torch.utils.hooks.RemovableHandle] = []
        self._children = self._direct_children()
        self._stamps: list[dict[str, list[Any]]] = []
        self._calls_at_start: list[int] = []
        self._reset()
        for i, unit in enumerate(self.units):
            module = unit.module
            self._hooks += [
                module.register_forward_pre_hook(self._stamper(i, "outer_start"), prepend=True),
                module.register_forward_pre_hook(self._stamper(i, "inner_start")),
                module.register_forward_hook(self._stamper(i, "inner_end"), prepend=True),
                module.register_forward_hook(self._stamper(i, "outer_end")),
            ]
        self._hooks.append(handle.model.register_forward_pre_hook(self._count_microbatch))

    def _direct_children(self) -> list[list[int]]:
        inside = [{id(m) for m in unit.module.modules()} - {id(unit.module)} for unit in self.units]
        children = []
        for i in range(len(self.units)):
            nested = [j for j in range(len(self.units)) if id(self.units[j].module) in inside[i]]
            children.append([j for j in nested if not any(id(self.units[j].module) in inside[k] for k in nested)])
        return children

    def _reset(self) -> None:
        self._stamps = [{k: [] for k in ("outer_start", "inner_start", "inner_end", "outer_end")} for _ in self.units]
        self.microbatches = 0
        self._calls_at_start = [u.weights.traffic.calls for u in self.units]

    def _now(self) -> Any:
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _stamper(self, index: int, kind: str) -> Callable[..., None]:
        def hook(module: nn.Module, *_: Any) -> None:
            stamps = self._stamps[index]
            if not self.active or not module.training:
                return
            if kind.endswith("_end") and len(stamps[kind]) >= len(stamps[kind.replace("_end", "_start")]):
                return  # a forward that started before the timer did
            stamps[kind].append(self._now())
        return hook

    def _count_microbatch(self, module: nn.Module, *_: Any) -> None:
        if self.active and module.training:
            self.microbatches += 1

    def start(self) -> None:
        """Start a new measurement window."""
        self._reset()
        self.active = True

    def stop(self) -> tuple[list[float], list[float], int]:
        """End the window: each unit's forward seconds per microbatch, its weight gathers per microbatch, and the
        microbatches counted (syncs the device once on GPU)."""
        self.active = False
        _sync(self.device)
        totals = [{kind: sum(self._elapsed(a, b) for a, b in zip(s[f"{kind}_start"], s[f"{kind}_end"]))
                   for kind in ("inner", "outer")} for s in self._stamps]
        micro = max(self.microbatches, 1)
        forward = [max(totals[i]["inner"] - sum(totals[c]["outer"] for c in self._children[i]), 0.0) / micro
                   for i in range(len(self.units))]
        gathers = [(u.weights.traffic.calls - before) / micro for u, before in zip(self.units, self._calls_at_start)]
        return forward, gathers, self.microbatches

    @staticmethod
    def _elapsed(start: Any, end: Any) -> float:
        if isinstance(start, float):
            return end - start
        return start.elapsed_time(end) / 1e3

    def remove(self) -> None:
        """Drop the hooks."""
        self.active = False
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()


# ---------------------------------------------------------------------------------------------- the policy
@dataclass(frozen=True)
class AutoRecord:
    """What the policy did at one step boundary (for logs).

    Attributes:
        event: ``"decided"`` (the first decision), ``"rechecked"`` (the measured step missed the prediction by
            more than the tolerance: measured and decided again) or ``"confirmed"`` (it did not).
        step: optimizer steps since the policy started.
        decision: the decision now in force.
        measured_step_s: mean step time of the window just measured (s; all ranks' maximum).
        predicted_step_s: the step time predicted for the decision now in force (s): the schedule's forward and
            backward plus the measured remainder (optimizer, data loading...).
        overhead_s: that remainder (s): the window's measured step minus the schedule's prediction for it.
        network: the fitted collectives (``"confirmed"``: those of the decision).
        units: the unit profiles the decision used.
        microbatches: microbatches per optimizer step.
        changed: units whose schemes were replaced.
        unit_names: the units' names, in unit order.
    """

    event: str
    step: int
    decision: Decision
    measured_step_s: float
    predicted_step_s: float
    overhead_s: float
    network: Mapping[str, LinkFit]
    units: Sequence[UnitProfile]
    microbatches: int
    changed: int
    unit_names: Sequence[str]

    def metrics(self) -> dict[str, float]:
        """Numbers to log (``qsdp/auto/...``)."""
        d = self.decision
        out = {
            "qsdp/auto/step": float(self.step),
            "qsdp/auto/rechecked": float(self.event == "rechecked"),
            "qsdp/auto/measured_step_s": self.measured_step_s,
            "qsdp/auto/predicted_step_s": self.predicted_step_s,
            "qsdp/auto/predicted_plain_step_s": d.plain_step_s + self.overhead_s,
            "qsdp/auto/predicted_speedup": (d.plain_step_s + self.overhead_s) / self.predicted_step_s,
            "qsdp/auto/units_changed": float(self.changed),
        }
        for side, counts in d.counts().items():
            out.update({f"qsdp/auto/{side}/{name}": float(k) for name, k in counts.items()})
        for key, fit in self.network.items():  # "weights:w8" -> ".../weights/w8/...": no ':' in metric names (MLflow)
            name = key.replace(":", "/")
            out[f"qsdp/auto/network/{name}/latency_s"] = fit.latency_s
            out[f"qsdp/auto/network/{name}/gbytes_per_s"] = fit.bytes_per_s / 1e9
        return out

    def choice(self) -> dict[str, str]:
        """``{unit name: "<weights>/<grads>"}``."""
        return {(name or "<root>"): f"{w}/{g}"
                for name, w, g in zip(self.unit_names, self.decision.weights, self.decision.grads)}

    def message(self) -> str:
        """A readable log line."""
        network = ", ".join(f"{key} {fit.bytes_per_s / 1e9:.3g} GB/s + {fit.latency_s * 1e6:.0f} us"
                            for key, fit in self.network.items())
        return (f"QSDP auto {self.event} at step {self.step}: {self.decision.summary()}; measured step "
                f"{self.measured_step_s * 1e3:.2f} ms, predicted {self.predicted_step_s * 1e3:.2f} ms with the "
                f"choice (remainder {self.overhead_s * 1e3:.2f} ms, {self.microbatches} microbatch(es)); "
                f"{self.changed} unit(s) reconfigured; network: {network}")


class AutoPolicy:
    """Measure, decide and reconfigure a handle's units (module docstring). Call :meth:`on_step_end` after every
    optimizer step, on every rank.

    Args:
        handle: a handle whose units are unquantized (units excluded by the configuration stay so).
        options: :class:`AutoOptions`.
        weight_candidates, grad_candidates: candidates given as objects (tests, candidates outside the registry),
            most accurate first; ``None`` (default): those ``options`` names, from
            :data:`composer_qsdp.registry.CANDIDATES`.
        network: injected instead of probing (tests, or a network measured elsewhere): ``network(policy)`` returns
            a :class:`LinkFit` per candidate key.
        forward_times: injected instead of timing: ``forward_times(policy)`` returns each unit's forward seconds per
            microbatch.

    Attributes:
        records: every :class:`AutoRecord` so far.
        current: each unit's ``(weights, grads)`` candidate names in force.
    """

    def __init__(
        self,
        handle: QSDPHandle,
        options: AutoOptions | None = None,
        *,
        weight_candidates: Sequence[Candidate] | None = None,
        grad_candidates: Sequence[Candidate] | None = None,
        network: Callable[[AutoPolicy], Mapping[str, LinkFit]] | None = None,
        forward_times: Callable[[AutoPolicy], Sequence[float]] | None = None,
    ) -> None:
        if any(u.quantized for u in handle.units):
            raise ValueError("the automatic policy starts from unquantized units; build the handle with "
                             "weight_bits=None and grad_bits=None")
        self.handle = handle
        self.options = options or AutoOptions()
        given = {"weights": weight_candidates, "grads": grad_candidates}
        named = {"weights": self.options.weight_candidates, "grads": self.options.grad_candidates}
        self.candidates = {side: tuple(given[side]) if given[side] is not None else candidates(side, named[side])
                           for side in given}
        self._network_fn = network
        self._forward_fn = forward_times
        n = len(handle.units)
        self.locked = [u.index for u in handle.units if u.note]
        self.current: list[tuple[str, str]] = [("off", "off")] * n
        self.records: list[AutoRecord] = []
        self.step = 0
        self.phase = "warmup"
        self._decision: Decision | None = None
        self._decided_at = 0
        self._predicted = math.nan
        self._window_start = 0.0
        self._window_steps = 0
        self._calls_at_start = [0] * n
        self.timer = ForwardTimer(handle)
        self.device = self.timer.device
        # A root unit (the first, holding every other: FSDP2's root, e.g. embeddings and a tied head) runs its head
        # first in backward and reduces last (FSDP2's final callback).
        inside_first = {id(m) for m in handle.units[0].module.modules()}
        root = n > 1 and all(id(u.module) in inside_first for u in handle.units[1:])
        self._backward_order = [0, *range(n - 1, 0, -1)] if root else None
        self._reduce_at_end = (0,) if root else ()

    # ------------------------------------------------------------------ events
    def on_step_end(self) -> AutoRecord | None:
        """An optimizer step ended (every rank, same place). Returns a record when the policy decided or
        re-checked at this boundary, else ``None``."""
        self.step += 1
        w = self.options.warmup_steps
        if self.phase == "warmup":
            if self.step == 1:
                self._start_window()
            elif self.step == w:
                return self._decide("decided")
        elif self.phase == "check":
            if self.step == self._decided_at + 1:
                self._start_window()
            elif self.step == self._decided_at + w:
                return self._recheck()
        return None

    def remove(self) -> None:
        """Stop measuring (drops the timer's hooks)."""
        self.timer.remove()
        self.phase = "done"

    # ------------------------------------------------------------------ measuring
    def _now(self) -> float:
        _sync(self.device)
        return time.perf_counter()

    def _start_window(self) -> None:
        self.timer.start()
        self._window_steps = self.step
        self._window_start = self._now()

    def _measure(self) -> tuple[list[UnitProfile], int, float]:
        """The window's unit profiles, microbatches per step and mean step time, maxima over all ranks."""
        step_s = (self._now() - self._window_start) / (self.step - self._window_steps)
        forward, gathers, micro = self.timer.stop()
        if self._forward_fn is not None:
            forward = [float(x) for x in self._forward_fn(self)]
        ratio = self.options.backward_ratio
        units = [UnitProfile(u.name, u.numel, f, ratio * f, g > 1.5)
                 for u, f, g in zip(self.handle.units, forward, gathers)]
        steps = self.step - self._window_steps
        packed = pack_profiles(units, [step_s, micro / steps]).to(self._reduce_device())
        if dist.is_initialized():
            dist.all_reduce(packed, op=dist.ReduceOp.MAX)
        units, (step_s, micro_per_step) = unpack_profiles(units, packed.cpu())
        return units, max(round(micro_per_step), 1), step_s

    def _reduce_device(self) -> torch.device:
        return self.device if self.device.type == "cuda" else torch.device("cpu")

    def _dtypes(self) -> tuple[torch.dtype, torch.dtype]:
        dtypes = self.handle.wire_dtypes
        fallback = self.handle.units[0].params[0].dtype if self.handle.units[0].params else torch.float32
        return dtypes.get("weights", fallback), dtypes.get("grads", fallback)

    def _network(self) -> dict[str, LinkFit]:
        if self._network_fn is not None:
            return dict(self._network_fn(self))
        weight_dtype, grad_dtype = self._dtypes()
        group = self.handle.units[0].weights.group
        assert group is not None
        sizes = probe_sizes([u.numel for u in self.handle.units], group.size(), self.options.probe_max_numel)
        candidates = [*self.candidates["weights"], *self.candidates["grads"]]
        fits, _ = probe_network(group, candidates, sizes, weight_dtype=weight_dtype, grad_dtype=grad_dtype,
                                device=self.device, topology=self.handle.topology, repeats=self.options.probe_repeats)
        return fits

    # ------------------------------------------------------------------ deciding
    def _predict(self, units: Sequence[UnitProfile], network: Mapping[str, LinkFit], micro: int,
                 choice: Sequence[tuple[str, str]]) -> float:
        by_name = {side: {c.name: c for c in cands} for side, cands in self.candidates.items()}
        weights = [by_name["weights"][w] for w, _ in choice]
        grads = [by_name["grads"][g] for _, g in choice]
        return predict_step(units, network, weights, grads, **self._model_kwargs(micro))

    def _model_kwargs(self, micro: int) -> dict[str, Any]:
        weight_dtype, grad_dtype = self._dtypes()
        group = self.handle.units[0].weights.group
        return {"world_size": group.size() if group is not None else dist.get_world_size(),
                "weight_element_size": weight_dtype.itemsize, "grad_element_size": grad_dtype.itemsize,
                "microbatches": micro, "backward_order": self._backward_order, "reduce_at_end": self._reduce_at_end}

    def _decide(self, event: str) -> AutoRecord:
        units, micro, measured = self._measure()
        network = self._network()
        overhead = max(measured - self._predict(units, network, micro, self.current), 0.0)
        kwargs = self._model_kwargs(micro)
        decision = decide(units, network, weight_candidates=self.candidates["weights"],
                          grad_candidates=self.candidates["grads"], min_gain=self.options.min_gain,
                          locked=self.locked, **kwargs)
        changed = self.apply(decision.weights, decision.grads)
        self._decision, self._decided_at = decision, self.step
        self._predicted = decision.step_s + overhead
        self.phase = "check" if event == "decided" else "done"
        if self.phase == "done":
            self.timer.remove()
        record = AutoRecord(event, self.step, decision, measured, self._predicted, overhead, network, units, micro,
                            changed, [u.name for u in self.handle.units])
        self.records.append(record)
        log.info(record.message())
        return record

    def _recheck(self) -> AutoRecord:
        assert self._decision is not None
        tolerance = self.options.recheck_tolerance
        step_s = (self._now() - self._window_start) / (self.step - self._window_steps)
        off_by = torch.tensor([step_s], dtype=torch.float64, device=self._reduce_device())
        if dist.is_initialized():
            dist.all_reduce(off_by, op=dist.ReduceOp.MAX)
        measured = float(off_by.item())
        if abs(measured - self._predicted) > tolerance * self._predicted:
            return self._decide("rechecked")  # with this window's forward timings and a new probe
        self.timer.remove()
        self.phase = "done"
        last = self.records[-1]
        record = dataclasses.replace(last, event="confirmed", step=self.step, measured_step_s=measured, changed=0)
        self.records.append(record)
        log.info(record.message())
        return record

    def apply(self, weights: Sequence[str], grads: Sequence[str]) -> int:
        """Put each unit on the named candidates (collective, at a step boundary: every rank, same names).
        Returns how many units changed.

        Raises:
            ValueError: a name that is not a candidate of its side, or the wrong number of names.
        """
        if len(weights) != len(self.current) or len(grads) != len(self.current):
            raise ValueError(f"apply needs {len(self.current)} weight and gradient names, got {len(weights)} and "
                             f"{len(grads)}")
        by_name = {side: {c.name: c for c in cands} for side, cands in self.candidates.items()}
        interval = self.handle.config.error_sample_interval
        schemes: list[tuple[Any, Any]] = []
        for (w_old, g_old), w, g in zip(self.current, weights, grads):
            for side, name in (("weights", w), ("grads", g)):
                if name not in by_name[side]:
                    raise ValueError(f"{side} candidate {name!r} is unknown; allowed: {', '.join(by_name[side])}")
            schemes.append((by_name["weights"][w].build(interval) if w != w_old else None,
                            by_name["grads"][g].build(interval) if g != g_old else None))
        changed = sum(any(s is not None for s in pair) for pair in schemes)
        if changed:
            self.handle.reconfigure(schemes)
        self.current = list(zip(weights, grads))
        return changed

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        """The choice in force and where the policy is, so a resumed run continues with the same schemes."""
        return {"step": self.step, "phase": self.phase, "weights": [w for w, _ in self.current],
                "grads": [g for _, g in self.current]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output (before the handle's own state, whose schemes it chooses). A run
        saved after its decision keeps that decision and measures no more; one saved before measures afresh."""
        if state["phase"] == "warmup":
            return
        self.apply(state["weights"], state["grads"])
        self.step = int(state["step"])
        self.remove()
