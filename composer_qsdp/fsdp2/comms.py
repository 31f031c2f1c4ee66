"""FSDP2 comm objects: each forwards one unit's collective to its :class:`~composer_qsdp.engine.QSDPHandle`, which
runs the unit's scheme. FSDP2 calls them through ``set_custom_all_gather`` / ``set_custom_reduce_scatter`` (torch >=
2.9) or, on older torch, through the proxy of :mod:`composer_qsdp.fsdp2.compat`."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from composer_qsdp.fsdp2.compat import AllGather, ReduceScatter
from composer_qsdp.engine import QSDPHandle

__all__ = ["QSDPAllGather", "QSDPReduceScatter"]


class _UnitComm:
    """FSDP2's ``Comm`` for one unit: buffers from the caching allocator (FSDP's default).

    Args:
        handle: the handle whose scheme runs the collective.
        unit_index: the unit's index in ``handle.units``.
    """

    def __init__(self, handle: QSDPHandle, unit_index: int) -> None:
        self.handle = handle
        self.unit_index = unit_index

    def allocate(
        self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """FSDP's staging buffers: plain caching-allocator tensors (FSDP's default)."""
        return torch.empty(*size, dtype=dtype, device=device)


class QSDPAllGather(_UnitComm, AllGather):
    """A unit's weight all-gather. A quantized gather returns ``None`` to FSDP: the work is stream-ordered on FSDP's
    all-gather stream, after which FSDP records the event its consumers wait on. An unquantized one is FSDP's own
    call (:meth:`~composer_qsdp.engine.QSDPHandle.all_gather`) and returns what FSDP's default returns.

    With ``reshard_after_forward=<int>`` (ZeRO++'s hpZ) FSDP2 calls the same object in backward with the
    post-forward mesh's smaller group, to gather the secondary shard it kept of the forward's weights: that goes
    to :meth:`~composer_qsdp.engine.QSDPHandle.secondary_all_gather` (the scheme's, counted by mode).
    """

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        async_op: bool = False,
    ) -> dist.Work | None:
        weights = self.handle.units[self.unit_index].weights
        if group is not weights.group and weights.group is not None and group.size() < weights.group.size():
            self.handle.secondary_all_gather(self.unit_index, output_tensor, input_tensor, group)
            return None
        return self.handle.all_gather(self.unit_index, output_tensor, input_tensor, group, async_op)


class QSDPReduceScatter(_UnitComm, ReduceScatter):
    """A unit's gradient reduce-scatter; FSDP passes ``ReduceOp.AVG`` (or ``SUM`` after
    ``set_force_sum_reduction_for_comms(True)``). Unquantized gradients are FSDP's own call, as for the gather."""

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        op: dist.ReduceOp | dist.ReduceOp.RedOpType,
        async_op: bool = False,
    ) -> dist.Work | None:
        return self.handle.reduce_scatter(self.unit_index, output_tensor, input_tensor, op, group, async_op)
