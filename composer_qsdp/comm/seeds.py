"""Rounding-noise keys: ``mix_seed`` hashes tuples of integers (step, unit, stream, rank...) into independent
63-bit keys, and ``StepSeeds`` is the per-step schedule every adapter uses."""

from __future__ import annotations

import enum

__all__ = ["SeedStream", "StepSeeds", "mix_seed"]

_MASK64 = (1 << 64) - 1


def _splitmix64(z: int) -> int:
    # SplitMix64 finalizer: a bijection on 64-bit ints with full avalanche, so nearby tuples give unrelated keys.
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def mix_seed(*parts: int) -> int:
    """Hash integers in ``[0, 2**64)`` into one noise key in ``[0, 2**63)`` (a codec's ``seed``,
    :data:`~composer_qsdp.validate.NOISE_KEY_BITS`).

    Order matters: ``mix_seed(a, b) != mix_seed(b, a)`` in general. Used so that every (base seed, step,
    FSDP unit, weights/gradients, rank) combination draws its rounding noise from its own stream.

    Raises:
        ValueError: a part is not a non-negative integer.
    """
    h = 0
    for part in parts:
        if isinstance(part, bool) or not isinstance(part, int) or not 0 <= part <= _MASK64:
            raise ValueError(f"seed part {part!r} is invalid; seed parts must be integers in [0, 2**64)")
        h = _splitmix64(h ^ _splitmix64(part))
    return h >> 1


class SeedStream(enum.IntEnum):
    """Which traffic a key is for; part of every key so the two sides never share noise."""

    WEIGHTS = 0
    GRADS = 1


class StepSeeds:
    """The seed schedule ``mix_seed(base_seed, optimizer_step, microbatch, unit, stream)``.

    The step boundary is the optimizer step: ``optimizer_step`` counts completed optimizer steps and
    ``microbatch`` the forward passes since the last one (1 for the first). A microbatch's forward all-gather,
    its backward re-gather (FSDP's ``reshard_after_forward``) and any recomputation under activation
    checkpointing read the same key, so they decode the same weights; every microbatch of a gradient
    accumulation gets its own key, so gradient noise stays independent. The collectives mix in the rank.

    Attributes:
        base_seed: the run's ``seed``.
        optimizer_step: optimizer steps completed; saved in checkpoints.
        microbatch: forward passes since the last optimizer step; saved in checkpoints.
    """

    def __init__(self, base_seed: int) -> None:
        self.base_seed = base_seed
        self.optimizer_step = 0
        self.microbatch = 0

    def begin_microbatch(self) -> None:
        """A forward pass of the model begins (called before any unit all-gathers)."""
        self.microbatch += 1

    def end_optimizer_step(self) -> None:
        """The optimizer has updated the weights: the next forward is the first microbatch of a new step."""
        self.optimizer_step += 1
        self.microbatch = 0

    def seed(self, unit_index: int, stream: SeedStream) -> int:
        """Key of ``stream`` of unit ``unit_index`` in the current microbatch.

        Before the step's first forward (``microbatch`` 0) it is the first microbatch's key. Only gathers outside
        the model's forward run then (Composer's evaluation after a step calls the inner model): a
        weight-difference update such a gather sends is, bit for bit, the one the next training forward would
        have sent, so training after a quantized evaluation continues as without it.
        """
        return mix_seed(self.base_seed, self.optimizer_step, max(self.microbatch, 1), unit_index, int(stream))

    def next_step_seed(self, unit_index: int, stream: SeedStream) -> int:
        """Key of ``stream`` of unit ``unit_index`` in the first microbatch after the next optimizer step: the key
        that step's first gather will read, for work done ahead of it."""
        return mix_seed(self.base_seed, self.optimizer_step + 1, 1, unit_index, int(stream))

    def state_dict(self) -> dict[str, int]:
        """The counters, for checkpoints (the base seed comes from the configuration)."""
        return {"optimizer_step": self.optimizer_step, "microbatch": self.microbatch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore counters written by :meth:`state_dict`."""
        self.optimizer_step = int(state["optimizer_step"])
        self.microbatch = int(state["microbatch"])
