"""When a step's collectives and compute run: the timeline of one ``step_profile`` trace.

``StepProfile`` (``callbacks.step_profile.trace=true``, which ``bench_e2e.py --profile -o ...`` passes through) writes
each profiled batch's Chrome trace; its summary gives totals (NCCL busy, exposed, overlapped). This prints the
order: in bins of ``--bin-ms``, how long the compute kernels, the weight all-gathers and the gradient collectives
ran, and per phase (the step cut at the first and the last weight gather and gradient collective) how busy
each was. A phase whose collectives are busy throughout while compute is not
is bound by the network; one whose compute is busy throughout has room on the link.

Kernels: NCCL's ``AllGather`` kernels are the weight gathers; ``ReduceScatter``, ``SendRecv`` (an all-to-all) and
``AllToAll`` the gradient collectives; every other NCCL kernel (the loss's all-reduce...) counts as other
communication; compute is every non-NCCL kernel (:func:`composer_qsdp.recipes.step_profile.categorize`). Busy
times are the union of a kind's kernel intervals, over all streams.

    python benchmarks/trace_timeline.py OUT/socket/qsdp-qwd-w3g2-loco.profile/step_profile-rank0.trace.json.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

from composer_qsdp.recipes.step_profile import categorize, merge_intervals, overlap_length

#: ``(kind, substrings of NCCL kernel names)``; the first match wins.
KINDS = (("weights", ("AllGather",)), ("grads", ("ReduceScatter", "SendRecv", "AllToAll")))
_GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
_PHASE_NAMES = {"weights": "weight gathers", "grads": "gradient collectives"}


def kind(name: str) -> str:
    """``"weights"``, ``"grads"``, ``"other_comm"`` for an NCCL kernel (:data:`KINDS`), ``"compute"`` otherwise."""
    if categorize(name) != "communication":
        return "compute"
    return next((k for k, parts in KINDS if any(p in name for p in parts)), "other_comm")


def timeline(kernels: list[tuple[str, float, float]], bin_us: float) -> dict:
    """Bins and phases of ``(name, start, end)`` kernel intervals (microseconds, any origin).

    Returns:
        ``{"span": [0, end], "bins": [{"start", "compute", "weights", "grads", "other_comm"}...],
        "phases": [{"phase", "start", "end", "compute", "weights", "grads"}...]}``, times in milliseconds from the
        first kernel's start. The phases cut the step at the first and last kernel of each collective kind and are
        named by the kinds whose first-to-last window covers them.
    """
    if not kernels:
        raise ValueError("the trace holds no GPU kernel")
    origin = min(start for _, start, _ in kernels)
    by_kind: dict[str, list[tuple[float, float]]] = {k: [] for k in ("compute", "weights", "grads", "other_comm")}
    for name, start, end in kernels:
        by_kind[kind(name)].append((start - origin, end - origin))
    end = max(e for _, _, e in kernels) - origin
    unions = {k: merge_intervals(v) for k, v in by_kind.items()}

    def busy(lo: float, hi: float, kinds: tuple[str, ...] = tuple(unions)) -> dict[str, float]:
        return {k: overlap_length(unions[k], [(lo, hi)]) * 1e-3 for k in kinds}

    bins = []
    lo = 0.0
    while lo < end:
        hi = min(lo + bin_us, end)
        bins.append({"start": lo * 1e-3, **busy(lo, hi)})
        lo = hi
    windows = {side: (unions[side][0][0], unions[side][-1][1]) for side in ("weights", "grads") if unions[side]}
    cuts = sorted({0.0, end, *(t for window in windows.values() for t in window)})
    phases = []
    for a, b in zip(cuts, cuts[1:]):
        inside = [side for side, (s, e) in windows.items() if s <= a and b <= e]
        phases.append({"phase": " + ".join(_PHASE_NAMES[side] for side in inside) or "no weight or gradient "
                       "collective", "start": a * 1e-3, "end": b * 1e-3, **busy(a, b, ("compute", "weights", "grads"))})
    return {"span": [0.0, end * 1e-3], "bins": bins, "phases": phases}


def read_kernels(path: Path) -> list[tuple[str, float, float]]:
    """The GPU kernels, copies and fills of a (gzipped) Chrome trace as ``(name, start, end)`` in microseconds."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    return [(e["name"], e["ts"], e["ts"] + e["dur"]) for e in events
            if e.get("ph") == "X" and e.get("cat") in _GPU_CATEGORIES]


def render(result: dict, title: str) -> str:
    """Markdown: the phases, then the bins."""
    lines = [f"#### {title}", "", f"GPU time of the traced step: {result['span'][1]:.1f} ms", "",
             "| phase | from (ms) | to (ms) | compute busy | weight gathers busy | gradient collectives busy |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {p['phase']} | {p['start']:.1f} | {p['end']:.1f} | {p['compute']:.1f} | {p['weights']:.1f} | "
              f"{p['grads']:.1f} |" for p in result["phases"]]
    lines += ["", "| from (ms) | compute | weight gathers | gradient collectives | other NCCL |",
              "|---|---|---|---|---|"]
    lines += [f"| {b['start']:.0f} | {b['compute']:.1f} | {b['weights']:.1f} | {b['grads']:.1f} | "
              f"{b['other_comm']:.1f} |" for b in result["bins"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+", type=Path, help="step_profile-rank<r>.trace.json(.gz) files")
    parser.add_argument("--bin-ms", type=float, default=20.0, help="bin width (ms, > 0)")
    args = parser.parse_args(argv)
    if args.bin_ms <= 0:
        parser.error(f"--bin-ms={args.bin_ms} is invalid; it must be > 0")
    for path in args.traces:
        print(render(timeline(read_kernels(path), args.bin_ms * 1e3), str(path)))


if __name__ == "__main__":
    main()
