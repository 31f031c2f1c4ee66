"""``StepProfile``: where a training step's time goes on the GPU, as a small JSON summary per rank.

A Composer callback for the recipes (``callbacks: {step_profile: {start: 5, batches: 2, out_dir: DIR}}``) and the
benchmarks: it records batches ``start .. start + batches - 1`` with ``torch.profiler`` (CUDA kernels only) and
writes ``DIR/step_profile-rank<r>.json``: per batch, the wall time and the GPU time of each kernel category, the
time communication kernels run while no other kernel does (exposed communication) and the time they overlap
compute, and the device memory QSDP's schemes keep (weight-difference replicas, error-feedback residuals).

Kernel categories (:data:`CATEGORIES`, the first pattern that matches a kernel's name, lower case):

=================  ==============================================================================================
``communication``  NCCL's kernels (all-gather, reduce-scatter, all-to-all, all-reduce, send/receive)
``encode``         QSDP's quantize kernels (min-max, symmetric, learned levels, sign; with error feedback or a
                   weight difference fused)
``decode``         QSDP's dequantize, dequantize-and-sum and dequantize-and-add kernels
``hadamard``       the stand-alone Walsh-Hadamard rotation kernel (fused rotations count with their codec)
``matmul``         cuBLAS / CUTLASS matrix products
``attention``      fused attention kernels (flash / memory-efficient)
``copy``           device copies and fills (``Memcpy``, ``Memset``, ``copy_``/``fill_`` kernels, casts)
``other``          every other kernel: elementwise and reduction work of the model, the loss, the optimizer, and
                   any torch fallback of a codec
=================  ==============================================================================================

Exposed communication is the length of the union of communication-kernel intervals less its intersection with the
union of every other kernel's intervals, over all streams of the rank's GPU: the time the GPU does nothing but wait
for the network. With ranks sharing a GPU (gloo) no NCCL kernel runs and the column is 0.

GPU idle time is the batch's wall time that no kernel covers: the GPU waits for the host. The summary attributes each
idle gap of at least :data:`MIN_GAP_US` to the shortest host range covering it, which names what the host was doing
instead of launching work: FSDP2's ranges (``FSDP::pre_forward``, ``FSDP::post_backward_reduce``...), the optimizer's
(``Optimizer.step#AdamW.step``), and the callback's own ``composer::<event>`` ranges, each running from one Composer
event of the batch to the next (``composer::after_train_batch``: from gradient clipping's end through the optimizer
step). Shorter gaps, the launch latency between dependent kernels, are summed apart. Host synchronizations (CUDA
runtime calls that block the host until the device catches up) are counted with the time the host spent in them.
"""

from __future__ import annotations

import gc
import gzip
import json
import re
from pathlib import Path
from typing import Any

from composer.core import Callback, Event, State
from composer.loggers import Logger

from composer_qsdp.recipes.rank_memory import scheme_memory

__all__ = ["CATEGORIES", "MIN_GAP_US", "StepProfile", "attribute_idle", "categorize", "host_syncs", "merge_intervals",
           "overlap_length", "summarize_kernels"]

#: ``(category, regular expression)`` in match order; see the module docstring.
CATEGORIES: tuple[tuple[str, str], ...] = (
    ("communication", r"nccl"),
    ("encode", r"_quantize|_encode|sign_pack|_sign_encode"),
    ("decode", r"_decode|_sum_kernel|_add_kernel"),
    ("hadamard", r"_hadamard"),
    ("matmul", r"gemm|cutlass|nvjet|sm90_xmma|cublas|wgmma"),
    ("attention", r"flash|fmha|attention|efficient_attention"),
    ("copy", r"memcpy|memset|copy|fill_|cast"),
)
_COMPILED = tuple((name, re.compile(pattern)) for name, pattern in CATEGORIES)


def categorize(kernel: str) -> str:
    """The category (:data:`CATEGORIES`) of a kernel's name, ``"other"`` when none matches."""
    lower = kernel.lower()
    return next((name for name, pattern in _COMPILED if pattern.search(lower)), "other")


def merge_intervals(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of ``(start, end)`` intervals as sorted, disjoint intervals."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def overlap_length(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Total length of the intersection of two sorted, disjoint interval lists (as :func:`merge_intervals` gives)."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        low, high = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, high - low)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def summarize_kernels(kernels: list[tuple[str, float, float]]) -> dict[str, Any]:
    """Per-category GPU time and the communication overlap of ``(name, start, end)`` kernel intervals (any time
    unit; the result is in the same unit).

    Returns:
        ``{"by_category": {category: busy time summed over kernels}, "kernels": {category: count},
        "communication_busy": union length of communication kernels, "compute_busy": union length of the others,
        "exposed_communication": communication busy while nothing else runs, "overlapped_communication": the rest,
        "top": the 10 kernel names with the most time, as [name, category, time]}``.
    """
    by_category: dict[str, float] = {}
    counts: dict[str, int] = {}
    per_name: dict[str, float] = {}
    comm, compute = [], []
    for name, start, end in kernels:
        category = categorize(name)
        by_category[category] = by_category.get(category, 0.0) + (end - start)
        counts[category] = counts.get(category, 0) + 1
        per_name[name] = per_name.get(name, 0.0) + (end - start)
        (comm if category == "communication" else compute).append((start, end))
    comm_union, compute_union = merge_intervals(comm), merge_intervals(compute)
    comm_busy = _length(comm_union)
    overlapped = overlap_length(comm_union, compute_union)
    top = sorted(per_name.items(), key=lambda kv: -kv[1])[:10]
    return {"by_category": by_category, "kernels": counts, "communication_busy": comm_busy,
            "compute_busy": _length(compute_union), "exposed_communication": comm_busy - overlapped,
            "overlapped_communication": overlapped,
            "top": [[name[:120], categorize(name), t] for name, t in top]}


#: Idle gaps shorter than this (microseconds) are launch latency between dependent kernels, summed apart.
MIN_GAP_US = 20.0
#: CUDA runtime calls that block the host until the device (or a stream, or an event) has caught up.
_SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")
_SHORT = f"(gaps < {MIN_GAP_US:g} us)"
_UNCOVERED = "(no range)"


def attribute_idle(kernels: list[tuple[float, float]], ranges: list[tuple[str, float, float]], lo: float,
                   hi: float) -> dict[str, Any]:
    """The time of ``[lo, hi]`` that no kernel interval covers, by the host range that covers it.

    Each idle gap of at least :data:`MIN_GAP_US` is split at the boundaries of the ``(name, start, end)`` ranges
    overlapping it, and each piece goes to the shortest range covering it (``"(no range)"`` where none does); shorter
    gaps go to ``"(gaps < 20 us)"``. Times in the unit of the arguments (the trace's microseconds).

    Returns:
        ``{"gpu_idle": total idle time, "idle_by_range": {name: time}}``, ranges in decreasing time.
    """
    gaps, cursor = [], lo
    for start, end in merge_intervals([(max(s, lo), min(e, hi)) for s, e in kernels if e > lo and s < hi]):
        if start > cursor:
            gaps.append((cursor, start))
        cursor = max(cursor, end)
    if hi > cursor:
        gaps.append((cursor, hi))
    by_range: dict[str, float] = {}
    for a, b in gaps:
        if b - a < MIN_GAP_US:
            by_range[_SHORT] = by_range.get(_SHORT, 0.0) + (b - a)
            continue
        covering = [(e - s, name, s, e) for name, s, e in ranges if s < b and e > a]
        cuts = sorted({a, b, *(t for _, _, s, e in covering for t in (s, e) if a < t < b)})
        for x, y in zip(cuts, cuts[1:]):
            inside = [c for c in covering if c[2] <= x and c[3] >= y]
            name = min(inside)[1] if inside else _UNCOVERED
            by_range[name] = by_range.get(name, 0.0) + (y - x)
    return {"gpu_idle": sum(b - a for a, b in gaps),
            "idle_by_range": dict(sorted(by_range.items(), key=lambda kv: -kv[1]))}


def host_syncs(calls: list[tuple[str, float, float]]) -> dict[str, list[float]]:
    """``{call: [count, host time]}`` of the blocking CUDA runtime calls among ``(name, start, end)`` runtime
    events (``cudaMemcpy`` without ``Async``: a device-to-host read such as ``.item()``)."""
    syncs: dict[str, list[float]] = {}
    for name, start, end in calls:
        if name in _SYNC_CALLS:
            entry = syncs.setdefault(name, [0, 0.0])
            entry[0] += 1
            entry[1] += end - start
    return syncs


class StepProfile(Callback):
    """Profile batches ``start .. start + batches - 1`` (1-based, as Composer counts them) and write a summary.

    Args:
        out_dir: folder of ``step_profile-rank<r>.json`` (created).
        start: first profiled batch (>= 2: the first batch compiles kernels and sets up communicators).
        batches: number of profiled batches (>= 1).
        trace: also keep the Chrome trace of the window (``step_profile-rank<r>.trace.json.gz``; a few MB).

    Raises:
        ValueError: ``start`` below 2 or ``batches`` below 1, naming the value.
    """

    def __init__(self, out_dir: str, start: int = 5, batches: int = 2, trace: bool = False) -> None:
        if isinstance(start, bool) or not isinstance(start, int) or start < 2:
            raise ValueError(f"step_profile start={start!r} is invalid; allowed: an integer >= 2 (batch 1 compiles)")
        if isinstance(batches, bool) or not isinstance(batches, int) or batches < 1:
            raise ValueError(f"step_profile batches={batches!r} is invalid; allowed: an integer >= 1")
        self.out_dir, self.start, self.batches, self.trace = Path(out_dir), start, batches, trace
        self._profiler: Any = None
        self._range: Any = None
        self._phase: Any = None

    def run_event(self, event: Event, state: State, logger: Logger) -> None:
        import torch

        if not torch.cuda.is_available():
            return
        if event not in (Event.BATCH_START, Event.BATCH_END):
            if self._profiler is not None and self._range is not None:
                self._enter_phase(event)
            return
        batch = int(state.timestamp.batch) + (1 if event == Event.BATCH_START else 0)
        if event == Event.BATCH_START and batch == self.start:
            from torch.profiler import ProfilerActivity, profile

            torch.cuda.synchronize()
            self._profiler = profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU])
            self._profiler.__enter__()
        if self._profiler is None:
            return
        # Synchronized at both ends, a batch's range on the trace's clock holds exactly its kernels.
        torch.cuda.synchronize()
        if event == Event.BATCH_START:
            self._range = torch.profiler.record_function(f"{_RANGE}{batch}")
            self._range.__enter__()
            self._enter_phase(event)
            return
        self._exit_phase()
        self._range.__exit__(None, None, None)
        self._range = None
        if batch == self.start + self.batches - 1:
            self._profiler.__exit__(None, None, None)
            self._write(state)
            self.close_profiler()

    def close_profiler(self) -> None:
        """Drop the profiler and free its events now. They reference each other (each event its parent and
        children), so only a full garbage collection frees them: a profile of 20,000 events leaves about 155,000
        objects, whose collection took 0.26 s on one core of our development machine. Left to Python's automatic
        collection, that pause lands in some later step, one rank at a time, and the others wait for it."""
        self._profiler = None
        gc.collect()

    def _enter_phase(self, event: Event) -> None:
        """Close the range of the previous Composer event, open ``composer::<event>``."""
        import torch

        self._exit_phase()
        self._phase = torch.profiler.record_function(f"composer::{event.value}")
        self._phase.__enter__()

    def _exit_phase(self) -> None:
        if self._phase is not None:
            self._phase.__exit__(None, None, None)
            self._phase = None

    def _write(self, state: State) -> None:
        import torch
        import torch.distributed as dist

        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        self.out_dir.mkdir(parents=True, exist_ok=True)
        # A kept trace is gzipped (torch compresses for a .gz name; tens of MB otherwise); one read once is not.
        trace = self.out_dir / f"step_profile-rank{rank}.trace.json{'.gz' if self.trace else ''}"
        self._profiler.export_chrome_trace(str(trace))
        with (gzip.open if self.trace else open)(trace, "rt") as f:
            events = json.load(f).get("traceEvents", [])
        if not self.trace:
            trace.unlink()
        complete = [(e, float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
                    if e.get("ph") == "X" and "dur" in e]
        kernels = [(e["name"], s, t) for e, s, t in complete if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
        annotations = [(e["name"], s, t) for e, s, t in complete if e.get("cat") == "user_annotation"]
        runtime = [(e["name"], s, t) for e, s, t in complete if e.get("cat") == "cuda_runtime"]
        batches = {int(n[len(_RANGE):]): (s, t) for n, s, t in annotations if n.startswith(_RANGE)}
        host_ranges = [a for a in annotations if not a[0].startswith(_RANGE)]
        per_batch = []
        for batch, (lo, hi) in sorted(batches.items()):
            inside = [(n, max(s, lo), min(t, hi)) for n, s, t in kernels if t > lo and s < hi]
            summary = summarize_kernels(inside)
            idle = attribute_idle([(s, t) for _, s, t in inside], host_ranges, lo, hi)
            syncs = host_syncs([c for c in runtime if lo <= c[1] < hi])
            per_batch.append({"batch": batch, "wall_ms": (hi - lo) / 1e3,
                              **{k: _ms(v) for k, v in summary.items() if k != "top"},
                              "gpu_idle": _ms(idle["gpu_idle"]), "idle_by_range": _ms(idle["idle_by_range"]),
                              "host_syncs": {k: [n, t / 1e3] for k, (n, t) in syncs.items()},
                              "top": [[n, c, t / 1e3] for n, c, t in summary["top"]]})
        record = {"rank": rank, "start": self.start, "batches": self.batches, "device": torch.cuda.get_device_name(),
                  "scheme_memory_bytes": scheme_memory(state),
                  "peak_allocated_bytes": torch.cuda.max_memory_allocated(), "per_batch": per_batch}
        (self.out_dir / f"step_profile-rank{rank}.json").write_text(json.dumps(record, indent=1))


_RANGE = "qsdp_step_profile_batch_"


def _ms(value: Any) -> Any:
    """Microseconds (a number or a dict of numbers) in milliseconds; counts (ints) pass through."""
    if isinstance(value, dict):
        return {k: _ms(v) for k, v in value.items()}
    return value / 1e3 if isinstance(value, float) else value
