"""Byte accounting for the quantized collectives.

Convention (the one NCCL's bus bandwidth uses): a collective over ``W`` ranks whose full volume is ``V``
bytes (the ``W`` chunks of an all-gather's output, or the ``W`` chunks of a reduce-scatter's input) puts
``(W - 1) / W * V`` bytes on the wire per rank: a rank never sends its own chunk to itself. All counts here
are per rank and follow that convention, so ``sent`` is comparable with the bf16 (and native-dtype) figures
computed the same way.

Hops: ``inter_node`` is the part of ``sent`` addressed to ranks on other nodes (of a
:class:`~composer_qsdp.comm.topology.Topology`), counted point to point: a flat collective whose group has
``k`` of its ``W - 1`` peers on other nodes puts ``k`` of its ``W - 1`` chunks on the inter-node network. That
is what a cluster pays for; the rest (``sent - inter_node``) stays on the node's NVLink/PCIe.

Baselines: ``bf16`` and ``native`` are what the *collectives that ran* would have put on the wire in bf16 and in
the input's dtype. A gather that a scheme serves from a replica every rank keeps (the difference scheme's second and
later gathers of a step, e.g. FSDP2's backward re-gather) issues no collective: it is counted in ``calls`` and
``served_locally`` and in neither ``sent`` nor the baselines. How many such re-gathers FSDP asks for depends on the
torch release (torch 2.7 never reshards the root module after forward; torch >= 2.9 does when
``reshard_after_forward`` is set explicitly, as Composer does), so counting them in the baselines would make the same
traffic report different ratios on different stacks.

Plain FSDP2: a served call still records what it would have cost, ``served_native`` (the bytes the collective would
have sent in the input's dtype, by the same convention). ``native + served_native`` is then what plain FSDP2 on the
same stack puts on the wire for the same calls (its weight gathers in the gather dtype, bf16 under mixed precision,
including the backward re-gather and every microbatch's gathers; its reduce-scatters in the gradients' dtype), and
``ratio_vs_plain_fsdp`` is that against ``sent``. This ratio depends on the torch release as said above; the
``bf16``/``native`` ratios do not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, astuple, dataclass, fields

import torch

__all__ = ["CallTraffic", "TrafficCounter", "TrafficReport", "call_traffic"]


@dataclass(frozen=True)
class CallTraffic:
    """Bytes one rank puts on the wire in one collective call.

    Attributes:
        sent: bytes actually sent (quantized codes + metadata, or the raw tensor when passed through).
        bf16: bytes the same collective would send in bf16 (2 bytes per element): the paper's baseline.
        native: bytes the same collective would send in the input's own dtype (what plain FSDP sends).
        inter_node: the part of ``sent`` addressed to ranks on other nodes.
        rel_error: when measured, a 0-dim fp32 device tensor ``||decode(encode(x)) - x|| / ||x||`` over this
            rank's input; ``None`` otherwise. Kept on the device so measuring never syncs the host.
        served_locally: the call issued no collective (served from a replica); then ``sent``, ``bf16``, ``native``
            and ``inter_node`` are 0.
        served_native: for a call served locally, the bytes its collective would have sent in the input's dtype
            (what plain FSDP sends for it); 0 for a call that issued its collective.
    """

    sent: int
    bf16: int
    native: int
    inter_node: int = 0
    rel_error: torch.Tensor | None = None
    served_locally: bool = False
    served_native: int = 0


def call_traffic(
    world_size: int, chunk_numel: int, chunk_wire_bytes: int, element_size: int, off_node_peers: int = 0
) -> CallTraffic:
    """Per-rank traffic of a flat collective moving ``world_size`` chunks of ``chunk_numel`` elements.

    Args:
        world_size: ranks in the group.
        chunk_numel: elements per rank's chunk.
        chunk_wire_bytes: bytes one chunk occupies on the wire.
        element_size: bytes per element of the input dtype.
        off_node_peers: peers of this rank in the group that sit on other nodes (0 on one node).
    """
    peers = world_size - 1
    return CallTraffic(
        sent=peers * chunk_wire_bytes,
        bf16=peers * chunk_numel * 2,
        native=peers * chunk_numel * element_size,
        inter_node=off_node_peers * chunk_wire_bytes,
    )


@dataclass
class TrafficCounter:
    """Running totals of :class:`CallTraffic` (bytes, per rank, NCCL convention).

    Attributes:
        calls: calls of the scheme (FSDP's all-gathers or reduce-scatters), including those served locally.
        sent: bytes sent.
        bf16: bytes bf16 collectives would have sent for the calls that issued one.
        native: bytes collectives in the input dtype would have sent for the calls that issued one.
        inter_node: the part of ``sent`` addressed to ranks on other nodes.
        served_locally: calls served from a replica without a collective (none of the counts above include them).
        served_native: bytes the calls served locally would have sent in their input dtype, had they issued their
            collective: ``native + served_native`` is what plain FSDP sends for the same calls.
    """

    calls: int = 0
    sent: int = 0
    bf16: int = 0
    native: int = 0
    inter_node: int = 0
    served_locally: int = 0
    served_native: int = 0

    def add(self, traffic: CallTraffic) -> None:
        """Count one call."""
        self.calls += 1
        self.served_locally += traffic.served_locally
        self.sent += traffic.sent
        self.bf16 += traffic.bf16
        self.native += traffic.native
        self.inter_node += traffic.inter_node
        self.served_native += traffic.served_native

    def __add__(self, other: TrafficCounter) -> TrafficCounter:
        return TrafficCounter(*(a + b for a, b in zip(astuple(self), astuple(other))))

    def __sub__(self, other: TrafficCounter) -> TrafficCounter:
        return TrafficCounter(*(a - b for a, b in zip(astuple(self), astuple(other))))

    @property
    def intra_node(self) -> int:
        """Bytes sent to ranks on this rank's own node: ``sent - inter_node``."""
        return self.sent - self.inter_node

    @property
    def ratio_vs_bf16(self) -> float:
        """Compression factor against bf16: ``bf16 / sent`` (1.0 when nothing was sent)."""
        return self.bf16 / self.sent if self.sent else 1.0

    @property
    def ratio_vs_native(self) -> float:
        """Compression factor against the input dtype: ``native / sent`` (1.0 when nothing was sent)."""
        return self.native / self.sent if self.sent else 1.0

    @property
    def plain_fsdp(self) -> int:
        """Bytes plain FSDP sends for the same calls, every one issuing its collective in the input dtype:
        ``native + served_native``."""
        return self.native + self.served_native

    @property
    def ratio_vs_plain_fsdp(self) -> float:
        """Compression factor against plain FSDP: ``(native + served_native) / sent`` (1.0 when nothing was sent)."""
        return self.plain_fsdp / self.sent if self.sent else 1.0

    def state_dict(self) -> dict[str, int]:
        """The counts, for checkpoints."""
        return asdict(self)

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore counts written by :meth:`state_dict` (``inter_node``, ``served_locally`` and ``served_native``
        are 0 in checkpoints that predate them)."""
        for f in fields(self):
            setattr(self, f.name, int(state.get(f.name, 0)))


@dataclass(frozen=True)
class TrafficReport:
    """Bytes this rank put on the wire through QSDP's collectives, per side and in total.

    Counts follow NCCL's convention ((W-1)/W of each collective's volume, per rank) and cover every unit QSDP
    manages, quantized or not, so the ratios are those of the whole run's sharded-data-parallel traffic.

    Attributes:
        weights: the weight all-gathers.
        grads: the gradient reduce-scatters.
    """

    weights: TrafficCounter
    grads: TrafficCounter

    @property
    def total(self) -> TrafficCounter:
        """Both sides together."""
        return self.weights + self.grads

    def __add__(self, other: TrafficReport) -> TrafficReport:
        return TrafficReport(self.weights + other.weights, self.grads + other.grads)

    def __sub__(self, other: TrafficReport) -> TrafficReport:
        return TrafficReport(self.weights - other.weights, self.grads - other.grads)

    def state_dict(self) -> dict[str, dict[str, int]]:
        """Both sides' :meth:`TrafficCounter.state_dict` (what a checkpoint holds)."""
        return {"weights": self.weights.state_dict(), "grads": self.grads.state_dict()}

    @classmethod
    def from_state_dict(cls, state: Mapping[str, dict[str, int]]) -> TrafficReport:
        """The report :meth:`state_dict` wrote."""
        weights, grads = TrafficCounter(), TrafficCounter()
        weights.load_state_dict(state["weights"])
        grads.load_state_dict(state["grads"])
        return cls(weights, grads)

    def summary(self) -> str:
        """Human-readable lines: bytes sent against bf16, against the dtypes of the collectives that ran, and against
        plain FSDP (every call, those served locally included, as a collective in its input dtype)."""
        lines = []
        for label, c in (("weights (all-gather)", self.weights), ("grads (reduce-scatter)", self.grads),
                         ("total", self.total)):
            line = (
                f"{label:<24} sent {_size(c.sent):>10} | bf16 {_size(c.bf16):>10} ({_factor(c.sent, c.ratio_vs_bf16)}) | "
                f"unquantized {_size(c.native):>10} ({_factor(c.sent, c.ratio_vs_native)}) | "
                f"plain FSDP {_size(c.plain_fsdp):>10} ({_factor(c.sent, c.ratio_vs_plain_fsdp)}) | {c.calls} calls"
            )
            if c.inter_node:
                line += f" | inter-node {_size(c.inter_node)}"
            if c.served_locally:
                line += f" ({c.served_locally} served from the replica, no collective)"
            lines.append(line)
        return "\n".join(lines)


def _factor(sent: int, ratio: float) -> str:
    """A compression factor as readers say it: ``2.00x less``, or ``1.80x more`` when more was sent; ``no bytes
    sent`` when ``sent`` is 0, where a ratio means nothing."""
    if not sent:
        return "no bytes sent"
    return f"{ratio:.2f}x less" if ratio >= 1 else f"{1 / ratio:.2f}x more"


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
