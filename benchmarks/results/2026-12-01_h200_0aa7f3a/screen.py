# Run from the repository root, writing screen.md beside this file:
#   D=benchmarks/results/2026-12-01_h200_0aa7f3a; .venv/bin/python $D/screen.py > $D/screen.md
# Issue 50's screen of w8g4-h128 on GPT-350M's prose (seeds 17-19, stopped at steps 544-552 of 1,000): each seed's
# gap to the same seed's plain FSDP2 run (da4936b) at every evaluation and window of training loss the runs share,
# beside w8g4's (6495b94), w8g8's (9f3327a) and qwd-w3g3-loco's (da4936b) gaps of the same seeds, and the paired
# difference of w8g4-h128 against w8g4 itself. Paired mean, Student-t 95% interval and p over seeds by seed_stats.
import json
import sys
from pathlib import Path

sys.path.insert(0, "benchmarks")
import seed_stats  # noqa: E402

HERE = Path(__file__).parent
RECORD = "convergence-gpt-350m-t512-b32-s1000"
EARLIER = HERE.parent / "2026-12-01_h200_c526aae" / "prose-350m" / f"{RECORD}-combined.json"
SEEDS = (17, 18, 19)
LAST = 500  # the last window of 100 batches every seed of w8g4-h128 finished
ARMS = {"w8g4-h128": "w8g4-h128 (this run)", "w8g4": "w8g4 (6495b94)", "w8g8": "w8g8 (9f3327a)",
        "qwd-w3g3-loco-ahead": "qwd-w3g3-loco (da4936b)"}


def curves(arms: dict, name: str, key: str) -> dict[int, dict[int, float]]:
    return {seed: dict((int(s), v) for s, v in arms[f"{name}@s{seed}"][key]) for seed in SEEDS}


def row(label: str, arm: dict[int, dict[int, float]], base: dict[int, dict[int, float]], step: int) -> str:
    one = {seed: {step: arm[seed][step]} for seed in SEEDS}
    r = seed_stats.compare(one, {seed: {step: base[seed][step]} for seed in SEEDS}, step)
    per_seed = " / ".join(f"{100 * (arm[s][step] - base[s][step]) / base[s][step]:+.2f}" for s in SEEDS)
    lo, hi = r.paired_ci95_pct
    gap, p = r.paired_gap_pct, r.paired_p_value
    return f"| {label} | {step} | {per_seed} | {gap:+.2f}% | {lo:+.2f} .. {hi:+.2f}% | {p:.3f} |"


def main() -> None:
    arms = json.loads(EARLIER.read_text())["arms"]
    arms |= {k: v for k, v in json.loads((HERE / "prose-350m" / f"{RECORD}.json").read_text())["arms"].items()}
    print("| arm | step | per seed 17 / 18 / 19 (%) | paired mean | 95% | p |\n|---|---|---|---|---|---|")
    for key, steps, what in (("curve", (200, 400), "validation loss"), ("train_curve", (300, 400, LAST),
                                                                      "training loss, 100 batches before")):
        base = curves(arms, "baseline", key)
        for step in steps:
            for name, label in ARMS.items():
                print(row(f"{label}, {what}", curves(arms, name, key), base, step))
    h128, w8g4 = curves(arms, "w8g4-h128", "train_curve"), curves(arms, "w8g4", "train_curve")
    for step in (300, 400, LAST):
        print(row("w8g4-h128 against w8g4, training loss", h128, w8g4, step))


if __name__ == "__main__":
    main()
