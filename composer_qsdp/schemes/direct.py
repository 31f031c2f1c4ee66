"""``DirectAllGather``: QSDP's weight path. Each rank quantizes its shard, the codes are gathered, every rank
decodes every shard (its own included), so all ranks compute with bit-identical weights."""

from __future__ import annotations

import torch
import torch.distributed as dist

from composer_qsdp.comm import CallTraffic, quantized_all_gather
from composer_qsdp.schemes.base import WeightScheme

__all__ = ["DirectAllGather"]


class DirectAllGather(WeightScheme):
    """One flat quantized all-gather per call; stateless between calls (the default weight scheme).

    Stochastic rounding is keyed by the caller's seed: the forward and backward gathers of one microbatch get
    the same key and decode the same weights. A ``None`` codec gathers unquantized.
    """

    name = "direct"

    def _all_gather(
        self, output: torch.Tensor, input: torch.Tensor, seed: int, group: dist.ProcessGroup, measure_error: bool
    ) -> CallTraffic:
        return quantized_all_gather(
            output, input, self.codec, group, seed, measure_error=measure_error, off_node_peers=self._off_node_peers
        )
