"""``FlatReduceScatter``: the single-hop quantized reduce-scatter (QSDP; ZeRO++ qgZ's one-hop form). Each rank
quantizes the ``W`` destination chunks of its gradient, one all-to-all delivers them, each owner decodes its
``W`` versions and sums them in fp32."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from composer_qsdp.comm import CallTraffic, quantized_reduce_scatter
from composer_qsdp.schemes.base import GradScheme

__all__ = ["FlatReduceScatter"]


class FlatReduceScatter(GradScheme):
    """One flat quantized reduce-scatter per call; stateless between calls (the default gradient scheme).

    Honours ``ReduceOp.SUM`` and ``AVG``; a ``None`` codec runs the plain reduce-scatter with FSDP's op.
    """

    name = "flat"

    @property
    def passthrough(self) -> bool:
        """Without a codec the reduce-scatter is the framework's own (error-feedback subclasses need a codec)."""
        return self.codec is None

    def _reduce_scatter(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        op: dist.ReduceOp | dist.ReduceOp.RedOpType,
        seed: int,
        group: dist.ProcessGroup,
        measure_error: bool,
        overwrite_input: bool,
    ) -> CallTraffic:
        return quantized_reduce_scatter(
            output, input, self.codec, group, op, seed, measure_error=measure_error,
            off_node_peers=self._off_node_peers, **self._feedback(input),
        )

    def _feedback(self, input: torch.Tensor) -> dict[str, Any]:
        """Error-feedback arguments of the collective for this call's ``input``: none here (a subclass keeps a
        residual)."""
        return {}
