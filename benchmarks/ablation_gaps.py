"""Ablation arms against the same seeds' baseline runs: the gap at every evaluation and training window.

An ablation changes one choice of a preset and runs a few seeds; its arms are read against the baseline runs of
those seeds (the same initial weights and data order), not the baseline's seed range, which is wider than most
ablation effects. This prints, from convergence records (``convergence.py``'s JSON, any mix of runs), the gap to the
baseline in percent of the baseline's loss, for the validation loss at each evaluation and the training loss
averaged over the logged batches before each step. With one seed: a row per arm with its measured relative errors
(weights / gradients). With several: a row per arm and step with each seed's gap and the paired mean over the
seeds, its Student-t 95% interval and two-sided p (a screen of a candidate before the protocol's full length).

    python benchmarks/ablation_gaps.py RECORD.json [RECORD.json ...] --seeds 17 --baseline baseline-1r \\
        --arms qwd-w3g3-loco qwd-w3g3-loco-fp32 --windows 500 1000 1500 2000

A later record's run of an arm replaces an earlier one's (name the records oldest first). In a combined record
(``convergence.py --combine``) a seed run in several sessions is labelled ``arm@sSEED@run<i>``; the one of them that
finished stands for the seed, and a seed with several finished runs is named by the error that asks for it.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import seed_stats
from convergence_report import TRAIN_WINDOW, read_record

__all__ = ["curve", "gap", "gap_table", "load_arms", "main", "paired_table", "rel_errors"]


def load_arms(records: list[Path]) -> dict[str, dict[str, Any]]:
    """Every arm of the records by its label (``arm@sSEED``, as the arms are named now), the later record's run
    winning."""
    arms: dict[str, dict[str, Any]] = {}
    for path in records:
        arms |= _one_run_per_seed(read_record(Path(path))["arms"])
    return arms


def _one_run_per_seed(arms: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """A combined record's ``arm@sSEED@run<i>`` runs (each holding its ``arm@sSEED`` as ``arm``, as
    ``convergence_report.combine_records`` writes them) under ``arm@sSEED`` where exactly one of them finished (the
    others stopped early, e.g. cut by a session's end); the labels of a seed finished more than once are kept."""
    runs_of: dict[str, list[str]] = {}
    for label, run in arms.items():
        runs_of.setdefault(run.get("arm", label), []).append(label)
    out = dict(arms)
    for arm, labels in runs_of.items():
        finished = [label for label in labels if arms[label].get("complete")]
        if labels != [arm] and len(finished) == 1:
            for label in labels:
                del out[label]
            out[arm] = arms[finished[0]]
    return out


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


def _require(runs: dict[str, dict[str, Any]], arms: list[str], seeds: list[int]) -> None:
    missing = [f"{arm}@s{seed}" for seed in seeds for arm in arms if f"{arm}@s{seed}" not in runs]
    if missing:
        raise SystemExit(f"no run {missing} in the records; they hold {sorted(runs)}")


def _runs_of(baseline: str) -> str:
    return f"{'plain FSDP2 ' if baseline.startswith('baseline') else ''}run (`{baseline}`)"


def gap_table(runs: dict[str, dict[str, Any]], arms: list[str], baseline: str, seed: int, key: str,
              steps: list[int], what: str) -> str:
    """A markdown table: each arm's gap to ``baseline``'s run of ``seed`` at ``steps``, titled by ``what``."""
    _require(runs, [baseline, *arms], [seed])
    base = curve(runs[f"{baseline}@s{seed}"], key)
    lines = [f"{what}, % of seed {seed}'s {_runs_of(baseline)}:", "",
             "| arm | rel. error w / g | " + " | ".join(str(s) for s in steps) + " |",
             "|---|---|" + "---|" * len(steps)]
    for arm in arms:
        run = runs[f"{arm}@s{seed}"]
        lines.append(f"| `{arm}` | {rel_errors(run)} | "
                     + " | ".join(gap(curve(run, key), base, s) for s in steps) + " |")
    return "\n".join(lines)


def paired_table(runs: dict[str, dict[str, Any]], arms: list[str], baseline: str, seeds: list[int], key: str,
                 steps: list[int], what: str) -> str:
    """A markdown table: at each of ``steps`` every seed's run reached, each arm's gap to ``baseline``'s run of the
    same seed, and the paired mean over ``seeds`` with its 95% interval and p (percent of the baseline's loss)."""
    _require(runs, [baseline, *arms], seeds)
    base = {seed: curve(runs[f"{baseline}@s{seed}"], key) for seed in seeds}
    lines = [f"{what}, % of each seed's {_runs_of(baseline)}:", "",
             f"| arm | step | {' / '.join(f's{seed}' for seed in seeds)} | paired mean | 95% | p |",
             "|---|---|---|---|---|---|"]
    for arm in arms:
        own = {seed: curve(runs[f"{arm}@s{seed}"], key) for seed in seeds}
        for step in steps:
            if not all(step in own[seed] and step in base[seed] for seed in seeds):
                continue
            r = seed_stats.compare({seed: {step: own[seed][step]} for seed in seeds},
                                   {seed: {step: base[seed][step]} for seed in seeds}, step)
            ci, p = r.paired_ci95_pct, r.paired_p_value  # None where the seeds' gaps do not spread
            lines.append(f"| `{arm}` | {step} | {' / '.join(gap(own[s], base[s], step) for s in seeds)} | "
                         f"{r.paired_gap_pct:+.2f}% | {'n/a' if ci is None else f'{ci[0]:+.2f} .. {ci[1]:+.2f}%'} | "
                         f"{'n/a' if p is None else f'{p:.3f}'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("records", nargs="+", type=Path, help="convergence records (JSON), oldest first")
    p.add_argument("--seeds", "--seed", nargs="+", type=int, required=True, help="the seeds the ablation ran")
    p.add_argument("--baseline", default="baseline-1r", help="the arm the gaps are taken to (default baseline-1r)")
    p.add_argument("--arms", nargs="+", required=True, help="the arms, in the tables' order")
    p.add_argument("--evals", nargs="*", type=int,
                   help="validation steps (default: every evaluation of the baseline's run)")
    p.add_argument("--windows", nargs="*", type=int, default=[],
                   help="training-loss windows, by the step that ends them (default: none)")
    args = p.parse_args(argv)
    runs = load_arms(args.records)
    _require(runs, [args.baseline], args.seeds)
    if args.windows:  # a missing run is named by the table
        labels = [f"{arm}@s{seed}" for seed in args.seeds for arm in [args.baseline, *args.arms]]
        untrained = sorted(label for label in labels if label in runs and "train_curve" not in runs[label])
        if untrained:
            raise SystemExit(f"--windows needs training-loss curves, which the records of {untrained} do not hold "
                             "(they were written before the driver logged them): leave --windows out")
    evals = args.evals or sorted(set.intersection(*(set(curve(runs[f"{args.baseline}@s{s}"])) for s in args.seeds)))
    seeds = args.seeds[0] if len(args.seeds) == 1 else args.seeds
    table = gap_table if len(args.seeds) == 1 else paired_table
    print(table(runs, args.arms, args.baseline, seeds, "curve", evals, "Validation loss at the evaluations"))
    if args.windows:
        print()
        print(table(runs, args.arms, args.baseline, seeds, "train_curve", args.windows,
                    f"Training loss, the {TRAIN_WINDOW} batches before the step"))


if __name__ == "__main__":
    main()
