"""``GCMonitor``: Python's garbage collections of each batch, as metrics.

A full (generation-2) collection walks every live Python object, and a training process holds many: about 480,000
after importing torch and Composer, where one full collection took 0.3 s on one core of our development machine. It
stops the process, and in a job of several processes every other one waits for it at its next collective. This
callback (``callbacks: {gc_monitor: {}}``) times every collection with ``gc.callbacks`` and logs, at each batch's
end, what ran since the previous one (the span of the speed monitor's ``time/train`` step):

* ``gc/gen2_collections``: full collections;
* ``gc/gen2_ms``: their time (ms);
* ``gc/ms``: the time of every collection, all generations (ms).
"""

from __future__ import annotations

import gc
import time
from typing import Any

from composer.core import Callback, State
from composer.loggers import Logger

__all__ = ["GCMonitor"]


class GCMonitor(Callback):
    """Logs the garbage collections of each batch (module docstring); collections outside training (evaluation
    included) are not counted."""

    def __init__(self) -> None:
        self._started: float | None = None
        self._gen2 = 0
        self._gen2_ms = 0.0
        self._ms = 0.0

    def _observe(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        if self._started is None:  # registered while a collection was running
            return
        ms = (time.perf_counter() - self._started) * 1e3
        self._started = None
        self._ms += ms
        if info["generation"] == 2:
            self._gen2 += 1
            self._gen2_ms += ms

    def _reset(self) -> None:
        self._gen2, self._gen2_ms, self._ms = 0, 0.0, 0.0

    def _watch(self) -> None:
        if self._observe not in gc.callbacks:
            gc.callbacks.append(self._observe)

    def fit_start(self, state: State, logger: Logger) -> None:
        self._reset()
        self._watch()

    def batch_end(self, state: State, logger: Logger) -> None:
        logger.log_metrics({"gc/gen2_collections": self._gen2, "gc/gen2_ms": self._gen2_ms, "gc/ms": self._ms})
        self._reset()

    def eval_start(self, state: State, logger: Logger) -> None:
        self._remove()

    def eval_end(self, state: State, logger: Logger) -> None:
        self._watch()

    def fit_end(self, state: State, logger: Logger) -> None:
        self._remove()

    def close(self, state: State, logger: Logger) -> None:
        self._remove()

    def _remove(self) -> None:
        if self._observe in gc.callbacks:
            gc.callbacks.remove(self._observe)
        self._started = None
