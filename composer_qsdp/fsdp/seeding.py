"""Per-step rounding-noise keys: the forward and backward all-gathers of one step draw the same noise."""

from __future__ import annotations

from composer_qsdp.comm import mix_seed
from composer_qsdp.fsdp.config import Side

__all__ = ["StepSeeds"]

_SIDE_INDEX = {"weights": 0, "grads": 1}


class StepSeeds:
    """Seed schedule ``mix_seed(base_seed, step, unit_index, side)``; the collectives mix in the rank.

    ``step`` counts forward passes of the model QSDP was applied to (advanced by a forward pre-hook before
    any FSDP unit all-gathers), so a microbatch's forward and its backward share one step, and the backward
    re-gather of a stochastically rounded weight reproduces the forward's weights exactly.

    Attributes:
        base_seed: the config's ``seed``.
        step: forward passes so far; saved in checkpoints so a resumed run draws the same noise.
    """

    def __init__(self, base_seed: int) -> None:
        self.base_seed = base_seed
        self.step = 0

    def advance(self) -> None:
        """Start the next step (called once per forward of the model)."""
        self.step += 1

    def seed(self, unit_index: int, side: Side) -> int:
        """Key of ``side`` of FSDP unit ``unit_index`` in the current step."""
        return mix_seed(self.base_seed, self.step, unit_index, _SIDE_INDEX[side])
