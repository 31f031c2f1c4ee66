"""The recipe entrypoint's metrics file (``metrics_file:``), as the benchmark drivers read it.

JSON written by process 0 after every evaluation and at the end of training, so a run stopped early keeps its
evaluations; written to a temporary file and renamed, so a reader never sees half a file. Its keys:

* ``metrics``: name -> ``[batch, value]`` pairs of every numeric metric logged, ``batch`` being Composer's 0-based
  timestamp at logging time (``loss/train/total``, ``time/train`` of the speed_monitor callback, ``qsdp/*``...);
* ``communication``: algorithm -> ``weights`` / ``grads`` / ``total`` -> process 0's byte counters, for each
  algorithm that counts its FSDP traffic (a ``traffic()`` method, as QSDP has);
* ``memory``: process 0's peak GPU memory in bytes (``peak_allocated_bytes``, ``peak_reserved_bytes``): the
  largest values Composer's ``MemoryMonitor`` (the memory_monitor callback) logged, which it reports in gigabytes
  to 5 significant digits; null without that callback or off the GPU;
* ``hyperparameters``: the JSON-representable hyperparameters logged (the entrypoint logs its GPU placement:
  ``shared_gpu``, ``ranks_per_gpu``, ``dist_backend``, ``visible_gpus``).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Optional

from composer.core import State
from composer.loggers import InMemoryLogger, Logger
from composer.utils import dist

__all__ = ["MetricsFile", "is_metrics_file"]

# MemoryMonitor's metric names for the memory section's keys.
_PEAK_MEMORY = {"peak_allocated_bytes": "memory/peak_allocated_mem", "peak_reserved_bytes": "memory/peak_reserved_mem"}


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError, RuntimeError):
        return False
    return True


class MetricsFile(InMemoryLogger):
    """A Composer logger that keeps every logged metric and writes the metrics file at ``path``.

    Args:
        path: where process 0 writes the JSON (parent directories are created).
    """

    #: The file's top-level keys.
    KEYS = ("metrics", "communication", "memory", "hyperparameters")

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = Path(path)

    def peak_memory(self) -> Optional[dict[str, int]]:
        """Peak GPU memory in bytes from MemoryMonitor's logged gigabytes, or None where it logged none."""
        series = {key: self.data.get(name) for key, name in _PEAK_MEMORY.items()}
        if not all(series.values()):
            return None
        return {key: round(max(float(v) for _, v in values) * 1e9) for key, values in series.items()}

    def write(self, state: State) -> None:
        """Write the file from what was logged so far and the byte counters of ``state``'s algorithms (process 0
        only)."""
        if dist.get_global_rank() != 0:
            return
        metrics = {name: [[int(ts.batch), float(value)] for ts, value in series]
                   for name, series in self.data.items() if series and _is_number(series[0][1])}
        communication = {type(a).__name__: _counts(a.traffic())
                         for a in state.algorithms if callable(getattr(a, "traffic", None))}
        for a in state.algorithms:  # the part of QSDP's counts sent during evaluation, also in the totals above
            if callable(getattr(a, "eval_traffic", None)):
                communication[type(a).__name__]["evaluation"] = _counts(a.eval_traffic())
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        values = (metrics, communication, self.peak_memory(),
                  {k: v for k, v in self.hyperparameters.items() if isinstance(v, (bool, int, float, str))})
        tmp.write_text(json.dumps(dict(zip(self.KEYS, values)), indent=1))
        tmp.replace(self.path)

    def eval_end(self, state: State, logger: Logger) -> None:
        self.write(state)

    def fit_end(self, state: State, logger: Logger) -> None:
        self.write(state)


def _counts(report: Any) -> dict[str, dict[str, int]]:
    return {side: dataclasses.asdict(getattr(report, side)) for side in ("weights", "grads", "total")}


def is_metrics_file(path: str | Path) -> bool:
    """Whether ``path`` is a file that :class:`MetricsFile` wrote: a JSON object with exactly its keys. The
    recipe entrypoint replaces such a file, and refuses to replace any other (run_files.check_logger_files)."""
    try:
        content = json.loads(Path(path).read_text())
    except (OSError, ValueError):  # a folder, unreadable, not UTF-8, not JSON
        return False
    return isinstance(content, dict) and tuple(content) == MetricsFile.KEYS
