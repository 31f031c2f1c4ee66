"""``SpeculativeUpdate``: send the next step's weight-difference codes during this step's backward.

With weight-difference gathers (:mod:`composer_qsdp.schemes.difference`) each step's first forward gather of a unit
sends the codes of ``w_{t+1} - w_ref``, so the forward waits on the network while the backward leaves it idle. The
new weights of a unit can be computed as soon as its gradient is reduced: its optimizer's own ``step`` run on
copies of the unit's parameters and state (a *shadow* step). The codes of that guess go out on a process group of
their own while the backward of the earlier units still computes. The guess is exact unless something between the
backward and the optimizer step changes the gradients (global-norm clipping that acts, a gradient scaler's unscale
and skip, a callback); so after the real step every rank compares the gather input the real parameters make with
the guessed one, bit for bit, and one all-reduce makes the verdict the same on every rank: where every rank guessed
right, the next gather applies the codes already received and sends nothing; elsewhere they are dropped and the
gather sends the update as usual. The trained model is the same either way, bit for bit; only where the bytes
travel changes.

When a unit's gradient is final: FSDP2 reduce-scatters the units one after another in the backward and sets a unit's
sharded gradients right after its reduce-scatter returns, so at unit ``u``'s reduce-scatter call the previous unit's
gradients are set, and its shadow step is ordered after them on the same stream. The last unit's is taken at the
optimizer's step pre-hook, or earlier where the framework says the backward is over
(:meth:`~composer_qsdp.engine.QSDPHandle.on_backward_end`: Composer runs the backward inside ``step``'s closure,
after the pre-hook). Only the backward of a step's last microbatch carries final gradients: a step is expected
to have as many microbatches as the one before it (the first step speculates nothing).

Backing off: while the gradients are clipped (the first hundreds of steps of the recipes, RESULTS.md) nearly every
guess misses and its bytes are sent twice. After a step with a miss the next ``b`` steps guess nothing, ``b``
doubling with each such step up to :data:`MAX_BACKOFF` and back to 1 after a step without one; so a clipped phase
costs a few probes' bytes, not one guess per step. The verdicts are common to all ranks, so is the back-off.

Cost per unit that speculates: the shadow step's copies of the unit's shard and optimizer state while it runs
(about 3 shard-sized fp32 tensors for Adam, one unit at a time), and until the next gather the guessed input (the
shard in the gather dtype) and the received codes (the unit's elements at the codec's bits); after the step, the real
gather input built once more and compared bit for bit, and one all-reduce of one int per unit, read by the host once
(a sync at the optimizer step).
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
import torch.distributed as dist

from composer_qsdp.comm import SeedStream, StepSeeds, twin_group
from composer_qsdp.engine.plan import UnitPlan

__all__ = ["MAX_BACKOFF", "SpeculationStats", "SpeculativeUpdate"]

#: The most steps guessed nothing after a step with a miss (module docstring).
MAX_BACKOFF = 64


@dataclass
class SpeculationStats:
    """Counts of one run's speculations, cumulative over the run (a checkpoint carries them through a resume); the
    QSDP algorithm logs each field per batch as ``qsdp/speculation/<field>``.

    Attributes:
        sent: unit updates whose codes were sent ahead.
        hits: of those, applied at the next gather (every rank's guess was exact).
        misses: dropped (a rank's real step differed); their gathers sent the update again.
        paused: steps that guessed nothing because the steps before them missed (the back-off).
    """

    sent: int = 0
    hits: int = 0
    misses: int = 0
    paused: int = 0

    @property
    def hit_rate(self) -> float:
        """``hits / sent`` (0 before any was sent)."""
        return self.hits / self.sent if self.sent else 0.0


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard, or the tensor itself."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _used_here(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, made on the reduce-scatter stream and read on the current one: its memory is kept until then."""
    if tensor.is_cuda:
        tensor.record_stream(torch.cuda.current_stream(tensor.device))
    return tensor


def _bits_differ(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A 0-dim bool device tensor: whether ``a`` and ``b`` differ in any bit (NaN payloads and signed zeros too)."""
    return (a.reshape(-1).view(torch.uint8) != b.reshape(-1).view(torch.uint8)).any()


class SpeculativeUpdate:
    """The speculative update of one handle's weight-difference units (module docstring).

    Args:
        units: the handle's units; those whose weight scheme has ``speculate`` take part.
        seeds: the handle's seed schedule (the next step's gather keys).
        parameters: ``parameters(unit_index)``, the unit's sharded parameters in the order of its gather input.
        gather_input: ``gather_input(unit_index, shards, dtype)``, this rank's all-gather input built from the local
            shards of those parameters, as the framework builds it (order, padding, cast).
        optimizers: the optimizers that update the model; every parameter a unit has must be in at most one.
    """

    def __init__(
        self,
        units: Sequence[UnitPlan],
        seeds: StepSeeds,
        parameters: Callable[[int], Sequence[torch.Tensor]],
        gather_input: Callable[[int, Sequence[torch.Tensor], torch.dtype], torch.Tensor],
        optimizers: Sequence[torch.optim.Optimizer],
    ) -> None:
        self.units = [u for u in units if hasattr(u.weights, "speculate")]
        self.seeds = seeds
        self.parameters = parameters
        self.gather_input = gather_input
        self.optimizers = list(optimizers)
        self.stats = SpeculationStats()
        self._groups = {u.index: twin_group(u.weights.group) for u in self.units}  # collective, at install
        self._by_index = {u.index: u for u in self.units}
        self._microbatches: int | None = None  # forwards in the last step
        self._ready: int | None = None  # the unit whose gradient the next reduce-scatter call finds final
        self._guesses: dict[int, torch.Tensor] = {}  # unit -> the gather input it guessed
        self._hits: list[bool] = []  # this step's verdicts, per unit of `units`
        self._pause = 0  # steps left that guess nothing
        self._backoff = 1  # the pause after the next step with a miss

    # ------------------------------------------------------------------ events
    def on_reduce_scatter(self, unit_index: int) -> None:
        """Unit ``unit_index``'s gradient reduce-scatter was issued: the previous one's gradient is final."""
        if self._pause or self._microbatches is None or self.seeds.microbatch != self._microbatches:
            return
        if self._ready is not None:
            self._speculate(self._ready)
        self._ready = unit_index

    def flush(self) -> None:
        """The backward is over (the optimizer is about to step, or the framework said so): its last unit."""
        if self._ready is not None:
            self._speculate(self._ready)
            self._ready = None

    def after_step(self) -> None:
        """The optimizer stepped (call before the schemes' ``on_optimizer_step``): check every guess against the
        gather input the real parameters make, agree on the verdicts across all ranks (collective over the default
        group: every rank calls it at every step), and remember this step's microbatches.

        Raises:
            RuntimeError: a gather that applied a speculation received another input than the one guessed.
        """
        self._microbatches = self.seeds.microbatch
        self._ready = None
        if not self.units:
            return
        guessed = set(self._guesses)
        if self._pause:
            self._pause -= 1
            self.stats.paused += 1
        device = next((g.device for g in self._guesses.values()), None) or self._device()
        misses = torch.ones(len(self.units) + 1, dtype=torch.int32, device=device)
        misses[-1] = 0
        for slot, unit in enumerate(self.units):
            guess = self._guesses.get(unit.index)
            if guess is not None:  # the real step's gather input, as the next gather will receive it
                real = self.gather_input(unit.index, [_local(p) for p in self.parameters(unit.index)], guess.dtype)
                misses[slot] = _bits_differ(real, _used_here(guess)).to(torch.int32)
            flag = unit.weights.speculation_mismatch()
            if flag is not None:
                misses[-1] |= flag.to(device)
        self._guesses.clear()
        dist.all_reduce(misses, op=dist.ReduceOp.MAX)
        verdicts = misses.tolist()
        if verdicts[-1]:
            raise RuntimeError(
                "a speculative update was applied to a gather whose input differs from the one it was computed for "
                "(the adapter's gather_input does not build the framework's all-gather input): a bug in QSDP, not "
                "in the run; turn speculative_update off")
        self._hits = [not m for m in verdicts[:-1]]
        if any(not hit for unit, hit in zip(self.units, self._hits) if unit.index in guessed):
            self._pause, self._backoff = self._backoff, min(2 * self._backoff, MAX_BACKOFF)
        elif guessed:
            self._backoff = 1

    def settle(self) -> None:
        """After the schemes' ``on_optimizer_step``: apply the verdicts of :meth:`after_step`."""
        for unit, hit in zip(self.units, self._hits):
            if unit.weights.speculating:
                if unit.weights.settle_speculation(hit):
                    self.stats.hits += 1
                else:
                    self.stats.misses += 1
        self._hits = []

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        """The counts and the back-off, so that a resumed run keeps counting and guessing as it would have. Guesses
        waiting for their gather are not saved: a resumed gather sends its update."""
        return {"stats": asdict(self.stats), "pause": self._pause, "backoff": self._backoff,
                "microbatches": self._microbatches}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        self.stats = SpeculationStats(**{f.name: int(state["stats"].get(f.name, 0)) for f in fields(SpeculationStats)})
        self._pause, self._backoff = int(state["pause"]), int(state["backoff"])
        self._microbatches = state["microbatches"]

    # ------------------------------------------------------------------ the guess
    def _speculate(self, unit_index: int) -> None:
        unit = self._by_index.get(unit_index)
        if unit is None or not unit.weights.can_speculate:
            return
        params = list(self.parameters(unit_index))
        guessed = self._shadow_step(params)
        if guessed is None:
            return
        reference = unit.weights.reference
        shards = [guessed[id(p)] for p in params]
        expected = self.gather_input(unit_index, shards, reference.dtype)
        seed = self.seeds.next_step_seed(unit_index, unit.weights.seed_stream)
        if unit.weights.speculate(expected, seed, self._groups[unit_index]):
            self._guesses[unit_index] = expected
            self.stats.sent += 1

    def _shadow_step(self, params: Sequence[torch.Tensor]) -> dict[int, torch.Tensor] | None:
        """Each parameter's local shard after its optimizer's ``step`` run on copies of the parameters and their
        state (the optimizer's own code, its hooks left out); ``None`` where a parameter that an optimizer updates
        has no gradient yet. Parameters no optimizer holds keep their value."""
        guessed: dict[int, torch.Tensor] = {id(p): _local(p).detach() for p in params}
        wanted = set(guessed)
        for optimizer in self.optimizers:
            for group in optimizer.param_groups:
                mine = [p for p in group["params"] if id(p) in wanted]
                if not mine:
                    continue
                if any(p.grad is None for p in mine):
                    return None
                copies = [p.detach().clone() for p in mine]
                for c, p in zip(copies, mine):
                    c.grad = p.grad
                # A copy through the optimizer's pickling state: its defaults, no hooks of its own (QSDP's step
                # hooks must not see the shadow's step) and no instance `step` (an LR scheduler's wrapper, bound to
                # the real optimizer).
                shadow = copy.copy(optimizer)
                shadow.param_groups = [{**{k: v for k, v in group.items() if k != "params"}, "params": copies}]
                shadow.state = defaultdict(dict, {
                    c: {k: v.clone() if torch.is_tensor(v) else copy.copy(v) for k, v in optimizer.state[p].items()}
                    for c, p in zip(copies, mine)})
                shadow.step()
                guessed.update({id(p): _local(c) for c, p in zip(copies, mine)})
        return guessed

    def _device(self) -> torch.device:
        """Where the verdicts' all-reduce runs: the references' device, or the one the default group's backend
        needs."""
        for unit in self.units:
            if unit.weights.reference is not None:
                return unit.weights.reference.device
        if dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")
