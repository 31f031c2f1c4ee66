"""FSDP2 comm objects (torch >= 2.9 ``set_custom_all_gather`` / ``set_custom_reduce_scatter``) for one unit."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from composer_qsdp.comm import CallTraffic, TrafficCounter, quantized_all_gather, quantized_reduce_scatter
from composer_qsdp.fsdp.config import Side
from composer_qsdp.fsdp.finite_check import WeightFiniteMonitor
from composer_qsdp.fsdp.seeding import StepSeeds
from composer_qsdp.quant import Codec

try:  # the Comm ABCs arrived with the custom-collective API in torch 2.9
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
except ImportError:  # torch < 2.9: apply_qsdp refuses to run, these classes are never instantiated
    AllGather = ReduceScatter = object  # type: ignore[assignment,misc]

__all__ = ["QSDPAllGather", "QSDPReduceScatter"]


class _UnitComm:
    """State shared by both sides: the unit's codec, seeds, byte counter and error sampling.

    Attributes:
        unit_index: the unit's index.
        codec: the side's codec, ``None`` for unquantized.
        traffic: bytes this rank sent for the unit on this side.
        latest_error: the latest sampled relative quantization error, or ``None``.
    """

    side: Side

    def __init__(self, unit_index: int, codec: Codec | None, seeds: StepSeeds, error_sample_interval: int) -> None:
        self.unit_index = unit_index
        self.codec = codec
        self.traffic = TrafficCounter()
        self.latest_error: torch.Tensor | None = None
        self.latest_error_taken = True
        self._seeds = seeds
        self._interval = error_sample_interval

    def allocate(
        self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """FSDP's staging buffers: plain caching-allocator tensors (FSDP's default)."""
        return torch.empty(*size, dtype=dtype, device=device)

    def _seed(self) -> int:
        return self._seeds.seed(self.unit_index, self.side)

    def _measure_now(self) -> bool:
        # The first call of a unit is measured too, so short runs still report an error.
        return self.codec is not None and self._interval > 0 and self.traffic.calls % self._interval == 0

    def _count(self, traffic: CallTraffic) -> None:
        self.traffic.add(traffic)
        if traffic.rel_error is not None:
            self.latest_error, self.latest_error_taken = traffic.rel_error, False

    def take_error(self) -> torch.Tensor | None:
        """The latest sampled relative error (0-dim device tensor) if not taken before, else ``None``."""
        if self.latest_error_taken:
            return None
        self.latest_error_taken = True
        return self.latest_error


class QSDPAllGather(_UnitComm, AllGather):
    """Weight all-gather of one FSDP unit: quantized with ``codec`` (``None``: unquantized, still counted).

    Returns ``None`` to FSDP: the work is stream-ordered on FSDP's all-gather stream, after which FSDP records
    the event its consumers wait on.

    Args:
        unit_index: the unit's index (seeds, flags).
        codec: weight codec or ``None``.
        seeds: the shared per-step seed schedule.
        error_sample_interval: measure the quantization error every this many calls (0: never).
        monitor: non-finite weight monitor, or ``None`` to skip the check.
    """

    side: Side = "weights"

    def __init__(
        self,
        unit_index: int,
        codec: Codec | None,
        seeds: StepSeeds,
        error_sample_interval: int,
        monitor: WeightFiniteMonitor | None,
    ) -> None:
        super().__init__(unit_index, codec, seeds, error_sample_interval)
        self._monitor = monitor

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        async_op: bool = False,
    ) -> None:
        traffic = quantized_all_gather(
            output_tensor, input_tensor, self.codec, group, self._seed(), measure_error=self._measure_now()
        )
        self._count(traffic)
        if self._monitor is not None and output_tensor.is_floating_point():
            self._monitor.record(self.unit_index, output_tensor)
        return None


class QSDPReduceScatter(_UnitComm, ReduceScatter):
    """Gradient reduce-scatter of one FSDP unit: quantized with ``codec`` (``None``: plain, still counted).

    Accepts FSDP's ``ReduceOp.SUM`` and ``ReduceOp.AVG`` on the quantized path.

    Args:
        unit_index: the unit's index (seeds).
        codec: gradient codec or ``None``.
        seeds: the shared per-step seed schedule.
        error_sample_interval: measure the quantization error every this many calls (0: never).
    """

    side: Side = "grads"

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        op: dist.ReduceOp | dist.ReduceOp.RedOpType,
        async_op: bool = False,
    ) -> None:
        traffic = quantized_reduce_scatter(
            output_tensor, input_tensor, self.codec, group, op, self._seed(), measure_error=self._measure_now()
        )
        self._count(traffic)
        return None
