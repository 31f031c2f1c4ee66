"""What one end-to-end launch measured, from the files it wrote: throughput, step times, memory, wire bytes,
garbage collections and start-up from its metrics file (:func:`measure`), the summary of its ``step_profile``
record (:func:`profile_summary`); and plain FSDP2's bytes per micro-batch computed from the model
(:func:`plain_fsdp2_bytes`), the baseline's wire bytes.

Step times are the recipe's ``SpeedMonitor`` wall clock per batch (``time/train``) of the batches after the
warm-up; tokens/s is the tokens of the timed steps over their time. Wire bytes per step and rank are those of the
timed steps too where the launch logged them per batch (QSDP, 0/1 Adam); QSDP's average over the whole launch,
the first step's qWD keyframe included, is kept beside them (``wire_per_step_launch``). A launch with QSDP's
``speculative_update`` also reports its guesses over the timed steps (``speculation``).
"""

from __future__ import annotations

import statistics
from typing import Any

import torch

import e2e_common as common


def _timed(metrics: dict[str, Any], name: str, warmup: int, total: int,
           every_batch: bool = False) -> list[float] | None:
    """Metric ``name`` of each timed batch (``warmup + 1 .. total``; 0 for a batch without it), or None where the run
    did not log it, or with ``every_batch`` where it did not log it for every timed batch."""
    values = {int(b): float(v) for b, v in metrics["metrics"].get(name, [])}  # key b: logged as batch b ends
    timed = range(warmup + 1, total + 1)
    if not values or (every_batch and any(b not in values for b in timed)):
        return None
    return [values.get(b, 0.0) for b in timed]


def measure(metrics: dict[str, Any], warmup: int, steps: int, tokens_per_step: int) -> dict[str, Any]:
    """Throughput, memory and wire bytes of one finished launch from its metrics file (``train.py``'s JSON).

    Args:
        metrics: the parsed metrics file.
        warmup: batches excluded from the timing (the first ones).
        steps: timed batches after them.
        tokens_per_step: tokens of one optimizer step, all ranks together.

    Raises:
        ValueError: the file lacks the wall clock of some batch (the run did not finish).
    """
    total = warmup + steps
    # time/train: SpeedMonitor's cumulative training wall clock in hours, logged as batch b ends (key b).
    ends = {int(b): float(hours) * 3600.0 for b, hours in metrics["metrics"].get("time/train", [])}
    missing = [b for b in range(1, total + 1) if b not in ends]
    if missing:
        raise ValueError(f"the metrics file has no time/train for batch(es) {missing[:5]}: the run did not finish "
                         f"{total} batches")
    step_times = [ends[b] - (ends[b - 1] if b > 1 else 0.0) for b in range(warmup + 1, total + 1)]
    result: dict[str, Any] = {
        "step_times_s": step_times,
        "step_time_s": statistics.fmean(step_times),
        "step_time_min_s": min(step_times),
        "step_time_max_s": max(step_times),
        # A slow emulated network stalls some steps for a while (a launch's first four steps 23% slower than its
        # last five, nothing changed): the median reads through that where the mean does not.
        "step_time_median_s": statistics.median(step_times),
        "tokens_per_step": tokens_per_step,
        "tokens_per_s": tokens_per_step * steps / sum(step_times),
        "memory": metrics.get("memory"),
        "wire_per_step": None,
        # Device memory QSDP's schemes keep between steps (weight-difference replicas), rank 0, last batch.
        "scheme_memory_bytes": (metrics["metrics"].get("qsdp/scheme_memory_bytes") or [[0, None]])[-1][1],
        # Full garbage collections of process 0 in each timed step (the gc_monitor callback), where logged.
        "gc_gen2_ms": _timed(metrics, "gc/gen2_ms", warmup, total),
        # The recipe entrypoint's phases before the first batch (composer_qsdp.recipes.startup), process 0.
        "startup_s": {k[len("startup/"):-2]: v for k, v in metrics.get("hyperparameters", {}).items()
                      if k.startswith("startup/")} or None,
    }
    reports = list(metrics.get("communication", {}).values())  # QSDP's or ZeroOneAdamDDP's byte counts
    if reports:
        # Evaluation is off, so every counted collective belongs to one of the `total` training batches.
        result["wire_per_step"] = {side: {k: sum(r[side][k] for r in reports) / total
                                          for k in ("sent", "bf16", "native")}
                                   for side in ("weights", "grads", "total")}
        # 0/1 Adam's bytes depend on the phase of its schedule: those of the timed window (it logs them per batch).
        per_batch = dict((int(b), float(v)) for b, v in metrics["metrics"].get("zero_one_adam/bytes_sent", []))
        if per_batch:
            window = statistics.fmean(per_batch[b] for b in range(warmup + 1, total + 1))
            result["wire_per_step"]["grads"]["sent"] = result["wire_per_step"]["total"]["sent"] = window
        timed = _qsdp_timed_wire(metrics, warmup, total, result["wire_per_step"])
        if timed is not None:
            result["wire_per_step_launch"], result["wire_per_step"] = result["wire_per_step"], timed
    series = {name: {int(b): float(v) for b, v in logged} for name, logged in metrics["metrics"].items()
              if name.startswith("qsdp/speculation/")}
    result["speculation"] = common.speculation_counts(series, warmup, total)  # the timed steps' guesses
    return result


def _qsdp_timed_wire(metrics: dict[str, Any], warmup: int, total: int,
                     launch: dict[str, dict[str, float]]) -> dict[str, dict[str, float]] | None:
    """QSDP's bytes per timed step and rank from its per-batch metrics (``sent`` and ``bf16``; ``native``, what the
    unquantized collectives would send, is the same every step and stays the launch's), or None where it did not log
    them for every timed batch. A qWD launch's first step sends the full-precision keyframe, which a training run pays
    once: the timed steps are what every later step costs."""
    window: dict[str, dict[str, float]] = {}
    for side in ("weights", "grads"):
        sent = _timed(metrics, f"qsdp/{side}/bytes_sent", warmup, total, every_batch=True)
        bf16 = _timed(metrics, f"qsdp/{side}/bytes_bf16", warmup, total, every_batch=True)
        if sent is None or bf16 is None:
            return None
        window[side] = {"sent": statistics.fmean(sent), "bf16": statistics.fmean(bf16),
                        "native": launch[side]["native"]}
    window["total"] = {k: window["weights"][k] + window["grads"][k] for k in ("sent", "bf16")}
    window["total"]["native"] = launch["total"]["native"]
    return window


def profile_summary(record: dict[str, Any]) -> dict[str, Any]:
    """Mean per profiled batch (ms) of a ``step_profile`` record's kernel categories and communication overlap,
    with the scheme memory (bytes) it reports."""
    batches = record["per_batch"]
    categories = sorted({c for b in batches for c in b["by_category"]})
    mean = {c: statistics.fmean(b["by_category"].get(c, 0.0) for b in batches) for c in categories}
    keys = ("wall_ms", "communication_busy", "compute_busy", "exposed_communication", "overlapped_communication",
            "gpu_idle")
    ranges = sorted({r for b in batches for r in b["idle_by_range"]})
    idle = {r: statistics.fmean(b["idle_by_range"].get(r, 0.0) for b in batches) for r in ranges}
    return {"batches": [b["batch"] for b in batches], "by_category_ms": mean,
            **{k: statistics.fmean(b[k] for b in batches) for k in keys},
            "idle_by_range_ms": dict(sorted(idle.items(), key=lambda kv: -kv[1])),
            "host_syncs": batches[-1]["host_syncs"],
            "scheme_memory_bytes": record["scheme_memory_bytes"], "top": batches[-1]["top"]}


def plain_fsdp2_bytes(model: torch.nn.Module, nproc: int, gather_bytes: int, reduce_bytes: int = 4) -> int:
    """Bytes one rank of plain FSDP2 puts on the wire per micro-batch: ``(W-1)/W`` of a forward and a backward
    all-gather of every parameter in ``gather_bytes`` per element and of an fp32 (``reduce_bytes``) reduce-scatter
    of its gradient, each parameter's first dimension padded to a multiple of ``W = nproc`` as FSDP2 shards it."""
    padded = 0
    for p in model.parameters():
        rows = p.shape[0] if p.dim() else 1
        padded += -(-rows // nproc) * nproc * (p.numel() // rows if rows else 0)
    return (nproc - 1) * padded * (2 * gather_bytes + reduce_bytes) // nproc
