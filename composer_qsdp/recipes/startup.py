"""Where a recipe launch's start-up goes: the wall-clock seconds of each phase between the entrypoint's start and the
first batch, printed by process 0 and logged as hyperparameters (``startup/<phase>_s``, ``startup/total_s``), so the
metrics file and the benchmark drivers can report them."""

from __future__ import annotations

import time

__all__ = ["StartupClock"]


class StartupClock:
    """Laps of named phases, in order, from the moment the clock is made (``time.perf_counter``)."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, phase: str) -> None:
        """End ``phase`` now: the seconds since the previous lap (or the clock's start) are its time; a phase named
        twice adds up."""
        now = time.perf_counter()
        self.laps[phase] = self.laps.get(phase, 0.0) + now - self._last
        self._last = now

    @property
    def total(self) -> float:
        """Seconds of all laps (s)."""
        return sum(self.laps.values())

    def hyperparameters(self) -> dict[str, float]:
        """``startup/<phase>_s`` for each lap (spaces as ``_``) and ``startup/total_s``, in seconds to 0.01 s."""
        values = {f"startup/{phase.replace(' ', '_')}_s": round(s, 2) for phase, s in self.laps.items()}
        values["startup/total_s"] = round(self.total, 2)
        return values

    def describe(self) -> str:
        """One line: ``start-up 61.3 s: imports 8.2 s, process group 1.9 s, ...``."""
        return f"start-up {self.total:.1f} s: " + ", ".join(f"{phase} {s:.1f} s" for phase, s in self.laps.items())
