"""``Segments``: a rank's chunk as pieces that are quantized in buckets of their own, or sent as they are.

FSDP concatenates a unit's parameter shards into one chunk, so plain bucketing lets one bucket hold the end of one
parameter and the start of the next: a LayerNorm gain near 1 beside weights of scale 0.02 widens the bucket's
quantization step for both. With segments, every quantized piece starts a new bucket (its last bucket is filled
with copies of its own first element, which changes neither its min/max nor its abs-max), and pieces marked raw
(norms, biases: few elements, large relative error) travel unquantized after the codes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

__all__ = ["SegmentPlan", "Segments"]


@dataclass(frozen=True)
class SegmentPlan:
    """Index maps of :class:`Segments` for one bucket size and device (all int64 tensors).

    Attributes:
        source: for each element of the bucket-aligned buffer, its position in the chunk.
        aligned: positions in the aligned buffer of the quantized elements (padding skipped).
        quantized: their positions in the chunk, in the same order.
        raw: positions in the chunk of the elements sent unquantized.
    """

    source: torch.Tensor
    aligned: torch.Tensor
    quantized: torch.Tensor
    raw: torch.Tensor


@dataclass(frozen=True)
class Segments:
    """The pieces of one rank's chunk, in order.

    Attributes:
        sizes: elements of each piece (they add up to the chunk).
        quantized: per piece, True to quantize it (bucket-aligned), False to send it raw.
    """

    sizes: tuple[int, ...]
    quantized: tuple[bool, ...]

    def __post_init__(self) -> None:
        if len(self.sizes) != len(self.quantized) or any(s < 1 for s in self.sizes):
            raise ValueError(f"segments need one quantize flag per piece and positive sizes, got {self}")

    @property
    def numel(self) -> int:
        """Elements of the whole chunk."""
        return sum(self.sizes)

    @functools.lru_cache(maxsize=8)  # noqa: B019 (a handful of bucket sizes and devices per unit)
    def plan(self, bucket_size: int, device: torch.device) -> SegmentPlan:
        """The index maps for buckets of ``bucket_size`` elements, on ``device``."""
        source, aligned, quantized, raw = [], [], [], []
        start = 0
        for size, quantize in zip(self.sizes, self.quantized):
            positions = torch.arange(start, start + size)
            if quantize:
                padded = -(-size // bucket_size) * bucket_size
                aligned.append(torch.arange(size) + sum(len(s) for s in source))
                quantized.append(positions)
                source.append(torch.cat([positions, positions.new_full((padded - size,), start)]))
            else:
                raw.append(positions)
            start += size
        empty = torch.zeros(0, dtype=torch.int64)
        return SegmentPlan(*(torch.cat(t).to(device) if t else empty.to(device)
                             for t in (source, aligned, quantized, raw)))
