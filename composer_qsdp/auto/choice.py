"""The bandwidth-aware automatic policy (``QSDPConfig.from_preset(policy="auto")``): its model and its decision, as pure functions.

Nothing here measures or communicates: :mod:`composer_qsdp.auto.runtime` measures the run (a short probe
of each candidate collective on the FSDP group, each unit's forward time over the first steps), makes every rank
hold the same numbers (an all-reduce of the maximum), calls :func:`decide` and applies its :class:`Decision`.
So the decision can be tested with injected timings, and identical inputs give identical decisions on every rank.

**Candidates.** Per unit and side, one of a few settings, each a preset's side (the constants below, named per side
in :data:`composer_qsdp.registry.CANDIDATES`, most accurate first; :func:`candidates`). The default ones
(:data:`WEIGHT_CANDIDATES`, :data:`GRAD_CANDIDATES`) are ``off`` (unquantized) and the ``w8g8`` preset's sides, which
the seed protocol has measured inside or below plain FSDP2's range on every cell
(:data:`composer_qsdp.config.options.DEFAULT_CANDIDATES`):

* weights: ``off``, ``w8`` (8-bit min-max weights, stochastic rounding);
* gradients: ``off``, ``g8`` (8-bit min-max, stochastic).

The others are opt-in (``AutoOptions(weight_candidates=..., grad_candidates=...)``): ``qwd3`` and ``g3loco`` come from
``qwd-w3g3-loco``, lossless on every cell as a preset, but the policy's per-unit mixtures of them have not run the
protocol; ``w8g4-paper``'s gradients cost loss; ``qwd-w4g4`` has not run it:

* weights: ``qwd3`` (the ``qwd-w3g3-loco`` preset's weights: 3-bit symmetric differences in groups of 2048 against a
  per-GPU reference, SDP4Bit's qWD, Jia et al., NeurIPS 2024, §3.1), ``qwd4`` (the ``qwd-w4g4`` preset's weights:
  4-bit symmetric differences);
* gradients: ``g3loco`` (the ``qwd-w3g3-loco`` preset's gradients: 3-bit min-max, Hadamard-rotated groups of 256,
  round to nearest, with LoCo's error feedback, the ``loco`` scheme, ``beta`` 0.5, an int8 residual of about one
  byte per parameter of the unit on every rank), ``g4`` (the ``w8g4-paper`` preset's 4-bit min-max gradients,
  stochastic rounding, no state kept).

**Accuracy rule** (:func:`accuracy_violation`): weights never below :data:`MIN_DIRECT_WEIGHT_BITS` unless in the
difference scheme (whose error feedback holds for any compressor, SDP4Bit Theorem 4.1), and there not below
:data:`MIN_DIFFERENCE_WEIGHT_BITS`; gradients with error feedback not below :data:`MIN_FEEDBACK_GRAD_BITS`, rounding
either way (each call's rounding error is carried into the next call); other gradients not below
:data:`MIN_GRAD_BITS`, and below :data:`MIN_BIASED_GRAD_BITS` only with an unbiased (stochastic) codec.
:func:`decide` never picks a candidate that breaks the rule, whatever it is offered. The convergence runs behind
each bound are in the QSDP algorithm's README (section "policy=auto", *The rule* and *Default and opt-in candidates*)
and ``docs/presets.md`` (each preset's label).

**Cost of one collective** (:class:`LinkFit`): ``latency_s + wire_bytes / bytes_per_s``, fitted per candidate (its
codec kernels, launches and the transport included) on the probe's timings; wire bytes are counted as the schemes
count them (:func:`composer_qsdp.comm.call_traffic`: ``(W-1)`` chunks per rank, NCCL's convention).

**Step model** (:func:`schedule_step`, FSDP2's schedule; the same one ``benchmarks/cost_model.py`` uses): one
compute stream and one FIFO communication queue. Forward, in unit order: a unit's all-gather is issued when the
previous unit starts computing (FSDP2's one-ahead prefetch) and the unit starts when both its gather and the
previous unit are done. Backward, in ``backward_order``: the next unit's re-gather is issued when a unit starts; a
unit's reduce-scatter is issued when its backward ends (units in ``reduce_at_end`` at the very end, like FSDP2's
root). The step time is when both the compute stream and the queue are done. Left out: the optimizer, data loading
and logging (the same for every choice; :mod:`~composer_qsdp.auto.runtime` adds the measured remainder),
contention between FSDP's all-gather and reduce-scatter streams (one queue), and the codec kernels' share of the
compute stream (they run on the communication streams).

A qWD unit gathers once per optimizer step (its first forward sends the quantized difference; every other gather
of the step, backward ones included, is served from the reference), so with ``microbatches`` per step its forward
gather costs ``1 / microbatches`` of a call per microbatch and its backward re-gather nothing.

**Search.** All units off is the reference (``plain_step_s``). From the best uniform setting (every unit the same
pair, or off), one coordinate descent over (unit, side, candidate) accepts every change that lowers the predicted
step, until no change does (deterministic order; ties keep the earlier candidate, i.e. the more accurate one).
When the result is not at least ``min_gain`` faster than all-off, every unit stays off: quantizing does not pay.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import torch

from composer_qsdp.comm import call_traffic
from composer_qsdp.config.options import DEFAULT_CANDIDATES, candidate_names
from composer_qsdp.config.settings import FEEDBACK_GRAD_SCHEMES, SideConfig, from_preset
from composer_qsdp.quant import Codec
from composer_qsdp.registry import CANDIDATES
from composer_qsdp.schemes import GradScheme, WeightScheme, build_codec, build_scheme

__all__ = [
    "Candidate",
    "Decision",
    "GRAD_CANDIDATES",
    "LinkFit",
    "MIN_DIFFERENCE_WEIGHT_BITS",
    "MIN_DIRECT_WEIGHT_BITS",
    "MIN_FEEDBACK_GRAD_BITS",
    "MIN_GRAD_BITS",
    "MIN_BIASED_GRAD_BITS",
    "UnitProfile",
    "WEIGHT_CANDIDATES",
    "accuracy_violation",
    "candidate_names",
    "candidates",
    "decide",
    "fit_link",
    "pack_profiles",
    "predict_step",
    "schedule_step",
    "unpack_profiles",
]

SIDES = ("weights", "grads")
#: Directly quantized weights need at least this many bits (4-bit ones lose accuracy: SDP4Bit §3.5, Table 3).
MIN_DIRECT_WEIGHT_BITS = 8
#: Weight differences (qWD) need at least this many bits (the fewest our convergence runs cover).
MIN_DIFFERENCE_WEIGHT_BITS = 3
#: Gradients without error feedback need at least this many bits (the fewest our convergence runs cover).
MIN_GRAD_BITS = 4
#: Gradients without error feedback below this many bits need an unbiased (stochastic rounding) codec: biased
#: errors do not average out.
MIN_BIASED_GRAD_BITS = 8
#: Gradients with error feedback (a scheme of ``FEEDBACK_GRAD_SCHEMES``, rounding either way) need at least this many
#: bits (2-bit LoCo gradients lost accuracy in our convergence runs).
MIN_FEEDBACK_GRAD_BITS = 3


# ---------------------------------------------------------------------------------------------- candidates
@dataclass(frozen=True)
class Candidate:
    """One way to move one side of a unit.

    Attributes:
        name: short label in logs, decisions and ``AutoOptions`` (``"off"``, ``"w8"``, ``"qwd4"``, ``"g4"``...).
        side: ``"weights"`` or ``"grads"``.
        config: the side's settings, or ``None`` for unquantized.
    """

    name: str
    side: str
    config: SideConfig | None = None

    def __post_init__(self) -> None:
        if self.side not in SIDES:
            raise ValueError(f"Candidate side={self.side!r} is invalid; allowed: {', '.join(SIDES)}")

    @property
    def key(self) -> str:
        """``"<side>:<name>"``: the collective kind this candidate is, as :class:`LinkFit` tables key it."""
        return f"{self.side}:{self.name}"

    @property
    def bits(self) -> int | None:
        """Bits per code, ``None`` unquantized."""
        return None if self.config is None else self.config.bits

    @property
    def scheme(self) -> str | None:
        """The scheme name (``None``: the side's default)."""
        return None if self.config is None else self.config.scheme

    @property
    def gathers_once(self) -> bool:
        """One weight gather per optimizer step (the difference scheme keeps the weights between gathers)."""
        return self.side == "weights" and self.scheme == "difference"

    @functools.cached_property
    def codec(self) -> Codec | None:
        """The codec on the wire (``None``: unquantized)."""
        return None if self.config is None or self.bits is None else build_codec(self.config, self.bits)

    def wire_bytes(self, numel: int, world_size: int, element_size: int) -> int:
        """Bytes one rank sends in this candidate's collective of a unit of ``numel`` elements (NCCL convention:
        ``W-1`` chunks of ``ceil(numel / W)`` elements; ``element_size`` bytes per unquantized element)."""
        chunk = -(-numel // world_size)
        wire = chunk * element_size if self.codec is None else self.codec.wire_bytes(max(chunk, 1))
        return call_traffic(world_size, chunk, wire, element_size).sent

    def build(self, error_sample_interval: int = 0) -> WeightScheme | GradScheme:
        """A new scheme of this candidate (not set up)."""
        return build_scheme(self.side, self.config, self.bits, self.scheme, error_sample_interval)

    def probe_candidate(self) -> Candidate:
        """What the network probe times for this candidate: itself, except that the difference scheme is timed as
        a direct gather with the same codec (its steady-state call: encode, gather, decode; the reference update is
        one more memory pass)."""
        if not self.gathers_once:
            return self
        assert self.config is not None
        return dataclasses.replace(self, config=dataclasses.replace(self.config, scheme="direct", scheme_options={}))


def _preset_side(name: str, side: str, preset: str) -> Candidate:
    """The candidate ``name`` that moves ``side`` as the preset ``preset`` does."""
    return Candidate(name, side, getattr(from_preset(preset), side))


# The candidates, each named in composer_qsdp.registry.CANDIDATES (module docstring), most accurate first per side.
OFF_WEIGHTS = Candidate("off", "weights")
W8 = _preset_side("w8", "weights", "w8g8")
QWD4 = _preset_side("qwd4", "weights", "qwd-w4g4")
QWD3 = _preset_side("qwd3", "weights", "qwd-w3g3-loco")
OFF_GRADS = Candidate("off", "grads")
G8 = _preset_side("g8", "grads", "w8g8")
G4 = _preset_side("g4", "grads", "w8g4-paper")
G3LOCO = _preset_side("g3loco", "grads", "qwd-w3g3-loco")


def candidates(side: str, names: Sequence[str] | None = None) -> tuple[Candidate, ...]:
    """The candidates of ``side`` named ``names`` (``None``: every registered one, most accurate first), from
    :data:`composer_qsdp.registry.CANDIDATES`.

    Raises:
        ValueError: an unknown side or name, naming it and the allowed ones.
    """
    if side not in CANDIDATES:
        raise ValueError(f"side {side!r} is invalid; allowed: {', '.join(CANDIDATES)}")
    table = CANDIDATES[side]
    return tuple(table.lookup(name) for name in (table.names() if names is None else names))


#: The default weight candidates, most accurate first (ties keep the earlier one).
WEIGHT_CANDIDATES: tuple[Candidate, ...] = candidates("weights", DEFAULT_CANDIDATES["weights"])
#: The default gradient candidates, most accurate first.
GRAD_CANDIDATES: tuple[Candidate, ...] = candidates("grads", DEFAULT_CANDIDATES["grads"])


def accuracy_violation(candidate: Candidate) -> str | None:
    """Why ``candidate`` breaks the accuracy rule (module docstring), or ``None`` when it is allowed."""
    bits, codec = candidate.bits, candidate.codec
    if bits is None or codec is None:
        return None
    if candidate.side == "weights":
        if candidate.gathers_once:
            if bits < MIN_DIFFERENCE_WEIGHT_BITS:
                return f"weight differences below {MIN_DIFFERENCE_WEIGHT_BITS} bits are unmeasured"
        elif bits < MIN_DIRECT_WEIGHT_BITS:
            return (f"directly quantized weights below {MIN_DIRECT_WEIGHT_BITS} bits lose accuracy (SDP4Bit §3.5); "
                    "use the difference scheme")
        return None
    if candidate.scheme in FEEDBACK_GRAD_SCHEMES:
        if bits < MIN_FEEDBACK_GRAD_BITS:
            return (f"gradients with error feedback below {MIN_FEEDBACK_GRAD_BITS} bits lose accuracy in our "
                    "convergence runs (2-bit LoCo)")
        return None
    if bits < MIN_GRAD_BITS:
        return f"gradients below {MIN_GRAD_BITS} bits without error feedback are unmeasured"
    if bits < MIN_BIASED_GRAD_BITS and not codec.unbiased:
        return (f"gradients below {MIN_BIASED_GRAD_BITS} bits need stochastic (unbiased) rounding or error feedback "
                f"({', '.join(FEEDBACK_GRAD_SCHEMES)} scheme)")
    return None


# ---------------------------------------------------------------------------------------------- network
@dataclass(frozen=True)
class LinkFit:
    """One collective kind's cost: ``latency_s + wire_bytes / bytes_per_s`` seconds per call.

    Attributes:
        latency_s: fixed time per call (s): launches, codec kernels' fixed part, the transport's latency.
        bytes_per_s: effective bandwidth (bytes per second of wire bytes per rank), codec kernels included.
    """

    latency_s: float
    bytes_per_s: float

    def __post_init__(self) -> None:
        if not (self.latency_s >= 0 and self.bytes_per_s > 0 and math.isfinite(self.latency_s)):
            raise ValueError(f"LinkFit({self.latency_s!r}, {self.bytes_per_s!r}) is invalid; it needs latency_s >= 0 "
                             "and bytes_per_s > 0")

    def seconds(self, wire_bytes: float) -> float:
        """Predicted seconds of one call sending ``wire_bytes`` bytes per rank."""
        return self.latency_s + wire_bytes / self.bytes_per_s


def fit_link(samples: Sequence[tuple[float, float]]) -> LinkFit:
    """Least-squares ``seconds = latency + bytes / bandwidth`` over ``(wire_bytes, seconds)`` samples.

    A negative intercept (noise at small sizes) is clipped to 0 with the slope refitted through the origin; a
    non-positive slope (every size took the same time) means the calls are latency-bound: the bandwidth is then
    taken as 1 TB/s, beyond any link, so bytes cost next to nothing.

    Raises:
        ValueError: fewer than two distinct sizes, or a negative or non-finite time.
    """
    xs = [float(x) for x, _ in samples]
    ys = [float(y) for _, y in samples]
    if len(set(xs)) < 2:
        raise ValueError(f"fit_link needs samples at two or more sizes, got sizes {sorted(set(xs))}")
    if not all(math.isfinite(y) and y >= 0 for y in ys):
        raise ValueError(f"fit_link needs finite, non-negative times, got {ys}")
    n, sx, sy = len(xs), sum(xs), sum(ys)
    sxx, sxy = sum(x * x for x in xs), sum(x * y for x, y in zip(xs, ys))
    slope = (n * sxy - sx * sy) / (n * sxx - sx * sx)
    latency = (sy - slope * sx) / n
    if latency < 0:
        latency, slope = 0.0, sxy / sxx
    return LinkFit(latency, 1.0 / slope if slope > 0 else 1e12)


# ---------------------------------------------------------------------------------------------- step model
@dataclass(frozen=True)
class UnitProfile:
    """What the decision needs of one unit.

    Attributes:
        name: the unit's name (for logs).
        numel: unsharded parameter elements the unit communicates.
        forward_s: forward compute of one microbatch (s), excluding nested units and waits for weights.
        backward_s: backward compute of one microbatch (s).
        regathers: FSDP gathers the weights again for backward (FSDP2's root and ``reshard_after_forward=False``
            units keep them: no re-gather).
    """

    name: str
    numel: int
    forward_s: float
    backward_s: float
    regathers: bool = True


class _Queue:
    """The communication queue: collectives run one at a time, in the order they are issued."""

    def __init__(self) -> None:
        self.free = 0.0

    def run(self, issued: float, seconds: float) -> float:
        """Enqueue ``seconds`` of work at time ``issued``; returns when it is done (``issued`` for nothing)."""
        if seconds == 0:
            return issued
        self.free = max(self.free, issued) + seconds
        return self.free


def schedule_step(
    forward_s: Sequence[float],
    backward_s: Sequence[float],
    gather_s: Sequence[float],
    regather_s: Sequence[float],
    reduce_s: Sequence[float],
    backward_order: Sequence[int] | None = None,
    reduce_at_end: Collection[int] = (),
) -> float:
    """Seconds of one microbatch's forward and backward under FSDP2's schedule (module docstring).

    Raises:
        ValueError: ``backward_order`` is not a permutation of the units.

    Args:
        forward_s, backward_s: each unit's compute (s), in unit (forward) order.
        gather_s: each unit's forward all-gather (s); ``regather_s``: its backward re-gather (s); ``reduce_s``:
            its reduce-scatter (s).
        backward_order: the order units run backward (default: reverse unit order).
        reduce_at_end: units whose reduce-scatter is issued after the last backward (FSDP2's root, whose gradients
            complete last).
    """
    n = len(forward_s)
    order = list(range(n - 1, -1, -1)) if backward_order is None else list(backward_order)
    if sorted(order) != list(range(n)) or not set(reduce_at_end) <= set(order):
        raise ValueError(f"backward_order={order} and reduce_at_end={list(reduce_at_end)} must be a permutation of "
                         f"the {n} units and some of them")
    queue = _Queue()
    gpu = 0.0
    starts: list[float] = []
    for i in range(n):  # unit i's gather is issued when unit i-1 starts (one-ahead prefetch)
        done = queue.run(starts[i - 1] if i else 0.0, gather_s[i])
        starts.append(max(gpu, done))
        gpu = starts[-1] + forward_s[i]
    if order:
        ready = queue.run(gpu, regather_s[order[0]])
        for j, u in enumerate(order):
            start = max(gpu, ready)
            if j + 1 < len(order):
                ready = queue.run(start, regather_s[order[j + 1]])
            gpu = start + backward_s[u]
            if u not in reduce_at_end:
                queue.run(gpu, reduce_s[u])
    for u in reduce_at_end:
        queue.run(gpu, reduce_s[u])
    return max(gpu, queue.free)


def _side_costs(
    candidate: Candidate, unit: UnitProfile, network: Mapping[str, LinkFit], world_size: int, element_size: int,
    microbatches: int,
) -> tuple[float, float]:
    """``(forward, backward)`` seconds of ``candidate``'s collectives for ``unit``, per microbatch (weights: the
    gather and the re-gather; gradients: ``(0, reduce-scatter)``)."""
    if candidate.key not in network:
        raise ValueError(f"no network measurement for {candidate.key!r}; measured: {sorted(network)}")
    seconds = network[candidate.key].seconds(candidate.wire_bytes(unit.numel, world_size, element_size))
    if candidate.side == "grads":
        return 0.0, seconds
    if candidate.gathers_once:
        return seconds / microbatches, 0.0
    return seconds, seconds if unit.regathers else 0.0


def predict_step(
    units: Sequence[UnitProfile],
    network: Mapping[str, LinkFit],
    weights: Sequence[Candidate],
    grads: Sequence[Candidate],
    *,
    world_size: int,
    weight_element_size: int = 2,
    grad_element_size: int = 4,
    microbatches: int = 1,
    backward_order: Sequence[int] | None = None,
    reduce_at_end: Collection[int] = (),
) -> float:
    """Predicted seconds of one optimizer step's forward and backward passes (``microbatches`` of them) with
    ``weights[i]`` / ``grads[i]`` on unit ``i`` (:func:`schedule_step`; optimizer and data loading excluded)."""
    w = [_side_costs(c, u, network, world_size, weight_element_size, microbatches) for c, u in zip(weights, units)]
    g = [_side_costs(c, u, network, world_size, grad_element_size, microbatches)[1] for c, u in zip(grads, units)]
    micro = schedule_step([u.forward_s for u in units], [u.backward_s for u in units], [x[0] for x in w],
                          [x[1] for x in w], g, backward_order, reduce_at_end)
    return microbatches * micro


# ---------------------------------------------------------------------------------------------- decision
@dataclass(frozen=True)
class Decision:
    """The choice per unit and side, and what the model predicts for it.

    Attributes:
        weights: each unit's weight candidate name, in unit order.
        grads: each unit's gradient candidate name.
        step_s: predicted seconds of one step's forward and backward with this choice.
        plain_step_s: predicted seconds with every unit unquantized.
        rejected: candidates the accuracy rule refused, ``{"<side>:<name>": reason}``.
        note: why every unit stays off, when that is the outcome of a search (``""`` otherwise).
    """

    weights: tuple[str, ...]
    grads: tuple[str, ...]
    step_s: float
    plain_step_s: float
    rejected: Mapping[str, str] = dataclasses.field(default_factory=dict)
    note: str = ""

    @property
    def speedup(self) -> float:
        """Predicted plain step over this choice's step."""
        return self.plain_step_s / self.step_s if self.step_s > 0 else 1.0

    def counts(self) -> dict[str, dict[str, int]]:
        """How many units got each candidate, per side."""
        out: dict[str, dict[str, int]] = {}
        for side, names in (("weights", self.weights), ("grads", self.grads)):
            out[side] = {name: names.count(name) for name in dict.fromkeys(names)}
        return out

    def summary(self) -> str:
        """One readable line: candidates per side with unit counts, and the prediction."""
        sides = "; ".join(f"{side} " + ", ".join(f"{n} x{k}" for n, k in counts.items())
                          for side, counts in self.counts().items())
        return (f"{sides}; predicted fwd+bwd {self.step_s * 1e3:.2f} ms per step against {self.plain_step_s * 1e3:.2f} "
                f"ms unquantized ({self.speedup:.2f}x){f' ({self.note})' if self.note else ''}")


def decide(
    units: Sequence[UnitProfile],
    network: Mapping[str, LinkFit],
    *,
    world_size: int,
    weight_element_size: int = 2,
    grad_element_size: int = 4,
    weight_candidates: Sequence[Candidate] = WEIGHT_CANDIDATES,
    grad_candidates: Sequence[Candidate] = GRAD_CANDIDATES,
    microbatches: int = 1,
    min_gain: float = 0.02,
    backward_order: Sequence[int] | None = None,
    reduce_at_end: Collection[int] = (),
    locked: Collection[int] = (),
) -> Decision:
    """Choose each unit's weight and gradient candidate to minimize the predicted step time under the accuracy rule
    (module docstring). Pure and deterministic: the same inputs give the same :class:`Decision` on every rank.

    Args:
        units: the units, in unit (forward) order.
        network: a :class:`LinkFit` per candidate key (``"weights:off"``, ``"grads:g4"``...), every allowed one.
        world_size: ranks of the units' FSDP group.
        weight_element_size: bytes per element of the unquantized all-gather (bf16: 2).
        grad_element_size: bytes per element of the unquantized reduce-scatter (fp32: 4).
        weight_candidates, grad_candidates: the candidates per side, most accurate first; each must contain an
            unquantized one named ``"off"``. Candidates breaking the accuracy rule are never chosen.
        microbatches: microbatches per optimizer step.
        min_gain: the smallest predicted gain (fraction of the all-off step) worth quantizing for.
        backward_order, reduce_at_end: the schedule's (:func:`schedule_step`).
        locked: indices of units that stay off (excluded by the configuration).

    Raises:
        ValueError: bad arguments, naming them; a candidate without a network measurement.
    """
    if not units:
        raise ValueError("decide needs at least one unit")
    if not 0 <= min_gain < 1:
        raise ValueError(f"min_gain={min_gain!r} is invalid; it must be in [0, 1)")
    if microbatches < 1 or world_size < 2:
        raise ValueError(f"microbatches={microbatches!r} and world_size={world_size!r} must be >= 1 and >= 2")
    rejected: dict[str, str] = {}
    allowed: dict[str, list[Candidate]] = {}
    for side, offered in (("weights", weight_candidates), ("grads", grad_candidates)):
        if [c.name for c in offered if c.config is None] != ["off"] or any(c.side != side for c in offered):
            raise ValueError(f"{side} candidates {[c.key for c in offered]} must be {side} candidates with exactly "
                             "one unquantized one, named 'off'")
        allowed[side] = []
        for c in offered:
            reason = accuracy_violation(c)
            if reason is None:
                allowed[side].append(c)
            else:
                rejected[c.key] = reason
        allowed[side].sort(key=lambda c: c.config is not None)  # off first: the start and the tie-winner
    n = len(units)
    locked = frozenset(locked)
    kwargs = dict(world_size=world_size, weight_element_size=weight_element_size,
                  grad_element_size=grad_element_size, microbatches=microbatches, backward_order=backward_order,
                  reduce_at_end=reduce_at_end)

    def cost(choice: list[list[int]]) -> float:
        return predict_step(units, network, [allowed["weights"][i] for i in choice[0]],
                            [allowed["grads"][i] for i in choice[1]], **kwargs)

    plain = [[0] * n, [0] * n]
    plain_s = cost(plain)
    best, best_s = plain, plain_s
    for wi in range(len(allowed["weights"])):  # uniform starts: every free unit the same pair
        for gi in range(len(allowed["grads"])):
            choice = [[0 if u in locked else wi for u in range(n)], [0 if u in locked else gi for u in range(n)]]
            seconds = cost(choice)
            if seconds < best_s * (1 - 1e-9):
                best, best_s = choice, seconds
    best = [list(best[0]), list(best[1])]
    improved = True
    while improved:  # coordinate descent; every accepted move lowers the cost, so it ends
        improved = False
        for u in (u for u in range(n) if u not in locked):
            for s, side in enumerate(SIDES):
                for k in range(len(allowed[side])):
                    if k == best[s][u]:
                        continue
                    trial = [list(best[0]), list(best[1])]
                    trial[s][u] = k
                    seconds = cost(trial)
                    if seconds < best_s * (1 - 1e-9):
                        best, best_s, improved = trial, seconds, True
    note = ""
    if best != plain and best_s > plain_s * (1 - min_gain):
        note = f"quantizing gains {1 - best_s / plain_s:.1%} < min_gain {min_gain:.0%}: every unit off"
        best, best_s = plain, plain_s
    names = [tuple(allowed[side][i].name for i in best[s]) for s, side in enumerate(SIDES)]
    return Decision(names[0], names[1], best_s, plain_s, rejected, note)


# ---------------------------------------------------------------------------------------------- rank agreement
def pack_profiles(units: Sequence[UnitProfile], extra: Sequence[float] = ()) -> torch.Tensor:
    """The measured numbers of ``units`` (forward and backward seconds, re-gather flags) and ``extra`` values as
    one fp64 vector, for an all-reduce of the maximum across ranks (:func:`unpack_profiles` inverts it)."""
    values = [v for u in units for v in (u.forward_s, u.backward_s, float(u.regathers))]
    return torch.tensor([*values, *extra], dtype=torch.float64)


def unpack_profiles(units: Sequence[UnitProfile], packed: torch.Tensor) -> tuple[list[UnitProfile], list[float]]:
    """``units`` with the measured numbers of ``packed`` (:func:`pack_profiles`), and the extra values."""
    values = packed.tolist()
    out = [dataclasses.replace(u, forward_s=values[3 * i], backward_s=values[3 * i + 1],
                               regathers=values[3 * i + 2] > 0.5) for i, u in enumerate(units)]
    return out, values[3 * len(units):]
