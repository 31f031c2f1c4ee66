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
    flags: on CUDA it never waits for the device: it reads the host copy of the flags that an earlier poll started,
    once the device has made it, and then starts the next copy (so the error surfaces a forward or more late, and
    the host may run ahead of the device as far as it would without QSDP); elsewhere it reads them directly. Every
    rank decodes the same gathered weights, so every rank raises once its copy shows the flag.

    Args:
        unit_names: names of the FSDP units, by unit index (for the error message).
    """

    def __init__(self, unit_names: Sequence[str]) -> None:
        self._names = list(unit_names)
        self._flags: torch.Tensor | None = None
        # CUDA: a pinned host copy of the flags and the event after which it is complete (one pair, reused).
        self._copy: tuple[torch.Tensor, torch.cuda.Event] | None = None

    def record(self, unit_index: int, gathered: torch.Tensor) -> None:
        """Flag unit ``unit_index`` if ``gathered`` (its all-gather output) holds a NaN or Inf."""
        if self._flags is None:
            self._flags = torch.zeros(len(self._names), dtype=torch.bool, device=gathered.device)
        flag = self._flags[unit_index]
        low, high = torch.aminmax(gathered)
        torch.logical_or(flag, ~(torch.isfinite(low) & torch.isfinite(high)), out=flag)

    def poll(self) -> None:
        """Raise for flags visible now, never waiting for the device (the class docstring says how late on CUDA).

        Raises:
            NonFiniteWeightError: naming the units whose weights were non-finite.
        """
        if self._flags is None:
            return
        if self._flags.device.type != "cuda":
            self._raise_if_flagged(self._flags)
            return
        if self._copy is None:
            self._copy = (torch.empty(self._flags.shape, dtype=torch.bool, device="cpu", pin_memory=True),
                          torch.cuda.Event())
        else:
            host, done = self._copy
            if not done.query():
                return  # the device has not reached the previous copy yet: look again at the next forward
            self._raise_if_flagged(host)
        host, done = self._copy
        host.copy_(self._flags, non_blocking=True)
        done.record()

    def check(self) -> None:
        """Raise for every flag recorded so far, waiting for the device (a host sync).

        Raises:
            NonFiniteWeightError: naming the units whose weights were non-finite.
        """
        if self._flags is not None:
            self._raise_if_flagged(self._flags.cpu())

    def _raise_if_flagged(self, flags: torch.Tensor) -> None:
        if bool(flags.any()):
            bad = [self._names[i] or "<root>" for i in flags.nonzero().flatten().tolist()]
            raise NonFiniteWeightError(
                f"non-finite weights (NaN or Inf) were all-gathered in FSDP unit(s) {bad}: the full-precision "
                "weights have diverged. QSDP reports this instead of training on garbage; lower the learning "
                "rate, clip gradients, or check the data and the loss for the step before."
            )
