"""The unit the difference scheme's multi-rank tests gather: one 1-D parameter of :data:`P` elements, padded with
zeros to ``W`` shards as FSDP pads it, and its weights along a training run (a random walk, halved at
:data:`EDIT_AT` as an edit outside the optimizer would)."""

from __future__ import annotations

import torch

from composer_qsdp.schemes import GatherLayout

P = 1001  # elements of the unit's one parameter: padded to whole shards on 2 and 4 ranks, no bucket divides them
EDIT_AT = 7  # on_weights_changed before this step's gathers


class Padded(GatherLayout):
    """One 1-D parameter of ``P`` elements, padded with zeros to ``W`` shards of ``ceil(P / W)``, as FSDP pads."""

    def __init__(self, world: int) -> None:
        self.n = -(-P // world)

    def segments(self):
        return [("w", self.n)]

    def shapes(self):
        return {"w": torch.Size([P])}

    def split(self, gathered):
        return {"w": gathered[:P]}

    def join(self, params, out):
        out.zero_()
        out[:P].copy_(params["w"])


def walk_weights(step: int, world: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """The padded full weights of ``step``: a fixed start plus a random walk, halved from ``EDIT_AT``."""
    w = torch.randn(P, generator=torch.Generator().manual_seed(0)) * 0.02
    for t in range(1, step + 1):
        w += 1e-3 * torch.randn(P, generator=torch.Generator().manual_seed(t))
    if step >= EDIT_AT:
        w *= 0.5
    padded = torch.zeros(world * -(-P // world))
    padded[:P] = w
    return padded.to(dtype=dtype, device=device)
