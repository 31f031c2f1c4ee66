# Run from the repository root, writing ablation.md beside this file:
#   D=benchmarks/results/2026-12-01_h200_c5d188e; .venv/bin/python $D/ablation.py > $D/ablation.md
# Issue 46's ablation of the LoCo presets' sides on GPT-125M's prose, seed 17: each arm's gap to the same seed's
# plain FSDP2 run (baseline-1r, git 4f369ed) at every evaluation and every window of 100 training batches, beside
# the full presets qwd-w3g3-loco (4f369ed) and qwd-w3g2-loco (this run), with each arm's measured relative errors.
# Last, whether the sides add up: the weights arm's gap plus a gradient arm's against the preset's own gap.
# The training-loss windows of the 4f369ed runs are c526aae's rebuild of that record from its logs.
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parents[1]))
from ablation_gaps import curve, gap_table, load_arms  # noqa: E402

RECORD = "convergence-gpt-125m-t512-b32-s2000"
EARLIER = HERE.parent / "2026-12-01_h200_c526aae" / "train-loss" / "prose-125m" / f"{RECORD}.json"
SEED = 17
ARMS = ["qwd3-only", "g4loco-only", "g3loco-only", "g2loco-only", "qwd-w3g3-loco", "qwd-w3g2-loco", "w8g8"]
EVALS = list(range(200, 2001, 200))
WINDOWS = [500, 1000, 1500, 1800, 2000]


def additivity(runs: dict) -> None:
    base = curve(runs[f"baseline-1r@s{SEED}"], "curve")
    weights = curve(runs[f"qwd3-only@s{SEED}"], "curve")
    print(f"\nValidation loss: `qwd3-only`'s gap plus the gradient arm's, against the preset's gap (percentage points):\n")
    print("| preset = sides | " + " | ".join(str(s) for s in EVALS) + " |")
    print("|---|" + "---|" * len(EVALS))
    for preset, grads in (("qwd-w3g3-loco", "g3loco-only"), ("qwd-w3g2-loco", "g2loco-only")):
        full, side = curve(runs[f"{preset}@s{SEED}"], "curve"), curve(runs[f"{grads}@s{SEED}"], "curve")
        cells = []
        for s in EVALS:
            if s not in side:
                cells.append("")
                continue
            total = sum(100 * (c[s] - base[s]) / base[s] for c in (weights, side))
            cells.append(f"{100 * (full[s] - base[s]) / base[s]:+.2f} = {total:+.2f}")
        print(f"| `{preset}` = `qwd3-only` + `{grads}` | " + " | ".join(cells) + " |")


def main() -> None:
    runs = load_arms([EARLIER, HERE / "prose-125m" / f"{RECORD}.json"])
    print("\n" + gap_table(runs, ARMS, "baseline-1r", SEED, "curve", EVALS, "Validation loss at the evaluations"))
    print("\n" + gap_table(runs, ARMS, "baseline-1r", SEED, "train_curve", WINDOWS,
                            "Training loss, the 100 batches before the step"))
    additivity(runs)


if __name__ == "__main__":
    main()
