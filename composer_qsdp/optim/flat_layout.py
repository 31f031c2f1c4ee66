"""``FlatLayout``: the trainable parameters of an optimizer laid out one after the other in one flat vector.

Every parameter starts at a multiple of ``align`` elements (a codec bucket), so that no bucket of the layout holds
two tensors' elements; the gaps between parameters carry no data and are zeros wherever the layout builds a flat
tensor. Parameters are added group by group; each group owns one contiguous slice. Every rank that builds the
layout over the same parameters in the same order gets the same offsets, which is what lets ranks communicate flat
buffers of it.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

__all__ = ["FlatLayout"]


class FlatLayout:
    """Where each trainable parameter sits in one flat vector, and the copies between the two.

    Attributes:
        align: every parameter's offset is a multiple of it (1: packed).
        params: the parameters, in layout order.
        offsets: each parameter's first element in the layout.
        numel: the layout's length, gaps included.
        slices: each group's part of the layout, in the order the groups were added.
    """

    def __init__(self, align: int) -> None:
        self.align = align
        self.params: list[torch.Tensor] = []
        self.offsets: list[int] = []
        self.numel = 0
        self.slices: list[slice] = []

    def add_group(self, params: Iterable[torch.Tensor]) -> None:
        """Append one group's parameters, each from the next multiple of ``align``."""
        start = self.numel
        for p in params:
            self.params.append(p)
            self.offsets.append(self.numel)
            self.numel += -(-p.numel() // self.align) * self.align
        self.slices.append(slice(start, self.numel))

    @property
    def whole(self) -> slice:
        """The whole layout."""
        return slice(0, self.numel)

    @property
    def device(self) -> torch.device:
        """The parameters' device (the CPU for a layout without parameters)."""
        return self.params[0].device if self.params else torch.device("cpu")

    def params_in(self, part: slice) -> list[tuple[torch.Tensor, int]]:
        """The parameters inside ``part`` of the layout, with their offsets in ``part``."""
        return [(p, o - part.start) for p, o in zip(self.params, self.offsets) if part.start <= o < part.stop]

    def views(self, part: slice, flat_values: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's view of ``flat_values``, laid out like ``part`` of the layout."""
        return [flat_values[o : o + p.numel()].view_as(p) for p, o in self.params_in(part)]

    def bucket_slice(self, p: torch.Tensor, offset: int) -> slice:
        """The buckets (of ``align`` elements) of parameter ``p``, which starts at ``offset`` of the layout."""
        return slice(offset // self.align, (offset + p.numel() - 1) // self.align + 1)

    def bucket_views(self, per_bucket: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's view of a per-bucket tensor of the whole layout (its buckets, 1-D)."""
        return [per_bucket[self.bucket_slice(p, o)] for p, o in zip(self.params, self.offsets)]

    def bucket_part(self, part: slice) -> slice:
        """The buckets of ``part`` (a group's slice) in a per-bucket tensor of the whole layout."""
        return slice(part.start // self.align, part.stop // self.align)

    def mask(self, indices: Iterable[int]) -> torch.Tensor:
        """A boolean flat tensor: True on the elements of the parameters at ``indices`` (of :attr:`params`)."""
        mask = torch.zeros(self.numel, dtype=torch.bool, device=self.device)
        views = self.views(self.whole, mask)
        for index in indices:
            views[index].fill_(True)
        return mask

    def valid(self) -> torch.Tensor:
        """A boolean flat tensor: True on the elements that belong to a parameter, False in the gaps."""
        return self.mask(range(len(self.params)))

    def flat_params(self, part: slice) -> torch.Tensor:
        """A new flat tensor laid out like ``part``: the values of its parameters, zeros in the gaps."""
        flat = torch.zeros(part.stop - part.start, device=self.device)
        torch._foreach_copy_(self.views(part, flat), [p.detach() for p, _ in self.params_in(part)])
        return flat

    def flat_grads(self) -> torch.Tensor:
        """The gradients in the whole layout (zeros in the gaps, and for parameters without a gradient).

        Raises:
            RuntimeError: a sparse gradient.
        """
        flat = torch.zeros(self.numel, device=self.device)
        pairs = [(view, p.grad) for view, p in zip(self.views(self.whole, flat), self.params) if p.grad is not None]
        if any(g.is_sparse for _, g in pairs):
            raise RuntimeError("ZeroOneAdam does not support sparse gradients")
        if pairs:
            torch._foreach_copy_([v for v, _ in pairs], [g for _, g in pairs])
        return flat

    def add_to_params(self, part: slice, flat_values: torch.Tensor, alpha: float) -> None:
        """``p += alpha * values`` for the parameters of ``part``, ``flat_values`` laid out like ``part``."""
        torch._foreach_add_([p for p, _ in self.params_in(part)], self.views(part, flat_values), alpha=alpha)

    def copy_to_params(self, flat_values: torch.Tensor) -> None:
        """Set every parameter to its elements of the whole flat ``flat_values``."""
        torch._foreach_copy_(self.params, self.views(self.whole, flat_values))
