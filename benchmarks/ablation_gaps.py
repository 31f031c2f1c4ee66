"""One seed's ablation arms against the same seed's baseline run: the gap at every evaluation and training window.

An ablation changes one choice of a preset and runs one seed; its arms are read against the baseline run of that
seed (the same initial weights and data order), not the baseline's seed range, which is wider than most ablation
effects. This prints, from convergence records (``convergence.py``'s JSON, any mix of runs), one row per arm: its
measured relative errors (weights / gradients) and its gap to the baseline in percent of the baseline's loss, for
the validation loss at each evaluation and the training loss averaged over the logged batches before each step.

    python benchmarks/ablation_gaps.py RECORD.json [RECORD.json ...] --seed 17 --baseline baseline-1r \\
        --arms qwd-w3g3-loco qwd-w3g3-loco-fp32 --windows 500 1000 1500 2000

A later record's run of an arm replaces an earlier one's (name the records oldest first).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from convergence_report import TRAIN_WINDOW

__all__ = ["curve", "gap", "gap_table", "load_arms", "main", "rel_errors"]


def load_arms(records: list[Path]) -> dict[str, dict[str, Any]]:
    """Every arm of the records by its label (``arm@sSEED``), the later record's run winning."""
    arms: dict[str, dict[str, Any]] = {}
    for path in records:
        arms |= json.loads(Path(path).read_text())["arms"]
    return arms


def curve(run: dict[str, Any], key: str = "curve") -> dict[int, float]:
    """A run's losses by step: ``curve`` the validation loss, ``train_curve`` the windowed training loss."""
    return {int(step): loss for step, loss in run[key]}


def gap(arm: dict[int, float], base: dict[int, float], step: int) -> str:
    """``arm``'s loss at ``step`` against ``base``'s, in percent of ``base`` (blank where the arm has no value)."""
    return f"{100 * (arm[step] - base[step]) / base[step]:+.2f}" if step in arm and step in base else ""


def rel_errors(run: dict[str, Any]) -> str:
    """The run's measured relative errors, ``weights / gradients`` (``-`` for a side sent unquantized)."""
    e = run.get("rel_error") or {}
    return " / ".join("-" if e.get(side) is None else f"{e[side]:.3f}" for side in ("weights", "grads"))


def gap_table(runs: dict[str, dict[str, Any]], arms: list[str], baseline: str, seed: int, key: str,
              steps: list[int], what: str) -> str:
    """A markdown table: each arm's gap to ``baseline``'s run of ``seed`` at ``steps``, titled by ``what``."""
    label = f"{baseline}@s{seed}"
    missing = [arm for arm in (baseline, *arms) if f"{arm}@s{seed}" not in runs]
    if missing:
        raise SystemExit(f"no run of seed {seed} for {missing} in the records; they hold {sorted(runs)}")
    base = curve(runs[label], key)
    lines = [f"{what}, % of seed {seed}'s {'plain FSDP2 ' if baseline.startswith('baseline') else ''}run "
             f"(`{baseline}`):", "",
             "| arm | rel. error w / g | " + " | ".join(str(s) for s in steps) + " |",
             "|---|---|" + "---|" * len(steps)]
    for arm in arms:
        run = runs[f"{arm}@s{seed}"]
        lines.append(f"| `{arm}` | {rel_errors(run)} | "
                     + " | ".join(gap(curve(run, key), base, s) for s in steps) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("records", nargs="+", type=Path, help="convergence records (JSON), oldest first")
    p.add_argument("--seed", type=int, required=True, help="the seed the ablation ran")
    p.add_argument("--baseline", default="baseline-1r", help="the arm the gaps are taken to (default baseline-1r)")
    p.add_argument("--arms", nargs="+", required=True, help="the arms, in the tables' order")
    p.add_argument("--evals", nargs="*", type=int,
                   help="validation steps (default: every evaluation of the baseline's run)")
    p.add_argument("--windows", nargs="*", type=int, default=[],
                   help="training-loss windows, by the step that ends them (default: none)")
    args = p.parse_args(argv)
    runs = load_arms(args.records)
    label = f"{args.baseline}@s{args.seed}"
    if label not in runs:
        raise SystemExit(f"no run {label!r} in the records; they hold {sorted(runs)}")
    evals = args.evals or sorted(curve(runs[label]))
    print(gap_table(runs, args.arms, args.baseline, args.seed, "curve", evals, "Validation loss at the evaluations"))
    if args.windows:
        print()
        print(gap_table(runs, args.arms, args.baseline, args.seed, "train_curve", args.windows,
                        f"Training loss, the {TRAIN_WINDOW} batches before the step"))


if __name__ == "__main__":
    main()
