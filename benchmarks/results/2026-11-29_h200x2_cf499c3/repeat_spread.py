"""The run-to-run spread of ``w8g8-nearest``: its three seeds run three times (three sessions, the same arithmetic),
against plain FSDP2's three seeds, at every evaluation all nine runs reached; and the largest difference between the
exact-weight and quantized-weight evaluations of this record. Run from this folder: ``python repeat_spread.py``."""

import json
import statistics
from pathlib import Path

NAME = "convergence-gpt-125m-t512-b32-s2000.json"
RECORDS = {"ee91f25": "../2026-11-29_h200_ee91f25", "b1a136b": "../2026-11-29_h200x2_b1a136b", "cf499c3": "."}


def curve(arm: dict, key: str = "curve") -> dict[int, float]:
    return {int(step): loss for step, loss in arm.get(key) or []}


arms = {rev: json.loads((Path(folder) / NAME).read_text())["arms"] for rev, folder in RECORDS.items()}
base = [curve(arms["ee91f25"][f"baseline-1r@s{s}"]) for s in (17, 18, 19)]
runs = {(rev, s): curve(arms[rev][f"w8g8-nearest@s{s}"]) for rev in RECORDS for s in (17, 18, 19)}
steps = sorted(set.intersection(*(set(c) for c in runs.values())))
print("| step | plain FSDP2 mean (std), 3 seeds | w8g8-nearest mean (std), 9 runs | gap of means | "
      "same seed, largest spread of its 3 runs |")
print("|---|---|---|---|---|")
for step in steps:
    b = [c[step] for c in base]
    q = [c[step] for c in runs.values()]
    per_seed = max(max(v) / min(v) - 1 for v in ([runs[(r, s)][step] for r in RECORDS] for s in (17, 18, 19)))
    print(f"| {step} | {statistics.mean(b):.4f} ({statistics.stdev(b):.4f}) | {statistics.mean(q):.4f} "
          f"({statistics.stdev(q):.4f}) | {100 * (statistics.mean(q) / statistics.mean(b) - 1):+.2f}% | "
          f"{100 * per_seed:.2f}% |")
here = arms["cf499c3"]
diffs = [abs(quantized / curve(arm)[step] - 1) for arm in here.values()
         for step, quantized in curve(arm, "quantized_curve").items()]
print(f"\nexact against quantized-weight evaluation, {len(diffs)} evaluations: largest difference "
      f"{100 * max(diffs):.3f}%, median {100 * statistics.median(diffs):.3f}%")
