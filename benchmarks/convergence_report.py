"""The convergence driver's report: each arm's summary from its metrics files (curve, final loss, gap to its
baseline at the same step, bytes and their compression, sampled errors, step time), the noise band of the two
FSDP2 seeds, the learning-rate sweep and the seed comparisons, written as ``convergence-<name>`` .csv (validation
loss per arm and evaluation step), .json (the record), .md (the table and the targets' lines) and .png (all
curves, and their second half zoomed); and several runs' records combined into one, each arm with its gap to every
run's baseline.

The targets are measured and reported, never asserted.
"""

from __future__ import annotations

import collections
import csv
import io
import json
import statistics
from pathlib import Path
from typing import Any

import e2e_common as common
import seed_stats
from convergence_arms import (ARM_NAMES, FSDP_BASELINES, arm_seed, base_arm, current_name, run_arm_name,
                              seedless_name)
from convergence_plan import Plan
from convergence_runner import (TRAIN_LOSS, VAL_LOSS, VAL_QUANTIZED_LOSS, launch_count, merged_metrics,
                                recorded_backend, recorded_eval_weights)
from provenance import command_line

from composer_qsdp.shared_gpu import SHARED_GPU_TRANSPORTS

W8G8_TARGET_PCT = 1.0  # the project's target: W8G8 final validation loss within 1% of plain FSDP
ZERO_ONE_TARGET_PCT = 1.0  # issue 13: 0/1 Adam's final validation loss within 1% of DDP AdamW
ZERO_ONE_BYTES_TARGET = 10.0  # ... with at least 10x fewer bytes sent per rank than DDP's fp32 all-reduce
#: Batches per window of an arm's recorded training loss (``train_curve``): 100 batches of the protocol's 32 x 512
#: tokens are 1.6 M tokens, 1.3-2 times its corpora's held-out splits.
TRAIN_WINDOW = 100
#: The 0/1 Adam arms whose target line the summary prints (the ablations attribute a gap and have none).
ZERO_ONE_TARGET_ARMS = ("zero-one-adam", "zero-one-adam-4r", "zero-one-adam-4r-sync", "zero-one-adam-local2",
                        "zero-one-adam-local2-4r", "zero-one-adam-local4", "zero-one-adam-local4-4r",
                        "zero-one-adam-rescale", "zero-one-adam-rescale-4r")


def _mean(series: dict[int, float] | None) -> float | None:
    return statistics.fmean(series.values()) if series else None


def _training_ratio(metrics: dict[str, dict[int, float]],
                    name: str = "qsdp/compression_vs_unquantized") -> float | None:
    """QSDP's bytes over all training batches against a baseline, from the per-batch ratio ``name`` (the same
    collectives unquantized, or ``qsdp/compression_vs_plain_fsdp``: plain FSDP2): the sum of each batch's baseline
    bytes (its ratio times its bytes sent) over the sum of its bytes sent (a ratio of sums, so a batch that sends
    little, e.g. the one after a qWD evaluation, weighs what its bytes weigh). None where the run did not log it."""
    ratios = metrics.get(name)
    if not ratios:
        return None
    sides = [metrics.get(f"qsdp/{side}/bytes_sent", {}) for side in ("weights", "grads")]
    sent = {b: sum(side.get(b, 0.0) for side in sides) for b in ratios}
    total = sum(sent.values())
    return sum(ratios[b] * sent[b] for b in ratios) / total if total else None


def train_windows(losses: dict[int, float], window: int = TRAIN_WINDOW) -> list[list[float]]:
    """``[[step, mean], ...]``: the mean training loss of the ``window`` batches before each multiple ``step`` of
    ``window`` (batches ``step - window`` .. ``step - 1`` as Composer numbers them when it logs a batch's loss),
    for the windows whose every batch logged one."""
    ends = range(window, max(losses, default=-1) + 2, window)
    return [[end, statistics.fmean(losses[b] for b in range(end - window, end))] for end in ends
            if all(b in losses for b in range(end - window, end))]


def summarize(plan: Plan) -> dict[str, Any]:
    """Per arm: its validation curve, final loss, gap to its baseline's loss at the same step, the bytes it sent
    and their compression, QSDP's sampled errors, the median step time."""
    arms: dict[str, Any] = {}
    for arm in plan.args.arms:
        metrics = merged_metrics(plan.arm_dir(arm))
        curve = sorted(metrics.get(VAL_LOSS, {}).items())
        quantized_curve = sorted(metrics.get(VAL_QUANTIZED_LOSS, {}).items())
        wall = sorted(metrics.get("time/train", {}).items())
        step_times = [(t1 - t0) * 3600.0 for (b0, t0), (b1, t1) in zip(wall, wall[1:]) if b1 == b0 + 1]
        arms[arm] = {
            "description": plan.arms[arm].description,
            "overrides": list(plan.arms[arm].overrides),
            "lr": plan.arms[arm].lr,
            "lr_scale": plan.arms[arm].lr_scale,
            "nproc": plan.nproc(arm),
            "micro_batch": plan.micro(arm),
            "backend": recorded_backend(plan.arm_dir(arm)) or plan.backend(arm),
            "complete": (plan.arm_dir(arm) / "done.json").is_file(),
            "launches": launch_count(plan.arm_dir(arm)),
            "curve": [[step, loss] for step, loss in curve],
            "train_curve": train_windows(metrics.get(TRAIN_LOSS, {})),
            "final_step": curve[-1][0] if curve else None,
            "final_val_loss": curve[-1][1] if curve else None,
            # What "val" evaluated: "exact" (the full-precision weights, as plain FSDP2), the modes by evaluator
            # label ("val=exact, val_quantized=quantized"), or None (no QSDP, or a run from before QSDP evaluated
            # exact weights: quantized ones).
            "eval_weights": recorded_eval_weights(plan.arm_dir(arm)),
            # The same evaluations with QSDP's quantized weights (--eval-weights both); [] / None otherwise.
            "quantized_curve": [[step, loss] for step, loss in quantized_curve],
            "final_val_loss_quantized": quantized_curve[-1][1] if quantized_curve else None,
            # QSDP's over its training batches; 0/1 Adam logs the run's cumulative ratio, so its last value is the run's.
            "compression_vs_unquantized": (_training_ratio(metrics)
                                           or _last(metrics.get("zero_one_adam/compression_vs_fp32_allreduce"))),
            # Against plain FSDP2 on the same stack (every microbatch's gathers, the backward re-gather included).
            "compression_vs_plain_fsdp": _training_ratio(metrics, "qsdp/compression_vs_plain_fsdp"),
            "total_bytes_sent": (_last(metrics.get("qsdp/total_bytes_sent"))
                                 or _last(metrics.get("zero_one_adam/total_bytes_sent"))),
            "rel_error": {side: _mean(metrics.get(f"qsdp/{side}/rel_error")) for side in ("weights", "grads")},
            "step_time_s_median": statistics.median(step_times) if step_times else None,
            # QSDP's speculative_update over the run (cumulative counts), else None.
            "speculation": common.speculation_counts(metrics),
        }
    for arm, record in arms.items():
        base = arms.get(plan.arms[arm].baseline)
        record["baseline"] = plan.arms[arm].baseline
        record["gap_vs_baseline_pct"] = _gap_pct(record, dict(base["curve"])) if base else None
        seed2 = arms.get("baseline-seed2")
        if plan.arms[arm].baseline == "baseline" and seed2 is not None:
            record["gap_vs_baseline_seed2_pct"] = _gap_pct(record, dict(seed2["curve"]))
    return arms


def _seed_curves(arms: dict[str, Any], key: str = "curve") -> tuple[dict[str, dict[seed_stats.Run, dict[int, float]]],
                                                                   dict[str, set[int]], dict[str, str]]:
    """The runs of every seeded arm by its name without the seed: curves ``key`` (``"curve"``: validation loss,
    ``"train_curve"``: windowed training loss) by :data:`seed_stats.Run`, the seeds, and each group's baseline
    group. In a combined record a seed found in several runs (labelled ``@run<i>``) counts once per run, as
    (seed, i)."""
    curves: dict[str, dict[seed_stats.Run, dict[int, float]]] = {}
    seeds: dict[str, set[int]] = {}
    baselines: dict[str, str] = {}
    for name, r in arms.items():
        arm = r.get("arm", name)  # a combined record's label may end in @run<i>
        seed = arm_seed(arm)
        if seed is None or arm_seed(r.get("baseline") or "") is None or not r.get(key):  # not started: no run
            continue
        group = seedless_name(arm)
        curves.setdefault(group, {})[seed if name == arm else (seed, r["run"])] = dict(r[key])
        seeds.setdefault(group, set()).add(seed)
        baselines[group] = seedless_name(r["baseline"])
    return curves, seeds, baselines


def seed_groups(arms: dict[str, Any], steps: int) -> dict[str, dict[str, Any]]:
    """``--seeds``: each arm's runs against its baseline's runs (:func:`seed_stats.compare`), by the arm's name
    without its seed; {} for a run without seeds."""
    curves, seeds, baselines = _seed_curves(arms)
    groups = {}
    for group, baseline in baselines.items():
        result = seed_stats.compare(curves[group], curves.get(baseline, {}), steps) if group != baseline else None
        groups[group] = {"baseline": baseline, "seeds": sorted(seeds[group]), "runs": len(curves[group]),
                         "comparison": result.to_json() if result else None}
    return groups


def seed_groups_by_step(arms: dict[str, Any], steps: int, key: str = "curve") -> dict[str, list[dict[str, Any]]]:
    """:func:`seed_groups` at every evaluation: by group, the comparison at each step an arm's run evaluated, over
    the runs of both sides that reached it (a combined record pools sessions that stopped at different steps);
    ``key="train_curve"``: the same over the windows of training loss (records from before it was recorded have
    none)."""
    curves, _, baselines = _seed_curves(arms, key)
    by_step: dict[str, list[dict[str, Any]]] = {}
    for group, baseline in baselines.items():
        if group == baseline or baseline not in curves:
            continue
        rows = []
        for step in sorted({s for curve in curves[group].values() for s in curve}):
            cut = [{run: {s: v for s, v in c.items() if s <= step} for run, c in side.items() if step in c}
                   for side in (curves[group], curves[baseline])]
            result = seed_stats.compare(*cut, steps)
            if result is not None:  # None at a step the baseline's runs did not evaluate
                rows.append(result.to_json())
        by_step[group] = rows
    return by_step


def train_trends(arms: dict[str, Any], steps: int) -> dict[str, dict[str, Any]]:
    """By seeded group: :func:`seed_stats.paired_trend` of its windowed training loss against its baseline's over the
    second half of the run (the windows from ``steps / 2`` on); groups without one are left out."""
    curves, _, baselines = _seed_curves(arms, "train_curve")
    trends = {}
    for group, baseline in baselines.items():
        if group != baseline and baseline in curves:
            trend = seed_stats.paired_trend(curves[group], curves[baseline], steps // 2)
            if trend is not None:
                trends[group] = trend
    return trends


def _trend_line(t: dict[str, Any]) -> str:
    ci = "" if t["ci95"] is None else f", 95% {t['ci95'][0]:+.3f} .. {t['ci95'][1]:+.3f}, p {t['p_value']:.2f}"
    return (f"Trend of the paired gap from step {t['from_step']} to {t['to_step']}: {t['slope_per_100_pct']:+.3f}% per "
            f"100 steps ({t['seeds']} seed{'s' if t['seeds'] > 1 else ''}{ci}).")


def _seed_step_lines(by_step: dict[str, list[dict[str, Any]]], what: str = "at every evaluation",
                     trends: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """A table per group of :func:`seed_groups_by_step`'s rows; ``what`` says what its steps are; ``trends``: a
    group's :func:`train_trends` entry, stated under its table."""
    lines = []
    for group, rows in by_step.items():
        if not rows:
            continue
        lines += ["", f"{group} {what}, the runs of both sides that reached it (gaps in % of the "
                      "baseline's mean; 95% intervals):", "",
                  *_table_head(["step", "runs", "mean", "baseline runs", "baseline mean (std)", "baseline range",
                                "gap of means (Welch)", "paired gap (p)", "verdict"])]
        for c in rows:
            welch = "n/a" if c["ci95_pct"] is None else f"{c['ci95_pct'][0]:+.2f} .. {c['ci95_pct'][1]:+.2f}"
            paired = _paired_cell(c)
            lines.append(f"| {c['step']} | {_runs(c['arm_losses'], c['arm_seeds'])} | {c['arm_mean']:.4f} | "
                         f"{_runs(c['baseline_losses'], c['baseline_seeds'])} | "
                         f"{_mean_std(c['baseline_mean'], c['baseline_std'])} | {c['baseline_range'][0]:.4f} .. "
                         f"{c['baseline_range'][1]:.4f} | {c['gap_pct']:+.2f}% ({welch}) | {paired} | "
                         f"{c['verdict'].replace('incomplete: ', '')} |")
        if trends and group in trends:
            lines += ["", _trend_line(trends[group])]
    return lines


def _train_step_lines(by_step: dict[str, list[dict[str, Any]]], trends: dict[str, dict[str, Any]]) -> list[str]:
    """:func:`_seed_step_lines` of the training loss's windows, each group's second-half trend under its table. Each
    batch's loss is taken before the step that trains on it, and a run of the protocol never repeats a batch, so a
    window's mean is a held-out loss on the same batches for every arm of a seed: its paired gap compares arms
    between the evaluations."""
    return _seed_step_lines(by_step, f"by its training loss, the mean of the {TRAIN_WINDOW} batches before each step",
                            trends)


def _paired_cell(c: dict[str, Any]) -> str:
    """A comparison's paired gap with its 95% interval and p where it has one (None below two common seeds; absent
    from records that predate the test)."""
    paired = "n/a" if c["paired_gap_pct"] is None else f"{c['paired_gap_pct']:+.2f}%"
    if c.get("paired_ci95_pct"):
        lo, hi = c["paired_ci95_pct"]
        paired += f" ({lo:+.2f}% .. {hi:+.2f}%, p {c['paired_p_value']:.2f})"
    return paired


def _mean_std(mean: float, std: float | None) -> str:
    return f"{mean:.4f}" if std is None else f"{mean:.4f} ({std:.4f})"


def _runs(losses: dict[str, float], seeds: int) -> str:
    """``3`` for three runs of three seeds, ``9 (3 seeds)`` for three seeds run three times each."""
    return f"{len(losses)}" if len(losses) == seeds else f"{len(losses)} ({seeds} seeds)"


def _seed_lines(groups: dict[str, dict[str, Any]]) -> list[str]:
    rows = [(group, g, g["comparison"]) for group, g in groups.items() if g["comparison"]]
    if not rows:
        return []
    lines = ["", f"Seeds: each arm's final losses against its baseline's at the last step, over the runs that "
                 f"finished where >= {seed_stats.MIN_SEEDS} seeds a side did (else at the last step every run of both "
                 "reached), every run one sample (a seed run in several combined records counts once per run); the paired "
                 "gap sets each seed's runs against the baseline's runs of the same seed, with the paired t-test "
                 "over the seeds both ran; lossless when "
                 f"the arm's mean lies inside the baseline's range with >= {seed_stats.MIN_SEEDS} distinct complete "
                 "seeds a side.", "",
             *_table_head(["arm", "vs", "step", "runs", "mean (std)", "baseline mean (std)", "baseline range",
                           "gap of means", "paired gap (95% CI, p)", "Welch 95% CI (p)", "verdict"])]
    for group, g, c in rows:
        ci = "n/a" if c["ci95_pct"] is None else \
            f"{c['ci95_pct'][0]:+.2f}% .. {c['ci95_pct'][1]:+.2f}% (p {c['p_value']:.2f})"
        paired = _paired_cell(c)
        n = len(c.get("left_out") or ())
        step = f"{c['step']} ({n} stopped run{'s' if n > 1 else ''} left out)" if n else c["step"]
        lines.append(f"| {group} | {g['baseline']} | {step} | {_runs(c['arm_losses'], c['arm_seeds'])} vs "
                     f"{_runs(c['baseline_losses'], c['baseline_seeds'])} | {_mean_std(c['arm_mean'], c['arm_std'])} | "
                     f"{_mean_std(c['baseline_mean'], c['baseline_std'])} | {c['baseline_range'][0]:.4f} .. "
                     f"{c['baseline_range'][1]:.4f} | {c['gap_pct']:+.2f}% | {paired} | {ci} | {c['verdict']} |")
    return lines


def noise_band_pct(arms: dict[str, Any]) -> float | None:
    """|gap| (%) between the two FSDP2 baselines' final validation losses (seeds 17 and 18) at the same step: what
    two runs of one system differ by; None unless both reached the same final step."""
    if "baseline" not in arms or "baseline-seed2" not in arms:
        return None
    gap = _gap_pct(arms["baseline-seed2"], dict(arms["baseline"]["curve"]))
    return None if gap is None else abs(gap)


def _last(series: dict[int, float] | None) -> float | None:
    return series[max(series)] if series else None


def _gap_pct(arm: dict[str, Any], baseline_curve: dict[int, float]) -> float | None:
    """The gap (%) of an arm's final validation loss to the baseline's at the same step; None where the baseline
    has no evaluation at that step."""
    step = arm["final_step"]
    if step not in baseline_curve:
        return None
    return 100.0 * (arm["final_val_loss"] - baseline_curve[step]) / baseline_curve[step]


def csv_text(tokens_per_step: int, arms: dict[str, Any]) -> str:
    """``step,tokens,<arm>...``: validation loss (nats/token) of each arm at each evaluation step; empty where
    an arm has no evaluation (yet)."""
    curves = {arm: dict(r["curve"]) for arm, r in arms.items()}
    # An arm evaluated with the quantized weights too (--eval-weights both) adds a column "<arm> (quantized weights)".
    curves.update({f"{arm} (quantized weights)": dict(r["quantized_curve"]) for arm, r in arms.items()
                   if r.get("quantized_curve")})
    steps = sorted({s for c in curves.values() for s in c})
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["step", "tokens", *curves])
    for step in steps:
        writer.writerow([step, step * tokens_per_step,
                         *(f"{curves[a][step]:.6f}" if step in curves[a] else "" for a in curves)])
    return buf.getvalue()


def markdown(plan: Plan, head: dict[str, str], manifest: dict[str, Any], arms: dict[str, Any],
             status: str) -> str:
    a = plan.args
    m = manifest
    lines = [f"### convergence: {plan.recipe_dir.name} on {head['device']}", "", *common.header_lines(head),
             f"- settings: {a.steps} steps x {a.global_batch} samples x {a.seq_len} tokens = "
             f"{a.steps * plan.tokens_per_step:,} tokens per arm; {_ranks_text(plan, arms)}; evaluation every "
             f"{a.eval_interval} steps on "
             + ("the whole held-out split" if a.eval_batches == -1 else
                f"{a.eval_batches} batches x {a.eval_batch_size} samples per process of the held-out split"),
             f"- corpus: `{m['command']}`: {m['input']['files']} files, {m['input']['bytes'] / 1e6:.1f} MB of "
             f"{m.get('kind', 'pysource')} text -> {m['tokens']['train']:,} train / {m['tokens']['val']:,} val tokens; input sha256 "
             f"`{m['input']['sha256'][:16]}`",
             f"- evaluation: {_eval_weights_text(plan.args.eval_weights, arms)}",
             f"- status: {status}", "", *_table_head(["arm", "ranks", *_arm_columns()])]
    lines += [_arm_row(arm, r, str(r["nproc"])) for arm, r in arms.items()]
    band = noise_band_pct(arms)
    if band is not None:
        gaps = {arm: r["gap_vs_baseline_seed2_pct"] for arm, r in arms.items()
                if r.get("gap_vs_baseline_seed2_pct") is not None and arm != "baseline-seed2"}
        lines += ["", f"Noise band: the FSDP2 baselines of seeds 17 and 18 end {band:.2f}% apart; an FSDP arm's gap "
                      "within that band is not a measured difference. Gaps to baseline-seed2: "
                      + ", ".join(f"{arm} {gap:+.2f}%" for arm, gap in gaps.items())]
    gap = arms.get("w8g8", {}).get("gap_vs_baseline_pct")
    lines += _w8g8_target({} if gap is None else {"": gap})
    for arm, r in arms.items():
        if base_arm(arm) in ZERO_ONE_TARGET_ARMS:
            lines += _zero_one_target(arm, r)
    lines += _speculation_lines(arms)
    lines += _lr_sweep_lines(lr_sweep(arms, a.steps))
    lines += _seed_lines(seed_groups(arms, a.steps))
    lines += _train_step_lines(seed_groups_by_step(arms, a.steps, "train_curve"), train_trends(arms, a.steps))
    return "\n".join(lines) + "\n"


def _speculation_lines(arms: dict[str, Any]) -> list[str]:
    """One line per arm that sent updates ahead (QSDP's speculative_update): how many of its guesses hit."""
    lines = []
    for arm, r in arms.items():
        s = r.get("speculation")
        if s:
            rate = f"{100.0 * s['hits'] / s['sent']:.1f}%" if s["sent"] else "n/a"
            lines.append(f"- {arm}: {s['hits']} of {s['sent']} unit updates sent ahead hit ({rate}), {s['misses']} "
                         f"missed; {s['paused']} steps sent none after a step with a miss")
    return ["", "Updates sent during the backward (speculative_update):", *lines] if lines else []


def lr_sweep(arms: dict[str, Any], steps: int) -> dict[str, Any]:
    """The learning-rate sweep (``--lr-scales``) by arm: each scale's learning rate and final validation loss,
    the best scale among those that finished all ``steps`` (``best_at_edge``: the smallest or largest swept, so the
    best rate may lie beyond), and the best loss's gap (%) to the best of the arm's baseline (so whether one arm's
    lead over another survives tuning each one's rate); {} without a sweep."""
    sweep: dict[str, Any] = {}
    for label, r in arms.items():
        if r.get("lr_scale") is None:
            continue
        entry = sweep.setdefault(base_arm(label), {"baseline": base_arm(r["baseline"]), "scales": {}})
        entry["scales"][f"{r['lr_scale']:g}"] = {"lr": r["lr"], "final_step": r["final_step"],
                                                  "final_val_loss": r["final_val_loss"],
                                                  "finished": r["final_step"] == steps}
    for entry in sweep.values():
        done = {scale: s["final_val_loss"] for scale, s in entry["scales"].items() if s["finished"]}
        entry["best_scale"] = min(done, key=done.get) if done else None
        entry["best_val_loss"] = done[entry["best_scale"]] if done else None
        swept = sorted(entry["scales"], key=float)
        entry["best_at_edge"] = len(swept) > 1 and entry["best_scale"] in (swept[0], swept[-1])
    for arm, entry in sweep.items():
        base = sweep.get(entry["baseline"], {}).get("best_val_loss")
        own = entry["best_val_loss"]
        entry["best_vs_baseline_best_pct"] = (None if arm == entry["baseline"] or base is None or own is None
                                              else 100.0 * (own - base) / base)
    return sweep


def _lr_sweep_lines(sweep: dict[str, Any]) -> list[str]:
    """The sweep's table: per arm, each scale's final loss (its lr), the best scale and its gap to the baseline's
    best; nothing without a sweep."""
    if not sweep:
        return []
    scales = list(dict.fromkeys(scale for entry in sweep.values() for scale in entry["scales"]))
    lines = ["", "Learning-rate sweep: final validation loss (lr) per multiple of the recipe's lr; best among the "
                 "arms that finished every step:", "",
             *_table_head(["arm", *(f"{scale}x" for scale in scales), "best", "best vs its baseline's best"])]
    for arm, entry in sweep.items():
        cells = [f"{common.fmt(s['final_val_loss'], '.4f')} ({s['lr']:.3g}){'' if s['finished'] else ' (partial)'}"
                 if (s := entry["scales"].get(scale)) else "" for scale in scales]
        best = ("n/a" if entry["best_scale"] is None else
                f"{entry['best_scale']}x{' (edge of the sweep)' if entry['best_at_edge'] else ''}")
        gap = "" if arm == entry["baseline"] else common.fmt(entry["best_vs_baseline_best_pct"], "+.2f", "%")
        lines.append(f"| {' | '.join([arm, *cells, best, gap])} |")
    return lines


def _ranks_text(plan: Plan, arms: dict[str, Any]) -> str:
    """Processes and micro-batches of the arms, and where their ranks ran."""
    by_n: dict[tuple[int, int], list[str]] = {}
    for arm, r in arms.items():
        by_n.setdefault((r["nproc"], r["micro_batch"]), []).append(arm)
    groups = "; ".join(f"{n} processes, micro-batch {m}: {', '.join(names)}" for (n, m), names in by_n.items())
    if plan.args.header_from:  # tables of another host's arms: where they ran is what their launches logged
        backends = {b: [arm for arm, r in arms.items() if r["backend"] == b] for b in (*SHARED_GPU_TRANSPORTS, "nccl")}
        mixed = [f"{arm} ({r['backend'].replace('nccl', 'NCCL')})" for arm, r in arms.items()
                 if r["backend"] not in backends]
        staged = f", over samedev {', '.join(backends['samedev'])}" if backends["samedev"] else ""
        return (f"{groups}; as the arms' launches logged it: over gloo {', '.join(backends['gloo']) or 'none'}"
                f"{staged}, over NCCL {', '.join(backends['nccl']) or 'none'}"
                + (f", resumed on the other: {', '.join(mixed)}" if mixed else ""))
    sharing = [arm for arm in arms if plan.shares_gpus(arm)]
    transport = shared_transports({arm: arms[arm] for arm in sharing}) or plan.args.shared_gpu_transport
    where = (f"ranks sharing {len(plan.gpus)} GPU(s); over {transport} (shared_gpu: the "
             "numerics of a GPU per rank): "
             f"{', '.join(sharing) or 'none'}; the others over NCCL, a GPU per rank; step times are not network "
             "measurements" if plan.shared else
             "a GPU per rank" if plan.gpus else "CPU processes (gloo)")
    return f"{groups}; {where}{_concurrency(plan)}"


def _concurrency(plan: Plan) -> str:
    """How many processes ran at once, where this command knows it: ``--status`` and ``--collect`` read arms that
    other commands ran, so without their ``--max-ranks`` the default would misstate it."""
    if plan.args.max_ranks is None and (plan.args.status or plan.args.collect):
        return ""
    return f", at most {plan.max_ranks} processes at once"


def _eval_weights_text(option: str, arms: dict[str, Any]) -> str:
    """What the val loss of the QSDP arms is: the weights their evaluations gathered, as the arms recorded it."""
    recorded = {arm: r.get("eval_weights") for arm, r in arms.items() if r.get("eval_weights") is not None}
    kinds = sorted({f"'{v}'" for v in recorded.values()})
    text = (f"QSDP arms' val loss with {'the exact weights' if option != 'quantized' else 'the quantized weights'} "
            f"(--eval-weights {option}")
    text += f"; the arms recorded: {', '.join(kinds)})" if kinds else ")"
    if option == "both":
        text += "; 'final val loss, quantized weights': the same evaluations with the weights quantized as in training"
    return text + ("; arms without a recorded qsdp/eval_weights and QSDP predate exact evaluation: their val loss is "
                   "of the quantized weights")


def _arm_columns(gap: str = "vs baseline") -> list[str]:
    """The titles of ``_arm_row``'s columns after its leading cells; ``gap`` titles the gap to the baseline."""
    return ["final step", "final val loss", "final val loss, quantized weights", gap, "compression vs unquantized",
            "compression vs plain FSDP2", "GB sent per rank", "rel. error w / g",
            "step time (ms, median; arms may share GPUs)", "description"]


def _table_head(columns: list[str]) -> list[str]:
    """A markdown table's title row and rule."""
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def _arm_row(label: str, r: dict[str, Any], *extra: str) -> str:
    """A table row of one arm's record: ``label``, the ``extra`` cells, then the columns of ``_arm_columns``."""
    fmt = common.fmt
    err = r["rel_error"]
    step = "n/a" if r["final_step"] is None else f"{r['final_step']}{'' if r['complete'] else ' (partial)'}"
    step_ms = None if r["step_time_s_median"] is None else r["step_time_s_median"] * 1e3
    return (f"| {' | '.join([label, *extra])} | {step} | {fmt(r['final_val_loss'], '.4f')} "
            f"| {fmt(r.get('final_val_loss_quantized'), '.4f')} "
            f"| {fmt(r['gap_vs_baseline_pct'], '+.2f', '%')} "
            f"| {fmt(r['compression_vs_unquantized'], '.2f', 'x')} "
            f"| {fmt(r.get('compression_vs_plain_fsdp'), '.2f', 'x')} "
            f"| {fmt(None if r.get('total_bytes_sent') is None else r['total_bytes_sent'] / 1e9, '.3f')} "
            f"| {fmt(err['weights'], '.3f')} / "
            f"{fmt(err['grads'], '.3f')} | {fmt(step_ms, '.0f')} | {r['description']} |")


def _w8g8_target(gaps_pct: dict[str, float]) -> list[str]:
    """The W8G8 target's lines: its gap to each baseline, by label ("" for its own run's only baseline)."""
    if not gaps_pct:
        return []
    verdicts = "; ".join(f"{f'vs {label}: ' if label else ''}{gap:+.2f}% "
                         f"({'met' if abs(gap) <= W8G8_TARGET_PCT else 'NOT met'}; W8G8 ended "
                         f"{'below' if gap < 0 else 'above'} the baseline)" for label, gap in gaps_pct.items())
    return ["", f"Target (measured, never asserted): W8G8 final validation loss within {W8G8_TARGET_PCT:.0f}% of "
                f"plain FSDP: {verdicts}"]


def _zero_one_target(arm: str, r: dict[str, Any] | None) -> list[str]:
    """The 0/1 Adam target's line of ``arm``: its final gap to DDP AdamW and its byte saving over the run."""
    if not r or r["gap_vs_baseline_pct"] is None:
        return []
    gap, ratio = r["gap_vs_baseline_pct"], r["compression_vs_unquantized"]
    loss = "met" if abs(gap) <= ZERO_ONE_TARGET_PCT else "NOT met"
    saved = "n/a" if ratio is None else f"{ratio:.1f}x ({'met' if ratio >= ZERO_ONE_BYTES_TARGET else 'NOT met'})"
    name = "0/1 Adam" if arm == "zero-one-adam" else f"0/1 Adam ({arm})"
    return ["", f"Target (measured, never asserted): {name} final validation loss within {ZERO_ONE_TARGET_PCT:.0f}% "
                f"of DDP AdamW: {gap:+.2f}% ({loss}); bytes sent per rank at least {ZERO_ONE_BYTES_TARGET:.0f}x fewer "
                f"than DDP's fp32 all-reduce: {saved}"]


def png_bytes(record: dict[str, Any]) -> bytes | None:
    """All arms' validation-loss curves (left) and their second half zoomed (right), as PNG; None without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no PNG; redraw it elsewhere with --replot <the .json record>")
        return None
    fig = _figure(record, plt)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _figure(record: dict[str, Any], plt: Any) -> Any:
    """The figure of :func:`png_bytes`. Each arm keeps one color in both panels: an arm that stopped before the
    zoomed half is missing there, and the color cycle would otherwise shift every later arm's color."""
    s = record["settings"]
    arms = list(record["arms"])
    palette = plt.get_cmap("tab10" if len(arms) <= 10 else "tab20").colors
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for ax, start in zip(axes, (0, s["steps"] // 2)):
        for i, (arm, r) in enumerate(record["arms"].items()):
            points = [(step, loss) for step, loss in r["curve"] if step >= start]
            if points:
                ax.plot(*zip(*points), marker=".", label=arm, color=palette[i % len(palette)])
        ax.set_xlabel(f"step ({s['global_batch']} x {s['seq_len']} tokens each)")
        ax.set_ylabel("validation loss (nats/token)")
        ax.grid(alpha=0.3)
    axes[0].set_title("validation loss")
    axes[1].set_title(f"from step {s['steps'] // 2}")
    axes[0].legend()
    tokens = s["steps"] * s["global_batch"] * s["seq_len"]
    fig.suptitle(f"{Path(s['recipe_dir']).name}: same seed, data order and hyperparameters; "
                 f"{tokens:,} tokens per arm ({record['header']['git']})")
    return fig


def _recorded(path: Path) -> dict[str, Any]:
    """The convergence record at ``path`` (``--header-from``); SystemExit naming it where it is not one."""
    try:
        record = common.read_json(path)
        if not isinstance(record, dict) or not isinstance(record.get("header"), dict):
            raise ValueError("no header")
    except (OSError, ValueError) as err:
        raise SystemExit(f"--header-from {path}: not a convergence record with a header ({err!r})") from None
    return record


def recorded_header(records: list[dict[str, Any]]) -> dict[str, str]:
    """The header of the hosts that ran the arms, from their ``convergence-*.json`` records (one per session, as
    :func:`_recorded` reads them): the first record's device and versions, every distinct date, git revision and
    command, and this command as ``tables``."""
    heads = [record["header"] for record in records]
    head = dict(heads[0])
    for key, sep in (("date", " + "), ("git", " + "), ("command", " ; ")):
        head[key] = sep.join(dict.fromkeys(h[key] for h in heads if key in h))
    head["tables"] = command_line()
    return head


def write_results(plan: Plan, manifest: dict[str, Any], status: str, quiet: bool = False) -> dict[str, Any]:
    """Summarize every arm's metrics files into ``convergence-<name>`` .csv/.json/.md/.png in the results
    directory (printing the table unless ``quiet``: the progress writes while arms run); returns the record."""
    recorded = [_recorded(Path(p)) for p in plan.args.header_from or []]
    if recorded:
        head = recorded_header(recorded)
    else:
        head = common.header(min(len(plan.gpus), plan.max_ranks) if plan.gpus else plan.max_ranks)
    arms = summarize(plan)
    if plan.shared and not plan.args.header_from:  # a recorded header says it already
        head["device"] += (f"; arms share the GPU(s){_concurrency(plan)}; arms with more processes than GPUs over "
                           f"{shared_transports(arms) or plan.args.shared_gpu_transport} (shared_gpu)")
    settings = {**plan.settings, "max_ranks": plan.max_ranks}
    ran = [r.get("settings", {}) for r in recorded]  # that host knew whether they shared its GPUs; this one may not
    if any("shared_gpu" in r for r in ran):
        settings["shared_gpu"] = any(r.get("shared_gpu") for r in ran)
    record = {"arm_names": ARM_NAMES, "header": head, "settings": settings, "status": status,
              "corpus": manifest, "arms": arms, "noise_band_pct": noise_band_pct(arms),
              "lr_sweep": lr_sweep(arms, plan.args.steps), "seed_groups": seed_groups(arms, plan.args.steps),
              "train_seed_groups_by_step": seed_groups_by_step(arms, plan.args.steps, "train_curve"),
              "train_trends": train_trends(arms, plan.args.steps)}
    md = markdown(plan, head, manifest, arms, status)
    _write_record(f"convergence-{plan.name}", plan.out_dir, record, csv_text(plan.tokens_per_step, arms), md)
    if not quiet:
        print(md)
    return record


def shared_transports(arms: dict[str, Any]) -> str | None:
    """The transports the arms' ranks shared GPUs over, as their launches logged them (``"gloo and samedev"``, in
    the order first seen); None where no launch logged one, as before launches logged their back end."""
    found = [b for r in arms.values() for b in (r.get("backend") or "").split(", then ") if b and b != "nccl"]
    return " and ".join(dict.fromkeys(found)) or None


def _write_record(stem: str, out_dir: Path, record: dict[str, Any], csv_body: str, md: str) -> list[Path]:
    """``stem`` .csv, .json, .md and (with matplotlib) .png into ``out_dir``; the paths written."""
    files: dict[str, str | bytes] = {".csv": csv_body, ".json": json.dumps(record, indent=1), ".md": md}
    png = png_bytes(record)
    if png is not None:
        files[".png"] = png
    return common.write_outputs(stem, out_dir, files)


#: A record's parts keyed by an arm's name or a seed group's (an arm's name without its seed), each entry naming
#: its baseline's where it has ``"baseline"``.
_BY_ARM = ("seed_groups", "seed_groups_by_step", "train_seed_groups_by_step", "train_trends", "lr_sweep")


def read_record(path: Path) -> dict[str, Any]:
    """The convergence record at ``path`` with its arms named as :data:`~convergence_arms.ARMS` names them: a record
    without ``arm_names`` (written before the arms were renamed) has every arm name it holds mapped by
    :func:`~convergence_arms.current_name`, so that a name means one arm in every record read."""
    record = common.read_json(path)
    if "arm_names" in record:
        return record

    def renamed(entry: Any) -> Any:
        """An arm's or a group's entry with the names it holds mapped: its own, its baseline's, and those its gaps
        to every baseline are keyed by."""
        if not isinstance(entry, dict):  # a group's rows by step
            return entry
        names = {key: current_name(entry[key]) for key in ("arm", "baseline") if isinstance(entry.get(key), str)}
        if "gap_vs_baselines_pct" in entry:
            names["gap_vs_baselines_pct"] = {current_name(b): gap for b, gap in entry["gap_vs_baselines_pct"].items()}
        return {**entry, **names}

    current = {"arm_names": ARM_NAMES, **record}
    for part in ("arms", *_BY_ARM):
        if part in record:  # records from before a part was added lack it
            current[part] = {current_name(name): renamed(entry) for name, entry in record[part].items()}
    return current


def combine_records(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One record from several runs of the same settings and corpus, e.g. an arm finished on a later machine, or
    a second baseline run that measures the run-to-run spread (GPU kernels are not bitwise deterministic).

    An arm found in two runs with the same loss at every evaluation both reached is one run: continued from its
    checkpoint on a later machine, or the same arm folders tabled twice. The one that got further is kept (the
    first given, where they got as far). Where the losses differ it is another run of the arm (started again; GPU
    kernels are not bitwise deterministic), and both are kept. An arm name then found in one run keeps its name;
    one found in several becomes ``<arm>@run<i>`` (1-based, in the order given), and :func:`seed_groups` counts
    each such run of a seed. Each arm keeps its gap to its own run's
    baseline (``gap_vs_baseline_pct``) and gains ``gap_vs_baselines_pct``: its gap to every run's baseline at its
    final step, by baseline label. A combined record given among them stands for the runs it holds, so a later
    run can join an earlier combination as it would have joined the runs' own records. Raises ``ValueError`` naming
    the first setting or corpus fingerprint that differs between runs."""
    if len(records) < 2:
        raise ValueError(f"combining needs at least 2 records, got {len(records)}")
    records = [run for record in records for run in _runs_of(record)]
    first = records[0]
    for i, record in enumerate(records[1:], start=2):
        # How many processes ran at once changes the step times, not an arm's numerics; nor does the transport:
        # ranks sharing GPUs over gloo compute what NCCL ranks do, up to the order of a reduction's sums.
        # The recipe folder is named as each machine's command gave it (absolute or relative): its name counts.
        # Which weights the QSDP arms evaluated is each arm's (checked below), not the record's: a baseline has none.
        # How often a run evaluated changes no training where every evaluation is of the exact weights (checked).
        # Where a machine built the corpus is its own: what was built is the corpus record's (checked below).
        differ = [k for k in common.differing_keys(first["settings"], record["settings"])
                  if k not in ("max_ranks", "shared_gpu", "eval_weights", "eval_interval", "corpus")
                  and not (k == "recipe_dir" and Path(first["settings"][k]).name == Path(record["settings"][k]).name)]
        if differ:
            key = differ[0]
            raise ValueError(f"run {i} differs from run 1 in setting {key!r}: "
                             f"{record['settings'].get(key)!r} != {first['settings'].get(key)!r}")
        if record["settings"].get("eval_interval") != first["settings"].get("eval_interval"):
            _check_evaluations_leave_training(i, record, first)
        if record["corpus"]["input"]["sha256"] != first["corpus"]["input"]["sha256"]:
            raise ValueError(f"run {i} used another corpus (input sha256 {record['corpus']['input']['sha256'][:16]}"
                             f" != {first['corpus']['input']['sha256'][:16]})")
        # How it was built, as far as both records say (older ones lack some fields); what it was built from is the
        # input's sha256 (above), and the build command and input roots are the machine's own paths.
        built = [k for k in ("kind", "seq_len", "val_fraction", "max_documents", "max_train_tokens")
                 if None not in (first["corpus"].get(k), record["corpus"].get(k))
                 and first["corpus"][k] != record["corpus"][k]]
        if built:
            raise ValueError(f"run {i} built its corpus otherwise: {built[0]!r} "
                             f"{record['corpus'].get(built[0])!r} != {first['corpus'].get(built[0])!r}")
    curves = [{arm: _losses(r) for arm, r in record["arms"].items()} for record in records]
    kept = [{arm: r for arm, r in record["arms"].items() if not _superseded(arm, i, curves)}
            for i, record in enumerate(records)]
    _check_evaluated_weights(kept)
    counts = collections.Counter(arm for record_arms in kept for arm in record_arms)
    arms: dict[str, Any] = {}
    for i, record_arms in enumerate(kept, start=1):
        for arm, r in record_arms.items():
            arms[arm if counts[arm] == 1 else run_arm_name(arm, i)] = {**r, "arm": arm, "run": i}
    baselines = {label: dict(r["curve"]) for label, r in arms.items() if r["arm"] in FSDP_BASELINES}
    for r in arms.values():
        gaps = {label: _gap_pct(r, curve) for label, curve in baselines.items()}
        r["gap_vs_baselines_pct"] = {label: gap for label, gap in gaps.items() if gap is not None}
    runs = [{**record["header"], "shared_gpu": record["settings"].get("shared_gpu"),
             "transport": shared_transports(record["arms"])} for record in records]
    return {"arm_names": ARM_NAMES, "header": {"git": " + ".join(dict.fromkeys(h["git"] for h in runs))},
            "runs": runs, "settings": first["settings"], "corpus": first["corpus"],
            "status": "complete" if all(r["status"] == "complete" for r in records) else "incomplete", "arms": arms,
            "seed_groups": seed_groups(arms, first["settings"]["steps"]),
            "seed_groups_by_step": seed_groups_by_step(arms, first["settings"]["steps"]),
            "train_seed_groups_by_step": seed_groups_by_step(arms, first["settings"]["steps"], "train_curve"),
            "train_trends": train_trends(arms, first["settings"]["steps"])}


def _runs_of(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs a record holds, each as the record its run wrote (as far as :func:`combine_records` reads one): the
    record itself, or a combined record's runs with the arms it kept of each."""
    if "runs" not in record:
        return [record]
    own = ("arm", "run", "gap_vs_baselines_pct")  # what combining added to each arm
    return [{"header": {k: v for k, v in header.items() if k not in ("shared_gpu", "transport")},
             "settings": {**record["settings"], "shared_gpu": header.get("shared_gpu")},
             "corpus": record["corpus"], "status": record["status"],
             "arms": {r["arm"]: {k: v for k, v in r.items() if k not in own}
                      for r in record["arms"].values() if r["run"] == i}}
            for i, header in enumerate(record["runs"], start=1)]


def _evaluated_weights(r: dict[str, Any]) -> str:
    """The weights whose loss an arm's curve ``r["curve"]`` holds (its ``val`` evaluator): ``"exact"``,
    ``"quantized"``, or ``"unrecorded"``: an arm that logged no ``qsdp/eval_weights``, i.e. one without QSDP (a
    baseline) or a QSDP run from before the setting existed (whose evaluations gathered the quantized weights)."""
    recorded = r.get("eval_weights")
    if recorded is None:
        return "unrecorded"
    text = str(recorded).replace(" ", "")
    if "=" not in text:
        return text
    modes = dict(item.split("=", 1) for item in text.split(","))  # by evaluator label: "val=exact,val_quantized=..."
    return modes.get(VAL_LOSS.split("/")[1], "exact")


def _check_evaluated_weights(runs: list[dict[str, Any]]) -> None:
    """Raise ``ValueError`` where an arm's runs (any seed) evaluated different weights, so that no seed table pools
    losses of the quantized weights with those of the exact ones. ``runs``: each record's arms by name."""
    seen: dict[str, tuple[str, int]] = {}
    for i, arms in enumerate(runs, start=1):
        for name, r in arms.items():
            if not r["curve"]:  # not started: no loss to pool
                continue
            weights = _evaluated_weights(r)
            first_weights, first_run = seen.setdefault(seedless_name(name), (weights, i))
            if weights != first_weights:
                raise ValueError(f"{seedless_name(name)} evaluated the {weights} weights in run {i} ({name}) but the "
                                 f"{first_weights} ones in run {first_run}: one arm's runs must evaluate the same "
                                 f"weights (convergence.py --eval-weights; runs without a recorded setting "
                                 f"evaluated the quantized weights)")


def _check_evaluations_leave_training(i: int, record: dict[str, Any], first: dict[str, Any]) -> None:
    """Raise ``ValueError`` unless every arm of runs ``i`` and 1, which evaluated at different intervals, evaluated
    the exact weights or has no QSDP. Exact evaluations leave training bit for bit as without them
    (tests/fsdp2/test_eval_weights.py; through the trainer, tests/test_train.py), and so do quantized ones where the
    seed schedule gives a gather outside the model's forward the next training forward's key. Where it did not, a
    weight-difference scheme that rounds stochastically sent the step's update in the evaluation's gathers with
    another key than training's next forward, and training after it differed. A record does not say which seed
    schedule its runs had, so every quantized evaluation refuses."""
    for n, run in ((i, record), (1, first)):
        for name, r in run["arms"].items():
            weights = _evaluated_weights(r)
            if weights == "quantized" or (weights == "unrecorded" and r.get("compression_vs_unquantized") is not None):
                raise ValueError(
                    f"run {i} differs from run 1 in setting 'eval_interval': {record['settings'].get('eval_interval')!r}"
                    f" != {first['settings'].get('eval_interval')!r}, and run {n}'s {name} evaluated the quantized "
                    "weights, which could change its training after each evaluation (a stochastically rounded weight "
                    "difference sent with another key than training's, in runs whose seed schedule gave evaluations "
                    "their own keys); runs of other evaluation intervals combine only where every arm evaluated the "
                    "exact weights")


def _losses(r: dict[str, Any]) -> dict[tuple[str, int], float]:
    """An arm's validation losses and windowed training losses, by ``(kind, step)``."""
    return {**{("val", step): loss for step, loss in r["curve"]},
            **{("train", step): loss for step, loss in r.get("train_curve") or []}}


def _superseded(arm: str, i: int, curves: list[dict[str, dict[tuple[str, int], float]]]) -> bool:
    """Whether run ``i``'s ``arm`` is one run with another run's that got further (or as far, given earlier): the
    same loss at every evaluation and training window both recorded (two runs of other evaluation intervals share
    no evaluation, but their training windows tell them apart). ``curves``: each run's :func:`_losses` by arm."""
    mine = curves[i][arm]
    for j, run in enumerate(curves):
        other = run.get(arm)
        if j == i or other is None or any(other[key] != loss for key, loss in mine.items() if key in other):
            continue
        if (max((step for _, step in other), default=0), -j) > (max((step for _, step in mine), default=0), -i):
            return True
    return False


def combined_markdown(record: dict[str, Any]) -> str:
    """The summary table of a combined record: the runs, each arm with its run and its gap to every baseline."""
    s = record["settings"]
    labels = [label for label, r in record["arms"].items() if r["arm"] in FSDP_BASELINES]
    lines = [f"### convergence: {Path(s['recipe_dir']).name}, {len(record['runs'])} runs combined", ""]

    def transport(run: dict[str, Any]) -> str:
        # Runs from before launches logged their back end shared GPUs over gloo, the only transport then.
        shared = run.get("shared_gpu")
        return "" if shared is None else f", ranks sharing GPUs over {run.get('transport') or 'gloo'}" if shared \
            else ", NCCL, a GPU per rank"

    lines += [f"- run {i}: {h['date']}, git `{h['git']}`, {h['device']}{transport(h)}: `{h['command']}`"
              for i, h in enumerate(record["runs"], start=1)]
    lines += [f"- settings: {s['steps']} steps x {s['global_batch']} samples x {s['seq_len']} tokens per arm, the "
              f"same seed and data order in every run; corpus input sha256 "
              f"`{record['corpus']['input']['sha256'][:16]}`", f"- status: {record['status']}", "",
              *_table_head(["arm", "run", *(f"vs {label}" for label in labels),
                            *_arm_columns("vs its run's baseline")])]
    for label, r in record["arms"].items():
        gaps = [common.fmt(r["gap_vs_baselines_pct"].get(b), "+.2f", "%") for b in labels]
        lines.append(_arm_row(label, r, str(r["run"]), *gaps))
    finals = [record["arms"][b]["final_val_loss"] for b in labels]
    if len(labels) > 1 and None not in finals:
        lines += ["", f"Baseline run-to-run spread: {100.0 * (max(finals) - min(finals)) / min(finals):.2f}% "
                      f"between the final losses of {', '.join(labels)}."]
    lines += _w8g8_target(record["arms"].get("w8g8", {}).get("gap_vs_baselines_pct", {}))
    lines += _seed_lines(record.get("seed_groups", {}))
    lines += _seed_step_lines(record.get("seed_groups_by_step", {}))
    lines += _train_step_lines(record.get("train_seed_groups_by_step", {}), record.get("train_trends", {}))
    return "\n".join(lines) + "\n"


def write_combined(paths: list[Path], out_dir: Path | None) -> dict[str, Any]:
    """Combine the ``convergence-*.json`` records at ``paths`` and write ``<first stem>-combined`` .csv, .json,
    .md and .png (when matplotlib is there) into ``out_dir`` (default: the first record's directory). A first record
    that is itself combined keeps its stem, so by default the new combination, which holds its runs, replaces it."""
    record = combine_records([read_record(path) for path in paths])
    s = record["settings"]
    md = combined_markdown(record)
    stem = paths[0].stem.removesuffix("-combined")
    written = _write_record(f"{stem}-combined", out_dir or paths[0].parent, record,
                            csv_text(s["global_batch"] * s["seq_len"], record["arms"]), md)
    print(md + "\n".join(f"wrote {path}" for path in written))
    return record
