"""``FSDP1GatherLayout``: where each parameter of an FSDP1 unit sits in its all-gathered flat parameter.

FSDP1 flattens a unit's parameters into one flat parameter (each parameter's elements in order, with alignment
padding between them under ``use_orig_params=True``), pads it to a multiple of the world size and gives rank
``r`` the ``r``-th contiguous chunk. The all-gather output ``[W * n]`` is therefore the padded flat parameter
itself: parameter ``p`` is one contiguous range of it. Per-rank pieces differ between ranks (a chunk boundary
falls anywhere), so schemes that need the same pieces on every rank (``align_buckets``, ``unquantized_params``)
cannot use it.
"""

from __future__ import annotations

import math

import torch

from composer_qsdp.fsdp1.compat import FlatPiece
from composer_qsdp.schemes import GatherLayout

__all__ = ["FSDP1GatherLayout"]


class FSDP1GatherLayout(GatherLayout):
    """The all-gather layout of one FSDP1 unit.

    Args:
        pieces: the flat parameter's pieces in order (:func:`composer_qsdp.fsdp1.compat.flat_pieces`).
    """

    def __init__(self, pieces: list[FlatPiece]) -> None:
        self.entries: list[tuple[str, torch.Size, int]] = []  # (key, shape, offset in the flat parameter)
        offset = 0
        for key, shape, numel in pieces:
            if key is not None and shape is not None:
                self.entries.append((key, shape, offset))
            offset += numel

    def segments(self) -> list[tuple[str, int]]:
        """Not expressible for FSDP1 (see the module docstring).

        Raises:
            ValueError: always, naming the options that need it.
        """
        raise ValueError(
            "FSDP1 shards a unit's flat parameter as one contiguous range per rank, so ranks hold pieces of different "
            "parameters; the direct scheme's align_buckets and unquantized_params need FSDP2 (fully_shard), where "
            "every rank holds a slice of every parameter"
        )

    def shapes(self) -> dict[str, torch.Size]:
        return {key: shape for key, shape, _ in self.entries}

    def split(self, gathered: torch.Tensor) -> dict[str, torch.Tensor]:
        return {key: gathered[offset : offset + math.prod(shape)].view(shape) for key, shape, offset in self.entries}

    def join(self, params: dict[str, torch.Tensor], out: torch.Tensor) -> None:
        self.check_saved(params)
        out.zero_()
        for key, shape, offset in self.entries:
            out[offset : offset + math.prod(shape)].copy_(params[key].reshape(-1))
