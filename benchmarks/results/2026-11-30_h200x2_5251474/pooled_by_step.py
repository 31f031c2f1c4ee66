"""Every run of the 8-bit arms and of plain FSDP2 (`baseline-1r`) on `pysource` at GPT-125M, pooled by step over the
records of four sessions, each arm against every plain FSDP2 run at the same step (``seed_stats.compare``: mean,
Welch's 95% interval, the runs' range). Run from this folder: ``python pooled_by_step.py``."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/
from seed_stats import compare  # noqa: E402

NAME = "convergence-gpt-125m-t512-b32-s2000.json"
#: Record folder by session (git); the baseline's runs are those of 84d38b3 (in ee91f25) and of this session.
RECORDS = {"ee91f25": "../2026-11-29_h200_ee91f25", "b1a136b": "../2026-11-29_h200x2_b1a136b",
           "cf499c3": "../2026-11-29_h200x2_cf499c3", "5251474": "."}
BASELINE = {"ee91f25", "5251474"}  # b1a136b and cf499c3 tabled ee91f25's baseline folders again
ARMS = ("w8g8", "w8g8-nearest", "w8g4", "qwd-w3g3-loco")


def runs(arm: str, sessions) -> dict[tuple[int, int], dict[int, float]]:
    """(seed, session index) -> {step: exact-or-recorded val loss} of every run of ``arm``."""
    found = {}
    for i, rev in enumerate(RECORDS):
        if rev not in sessions:
            continue
        for name, r in json.loads((Path(RECORDS[rev]) / NAME).read_text())["arms"].items():
            if name.rpartition("@s")[0] == arm and r["curve"]:
                found[(int(name.rpartition("@s")[2]), i)] = {int(step): loss for step, loss in r["curve"]}
    return found


base = runs("baseline-1r", BASELINE)
for arm in ARMS:
    mine = runs(arm, RECORDS)
    print(f"\n### {arm}: {len(mine)} runs ({', '.join(sorted({f's{s}' for s, _ in mine}))}) against plain FSDP2's "
          f"{len(base)} runs ({len({s for s, _ in base})} seeds)\n")
    print("| step | runs | mean | plain FSDP2 mean (std) | plain FSDP2 range | gap of means | Welch 95% | "
          "paired gap, 95% (p) | verdict |")
    print("|---|---|---|---|---|---|---|---|---|")
    for step in sorted({s for c in mine.values() for s in c}):
        reached = {run: {s: v for s, v in c.items() if s <= step} for run, c in mine.items() if step in c}
        c = compare(reached, {run: {s: v for s, v in c.items() if s <= step} for run, c in base.items()}, 2000)
        ci = f"{c.ci95_pct[0]:+.2f} .. {c.ci95_pct[1]:+.2f}%" if c.ci95_pct else "n/a"
        paired = (f"{c.paired_gap_pct:+.2f}% ({c.paired_ci95_pct[0]:+.2f} .. {c.paired_ci95_pct[1]:+.2f}, "
                  f"p {c.paired_p_value:.2f})" if c.paired_ci95_pct else "n/a")
        print(f"| {step} | {len(reached)} | {c.arm_mean:.4f} | {c.baseline_mean:.4f} ({c.baseline_std:.4f}) | "
              f"{c.baseline_range[0]:.4f} .. {c.baseline_range[1]:.4f} | {c.gap_pct:+.2f}% | {ci} | {paired} | "
              f"{c.verdict.replace('incomplete: ', '')} |")
print("\n### plain FSDP2: each seed's two runs (84d38b3, 5251474) at step 2000\n")
for seed in sorted({s for s, _ in base}):
    losses = [c[2000] for (s, _), c in sorted(base.items()) if s == seed]
    print(f"- s{seed}: " + " / ".join(f"{v:.4f}" for v in losses)
          + (f" ({100 * (max(losses) / min(losses) - 1):.2f}% apart)" if len(losses) > 1 else ""))
