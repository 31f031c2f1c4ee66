"""How often the recipes' gradient clipping acts: the per-step global gradient norm after clipping, from each run's
metrics file (Composer's OptimizerMonitor, ``l2_norm/grad/global``, logged at batch end, after the clip), written as
``clip_norms.csv`` and summarized per 100 steps. A step was clipped when its norm reads the threshold (1.0).

    python clip_steps.py K-125/baseline/metrics-00.json K-350/baseline/metrics-00.json  # from raw.tar.xz
"""

import csv
import json
import statistics
import sys
from pathlib import Path

THRESHOLD = 1.0  # the recipes' grad_clip_norm
names = ("gpt-125m", "gpt-350m")
norms = {n: dict(json.loads(Path(p).read_text())["metrics"]["l2_norm/grad/global"])
         for n, p in zip(names, sys.argv[1:])}
steps = sorted(norms[names[0]])
with open(Path(__file__).with_name("clip_norms.csv"), "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["step", *(f"{n}_norm_after_clip" for n in names)])
    writer.writerows([s, *(f"{norms[n][s]:.4f}" for n in names)] for s in steps)
print("| steps | " + " | ".join(f"{n}: clipped steps, median norm" for n in names) + " |")
print("|---|" + "---|" * len(names))
for lo in range(0, len(steps), 100):
    cells = []
    for n in names:
        window = [norms[n][s] for s in steps if lo < s <= lo + 100]
        cells.append(f"{sum(v >= THRESHOLD - 1e-3 for v in window)} of {len(window)}, {statistics.median(window):.3f}")
    print(f"| {lo + 1}-{lo + 100} | " + " | ".join(cells) + " |")
