"""``TrafficReport``: cumulative bytes of the weight all-gathers and gradient reduce-scatters."""

from __future__ import annotations

from dataclasses import dataclass

from composer_qsdp.comm import TrafficCounter

__all__ = ["TrafficReport"]


@dataclass(frozen=True)
class TrafficReport:
    """Bytes this rank put on the wire through QSDP's comm objects, per side and in total.

    Counts follow NCCL's convention ((W-1)/W of each collective's volume, per rank) and cover every FSDP unit
    of the model, quantized or not, so the ratios are those of the whole run's FSDP traffic.

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

    def __sub__(self, other: TrafficReport) -> TrafficReport:
        return TrafficReport(self.weights - other.weights, self.grads - other.grads)

    def summary(self) -> str:
        """Human-readable lines: bytes sent against bf16 and against the dtypes FSDP would have sent."""
        lines = []
        for label, c in (("weights (all-gather)", self.weights), ("grads (reduce-scatter)", self.grads),
                         ("total", self.total)):
            lines.append(
                f"{label:<24} sent {_size(c.sent):>10} | bf16 {_size(c.bf16):>10} ({c.ratio_vs_bf16:.2f}x less) | "
                f"unquantized {_size(c.native):>10} ({c.ratio_vs_native:.2f}x less) | {c.calls} calls"
            )
        return "\n".join(lines)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
