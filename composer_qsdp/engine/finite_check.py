"""Detect non-finite all-gathered weights without syncing the host in the collective's hot path."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["NonFiniteWeightError", "WeightFiniteMonitor"]


class NonFiniteWeightError(FloatingPointError):
    """All-gathered weights of an FSDP unit contained NaN or Inf (the master weights have diverged)."""


class WeightFiniteMonitor:
    """One device flag per FSDP unit, raised by the all-gather and read once per step.

    :meth:`record` adds one fused reduction per all-gather (the minimum and maximum of the gathered weights: a
    NaN makes both NaN, an infinity shows in one of them, and neither can overflow the way a sum of large
    finite weights does) and never syncs. :meth:`poll`, called at the start of each forward, reads the
    flags: on CUDA it starts an asynchronous copy of the current flags and inspects the copy started at the
    previous poll (so the error surfaces one step late, without stalling the CPU); elsewhere it reads them
    directly. Every rank decodes the same gathered weights, so every rank raises at the same step.

    Args:
        unit_names: names of the FSDP units, by unit index (for the error message).
    """

    def __init__(self, unit_names: Sequence[str]) -> None:
        self._names = list(unit_names)
        self._flags: torch.Tensor | None = None
        self._pending: tuple[torch.Tensor, torch.cuda.Event] | None = None

    def record(self, unit_index: int, gathered: torch.Tensor) -> None:
        """Flag unit ``unit_index`` if ``gathered`` (its all-gather output) holds a NaN or Inf."""
        if self._flags is None:
            self._flags = torch.zeros(len(self._names), dtype=torch.bool, device=gathered.device)
        flag = self._flags[unit_index]
        low, high = torch.aminmax(gathered)
        torch.logical_or(flag, ~(torch.isfinite(low) & torch.isfinite(high)), out=flag)

    def poll(self) -> None:
        """Raise for flags visible now (see the class docstring for the one-step lag on CUDA).

        Raises:
            NonFiniteWeightError: naming the units whose weights were non-finite.
        """
        if self._flags is None:
            return
        if self._flags.device.type != "cuda":
            self._raise_if_flagged(self._flags)
            return
        if self._pending is not None:
            host, event = self._pending
            event.synchronize()
            self._raise_if_flagged(host)
        host = torch.empty(self._flags.shape, dtype=torch.bool, pin_memory=True)
        host.copy_(self._flags, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._pending = (host, event)

    def check(self) -> None:
        """Raise for every flag recorded so far, waiting for the device (a host sync).

        Raises:
            NonFiniteWeightError: naming the units whose weights were non-finite.
        """
        if self._flags is not None:
            self._pending = None
            self._raise_if_flagged(self._flags.cpu())

    def _raise_if_flagged(self, flags: torch.Tensor) -> None:
        if bool(flags.any()):
            bad = [self._names[i] or "<root>" for i in flags.nonzero().flatten().tolist()]
            raise NonFiniteWeightError(
                f"non-finite weights (NaN or Inf) were all-gathered in FSDP unit(s) {bad}: the full-precision "
                "weights have diverged. QSDP reports this instead of training on garbage; lower the learning "
                "rate, clip gradients, or check the data and the loss for the step before."
            )
