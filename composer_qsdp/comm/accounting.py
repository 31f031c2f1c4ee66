"""Byte accounting for the quantized collectives.

Convention (the one NCCL's bus bandwidth uses): a collective over ``W`` ranks whose full volume is ``V``
bytes (the ``W`` chunks of an all-gather's output, or the ``W`` chunks of a reduce-scatter's input) puts
``(W - 1) / W * V`` bytes on the wire per rank: a rank never sends its own chunk to itself. All counts here
are per rank and follow that convention, so ``sent`` is comparable with the bf16 (and native-dtype) figures
computed the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["CallTraffic", "TrafficCounter", "call_traffic"]


@dataclass(frozen=True)
class CallTraffic:
    """Bytes one rank puts on the wire in one collective call.

    Attributes:
        sent: bytes actually sent (quantized codes + metadata, or the raw tensor when passed through).
        bf16: bytes the same collective would send in bf16 (2 bytes per element): the paper's baseline.
        native: bytes the same collective would send in the input's own dtype (what plain FSDP sends).
        rel_error: when measured, a 0-dim fp32 device tensor ``||decode(encode(x)) - x|| / ||x||`` over this
            rank's input; ``None`` otherwise. Kept on the device so measuring never syncs the host.
    """

    sent: int
    bf16: int
    native: int
    rel_error: torch.Tensor | None = None


def call_traffic(world_size: int, chunk_numel: int, chunk_wire_bytes: int, element_size: int) -> CallTraffic:
    """Per-rank traffic of a collective moving ``world_size`` chunks of ``chunk_numel`` elements.

    Args:
        world_size: ranks in the group.
        chunk_numel: elements per rank's chunk.
        chunk_wire_bytes: bytes one chunk occupies on the wire.
        element_size: bytes per element of the input dtype.
    """
    peers = world_size - 1
    return CallTraffic(
        sent=peers * chunk_wire_bytes,
        bf16=peers * chunk_numel * 2,
        native=peers * chunk_numel * element_size,
    )


@dataclass
class TrafficCounter:
    """Running totals of :class:`CallTraffic` (bytes, per rank, NCCL convention).

    Attributes:
        calls: collective calls counted.
        sent: bytes sent.
        bf16: bytes a bf16 collective would have sent.
        native: bytes the collective in its input dtype would have sent.
    """

    calls: int = 0
    sent: int = 0
    bf16: int = 0
    native: int = 0

    def add(self, traffic: CallTraffic) -> None:
        """Count one call."""
        self.calls += 1
        self.sent += traffic.sent
        self.bf16 += traffic.bf16
        self.native += traffic.native

    def __add__(self, other: TrafficCounter) -> TrafficCounter:
        return TrafficCounter(
            self.calls + other.calls, self.sent + other.sent, self.bf16 + other.bf16, self.native + other.native
        )

    def __sub__(self, other: TrafficCounter) -> TrafficCounter:
        return TrafficCounter(
            self.calls - other.calls, self.sent - other.sent, self.bf16 - other.bf16, self.native - other.native
        )

    @property
    def ratio_vs_bf16(self) -> float:
        """Compression factor against bf16: ``bf16 / sent`` (1.0 when nothing was sent)."""
        return self.bf16 / self.sent if self.sent else 1.0

    @property
    def ratio_vs_native(self) -> float:
        """Compression factor against the input dtype: ``native / sent`` (1.0 when nothing was sent)."""
        return self.native / self.sent if self.sent else 1.0

    def state_dict(self) -> dict[str, int]:
        """The four counts, for checkpoints."""
        return {"calls": self.calls, "sent": self.sent, "bf16": self.bf16, "native": self.native}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore counts written by :meth:`state_dict`."""
        self.calls, self.sent, self.bf16, self.native = (
            int(state["calls"]), int(state["sent"]), int(state["bf16"]), int(state["native"])
        )
