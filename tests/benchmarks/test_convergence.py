"""``benchmarks/convergence.py`` and its modules (arms, corpus, plan, runner, report): merging a resumed arm's
metrics, the summary (final losses, gaps), CSV, markdown and PNG against hand-computed values, the corpus manifest
and checks, the planned launches of every arm, and (slow) the whole driver on 2 CPU processes: killed mid-run,
resumed from the checkpoint, finished arms skipped."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

import convergence
import convergence_arms
import convergence_corpus
import convergence_plan
import convergence_report
import convergence_runner
import e2e_common

ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_segment(path: Path, val: dict[int, float], **series: dict[int, float]) -> None:
    metrics = {convergence_runner.VAL_LOSS: [[b, v] for b, v in val.items()]}
    metrics |= {name.replace("__", "/"): [[b, v] for b, v in s.items()] for name, s in series.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"metrics": metrics, "communication": {}, "memory": None}))


def write_checkpoint(arm_dir: Path, batch: int, complete: bool = True) -> None:
    """A checkpoint folder of ``batch`` under ``arm_dir``; ``latest-rank0.pt`` names it once its save completed."""
    folder = arm_dir / "checkpoints"
    (folder / f"ep0-ba{batch}").mkdir(parents=True)
    if complete:
        (folder / "latest-rank0.pt").symlink_to(f"ep0-ba{batch}")


def write_corpus_manifest(corpus: Path) -> None:
    """The smallest manifest ``report_progress`` reads to rewrite the results."""
    corpus.mkdir()
    (corpus / "manifest.json").write_text(json.dumps(
        {"command": "c", "tokens": {"train": 1, "val": 1}, "input": {"files": 1, "bytes": 1, "sha256": "ab"}}))


def plan_for(tiny_recipes, tmp_path, *extra):
    args = convergence._parser().parse_args(
        ["--recipe-dir", str(tiny_recipes), "--steps", "20", "--seq-len", "32", "--global-batch", "8",
         "--out-dir", str(tmp_path / "out"), "--corpus", str(tmp_path / "corpus"), *extra])
    return convergence_plan.make_plan(args)


def family_plan(tmp_path, model, *arms):
    """The plan of ``arms`` on the GPU recipes of ``--model model`` (their recipes loaded; nothing built or run)."""
    args = convergence._parser().parse_args(["--model", model, "--out-dir", str(tmp_path), "--corpus",
                                             str(tmp_path / "c"), "--eval-batches", "-1", "--arms", *arms])
    return convergence_plan.make_plan(args)


def arm_qsdp_config(plan, arm):
    """The ``QSDPConfig`` that ``arm``'s launch builds, on the arm's number of ranks."""
    from composer_qsdp.recipes.loader import build_algorithm
    from composer_qsdp.recipes.train import load_recipe

    recipe = load_recipe(plan.recipe_dir / plan.arms[arm].recipe, plan.overrides(arm, 0), world_size=plan.nproc(arm))
    return build_algorithm("qsdp", recipe.algorithm_kwargs["qsdp"]).config


def test_merged_metrics_later_launch_wins(tmp_path):
    write_segment(tmp_path / "metrics-00.json", {5: 3.0, 10: 2.5, 15: 2.4})  # killed after step 15
    write_segment(tmp_path / "metrics-01.json", {15: 2.3, 20: 2.0})  # resumed from the checkpoint at step 10
    merged = convergence_runner.merged_metrics(tmp_path)[convergence_runner.VAL_LOSS]
    assert merged == {5: 3.0, 10: 2.5, 15: 2.3, 20: 2.0}


def test_train_windows_average_whole_windows_of_logged_batches():
    """Window ``k`` averages the batches Composer logged as ``(k - 1) * W .. k * W - 1``; a window with a batch
    missing (a launch that stopped mid-window and was not resumed) has no mean."""
    losses = {b: float(b) for b in range(250)}
    assert convergence_report.train_windows(losses, 100) == [[100, 49.5], [200, 149.5]]
    del losses[120]
    assert convergence_report.train_windows(losses, 100) == [[100, 49.5]]
    assert convergence_report.train_windows({}, 100) == []


def test_summary_records_the_windowed_training_loss(tiny_recipes, tmp_path):
    plan = plan_for(tiny_recipes, tmp_path, "--arms", "baseline")
    losses = {b: 6.0 - 0.01 * b for b in range(2 * convergence_report.TRAIN_WINDOW)}
    write_segment(plan.out_dir / "baseline" / "metrics-00.json", {10: 5.0}, loss__train__total=losses)
    curve = convergence_report.summarize(plan)["baseline"]["train_curve"]
    w = convergence_report.TRAIN_WINDOW
    assert [step for step, _ in curve] == [w, 2 * w]
    assert [mean for _, mean in curve] == pytest.approx([statistics.fmean(6.0 - 0.01 * b for b in range(w)),
                                                         statistics.fmean(6.0 - 0.01 * b for b in range(w, 2 * w))])


def test_summary_csv_markdown_png(tiny_recipes, tmp_path):
    plan = plan_for(tiny_recipes, tmp_path, "--arms", "baseline", "w8g8", "w4g4")
    out = plan.out_dir
    write_segment(out / "baseline" / "metrics-00.json", {10: 5.0, 20: 4.0},
                  time__train={1: 1 / 3600, 2: 3 / 3600, 3: 4 / 3600})
    write_segment(out / "w8g8" / "metrics-00.json", {10: 5.1, 20: 4.05},
                  qsdp__compression_vs_unquantized={1: 3.9, 2: 4.0}, qsdp__compression_vs_plain_fsdp={1: 5.0, 2: 6.0},
                  qsdp__weights__bytes_sent={1: 60, 2: 0},
                  qsdp__grads__bytes_sent={1: 40, 2: 300}, qsdp__weights__rel_error={1: 0.01},
                  qsdp__grads__rel_error={1: 0.02, 2: 0.04})
    write_segment(out / "w4g4" / "metrics-00.json", {10: 5.5})  # still running
    for arm in ("baseline", "w8g8"):
        (out / arm / "done.json").write_text("{}")
    arms = convergence_report.summarize(plan)
    assert arms["w8g8"]["gap_vs_baseline_pct"] == pytest.approx(1.25)
    assert arms["w4g4"]["gap_vs_baseline_pct"] == pytest.approx(10.0)  # at its last step, 10
    assert (arms["w4g4"]["final_step"], arms["w4g4"]["complete"]) == (10, False)
    # Unquantized bytes 3.9 * 100 + 4.0 * 300 over 400 sent: a ratio of sums, not the mean of the ratios.
    assert arms["w8g8"]["compression_vs_unquantized"] == pytest.approx((3.9 * 100 + 4.0 * 300) / 400)
    assert arms["w8g8"]["compression_vs_plain_fsdp"] == pytest.approx((5.0 * 100 + 6.0 * 300) / 400)
    assert arms["w4g4"]["compression_vs_plain_fsdp"] is None  # not logged
    assert arms["w8g8"]["rel_error"] == pytest.approx({"weights": 0.01, "grads": 0.03})
    assert arms["baseline"]["step_time_s_median"] == pytest.approx(1.5)  # median of 2 s and 1 s

    rows = list(csv.reader(io.StringIO(convergence_report.csv_text(plan.tokens_per_step, arms))))
    assert rows == [["step", "tokens", "baseline", "w8g8", "w4g4"],
                    ["10", str(10 * 8 * 32), "5.000000", "5.100000", "5.500000"],
                    ["20", str(20 * 8 * 32), "4.000000", "4.050000", ""]]

    manifest = {"command": "python -m composer_qsdp.recipes.data.build pysource X", "tokens": {"train": 1000, "val": 100},
                "input": {"files": 3, "bytes": 4000, "sha256": "ab" * 32}}
    record = convergence_report.write_results(plan, manifest, "incomplete")
    stem = f"convergence-{plan.name}"
    md = (out / f"{stem}.md").read_text()
    assert "| w4g4 | 2 | 10 (partial) | 5.5000 | n/a | +10.00% | n/a | n/a |" in md
    plain_column = _cells(md, "| arm ").index("compression vs plain FSDP2")
    assert _cells(md, "| w8g8 ")[plain_column] == "5.75x"
    assert "within 1% of plain FSDP: +1.25% (NOT met; W8G8 ended above the baseline)" in md
    assert (out / f"{stem}.png").read_bytes().startswith(PNG_MAGIC)
    assert json.loads((out / f"{stem}.json").read_text())["arms"]["w8g8"]["final_val_loss"] == 4.05
    assert record["arms"]["w8g8"]["micro_batch"] == 4 and record["arms"]["w8g8"]["nproc"] == 2

    (out / f"{stem}.png").unlink()
    assert convergence.main(["--replot", str(out / f"{stem}.json")]) == 0
    assert (out / f"{stem}.png").read_bytes().startswith(PNG_MAGIC)


def test_an_arm_that_sends_updates_ahead_reports_its_hit_rate(tiny_recipes, tmp_path):
    plan = plan_for(tiny_recipes, tmp_path, "--arms", "baseline", "qwd-w3g3-loco-ahead")
    out = plan.out_dir
    write_segment(out / "baseline" / "metrics-00.json", {10: 5.0, 20: 4.0})
    write_segment(out / "qwd-w3g3-loco-ahead" / "metrics-00.json", {10: 5.1, 20: 4.05},
                  qsdp__speculation__sent={1: 0, 20: 40}, qsdp__speculation__hits={1: 0, 20: 30},
                  qsdp__speculation__misses={1: 0, 20: 10}, qsdp__speculation__paused={1: 0, 20: 3})
    arms = convergence_report.summarize(plan)
    assert arms["baseline"]["speculation"] is None
    assert arms["qwd-w3g3-loco-ahead"]["speculation"] == {"sent": 40, "hits": 30, "misses": 10, "paused": 3}
    manifest = {"command": "python -m composer_qsdp.recipes.data.build pysource X", "tokens": {"train": 1000, "val": 100},
                "input": {"files": 3, "bytes": 4000, "sha256": "ab" * 32}}
    md = (out / f"convergence-{plan.name}.md")
    convergence_report.write_results(plan, manifest, "incomplete", quiet=True)
    assert ("- qwd-w3g3-loco-ahead: 30 of 40 unit updates sent ahead hit (75.0%), 10 missed; 3 steps sent none "
            "after a step with a miss") in md.read_text()


def test_quantized_weight_losses_get_their_column_csv_series_and_record(tiny_recipes, tmp_path):
    """``--eval-weights both``: the arm's second evaluator (val_quantized) in the table, the CSV and the record; the
    settings line says which weights the val loss is of. An arm folder written before the option (no quantized
    series, no recorded eval_weights) still reports."""
    plan = plan_for(tiny_recipes, tmp_path, "--arms", "baseline", "w8g8", "w4g4", "--eval-weights", "both")
    out = plan.out_dir
    write_segment(out / "baseline" / "metrics-00.json", {10: 5.0, 20: 4.0})
    both = "val=exact, val_quantized=quantized"
    (out / "w8g8").mkdir(parents=True)
    (out / "w8g8" / "metrics-00.json").write_text(json.dumps({
        "metrics": {convergence_runner.VAL_LOSS: [[10, 5.1], [20, 4.05]],
                    convergence_runner.VAL_QUANTIZED_LOSS: [[10, 5.2], [20, 4.09]]},
        "hyperparameters": {"qsdp/eval_weights": both}, "communication": {}, "memory": None}))
    write_segment(out / "w4g4" / "metrics-00.json", {10: 5.5, 20: 4.5})  # an old folder: neither
    arms = convergence_report.summarize(plan)
    assert arms["w8g8"]["final_val_loss_quantized"] == 4.09 and arms["w8g8"]["eval_weights"] == both
    assert arms["w8g8"]["quantized_curve"] == [[10, 5.2], [20, 4.09]]
    assert arms["w4g4"]["final_val_loss_quantized"] is None and arms["w4g4"]["eval_weights"] is None
    assert arms["w8g8"]["gap_vs_baseline_pct"] == pytest.approx(1.25)  # the exact loss against the baseline's

    rows = list(csv.reader(io.StringIO(convergence_report.csv_text(plan.tokens_per_step, arms))))
    assert rows[0] == ["step", "tokens", "baseline", "w8g8", "w4g4", "w8g8 (quantized weights)"]
    assert rows[2][-1] == "4.090000"

    manifest = {"command": "python -m composer_qsdp.recipes.data.build pysource X", "tokens": {"train": 1000, "val": 100},
                "input": {"files": 3, "bytes": 4000, "sha256": "ab" * 32}}
    record = convergence_report.write_results(plan, manifest, "incomplete", quiet=True)
    md = (out / f"convergence-{plan.name}.md").read_text()
    column = _cells(md, "| arm ").index("final val loss, quantized weights")
    assert _cells(md, "| w8g8 ")[column] == "4.0900" and _cells(md, "| w4g4 ")[column] == "n/a"
    assert ("- evaluation: QSDP arms' val loss with the exact weights (--eval-weights both; the arms recorded: "
            "'val=exact, val_quantized=quantized')" in md)
    assert record["settings"]["eval_weights"] == "both"
    assert record["arms"]["w8g8"]["final_val_loss_quantized"] == 4.09


def test_eval_weights_option_overrides_the_qsdp_arms_only(tiny_recipes, tmp_path):
    plan = plan_for(tiny_recipes, tmp_path, "--arms", "baseline", "w8g8", "--eval-weights", "quantized")
    assert "algorithms.qsdp.eval_weights=quantized" in plan.overrides("w8g8", 0)
    assert not any(o.startswith("algorithms.qsdp.eval_weights") for o in plan.overrides("baseline", 0))
    assert "eval_weights" not in plan.settings  # quantized: what directories written before the option hold
    exact = plan_for(tiny_recipes, tmp_path / "exact", "--arms", "w8g8")
    assert not any(o.startswith("algorithms.qsdp.eval_weights") for o in exact.overrides("w8g8", 0))
    assert exact.settings["eval_weights"] == "exact"


def test_every_arm_plans_valid_launches_for_the_125m_family(tmp_path):
    plan = family_plan(tmp_path, "125m", *convergence_arms.ARMS)  # loads every arm's recipe with its overrides
    assert plan.micro("baseline") == 16 and plan.tokens_per_step == 32 * 512
    assert (plan.nproc("sdp4bit-2x2"), plan.micro("sdp4bit-2x2")) == (4, 8)
    assert "algorithms.qsdp.ranks_per_node=2" in plan.overrides("zeropp-2x2", 0)
    hadamard = plan.overrides("w4g4-hadamard", 3)
    assert "algorithms.qsdp.grad_codec_options.hadamard=true" in hadamard
    assert f"metrics_file={tmp_path / 'w4g4-hadamard' / 'metrics-03.json'}" in hadamard
    assert f"data.local={tmp_path / 'c'}" in hadamard
    for needed in ("autoresume=true", "max_duration=2000ba", "model.max_seq_len=512", "global_train_batch_size=32"):
        assert needed in hadamard
    assert "algorithms.zero_one_adam.local_step_clipper=1" in plan.overrides("zero-one-adam-1bit", 0)
    assert convergence._parser().parse_args([]).arms == list(convergence_arms.DEFAULT_ARMS)  # DDP arms when named


@pytest.mark.parametrize("preset,weight_scheme,weight_bits,grad_bits",
                         [("qwd-w3g3-loco", "difference", 3, 3), ("w8g4", None, 8, 4)])
def test_lean_arm_runs_the_memory_benchmarks_lean_layout_on_two_nodes(tmp_path, preset, weight_scheme, weight_bits,
                                                                       grad_bits):
    """``<preset>-lean-2x2`` trains the layout ``bench_memory.py``'s ``-lean`` configurations measure, on 4 ranks as 2
    nodes of 2 so that both gradient hops (and a qWD preset's sharded reference) are taken."""
    import bench_memory

    name = f"{preset}-lean-2x2"
    arm = convergence_arms.ARMS[name]
    lean = bench_memory.CONFIGS[f"qsdp-{preset}-lean"].overrides
    assert set(lean) - set(bench_memory.CONFIGS[f"qsdp-{preset}"].overrides) <= set(arm.overrides)
    plan = family_plan(tmp_path, "125m", name)
    assert (plan.nproc(name), plan.micro(name)) == (4, 8)
    config = arm_qsdp_config(plan, name)
    assert (config.grads.scheme, config.ranks_per_node, config.weights.scheme, config.weights.bits,
            config.grads.bits) == ("two_level_loco", 2, weight_scheme, weight_bits, grad_bits)
    # the intra-node hop, without feedback: 8-bit stochastic codes, not the preset's low-bit ones
    assert config.grads.scheme_options.intra_codec == {"name": "minmax", "bits": 8, "bucket_size": 1024,
                                                       "rounding": "stochastic"}
    if weight_scheme == "difference":
        assert config.weights.scheme_options.sharded_reference
    else:
        assert config.weights.scheme_options == {}


def test_w8g4_candidates_change_only_the_gradients_within_a_tenth_of_its_bytes(tmp_path):
    """Issue 50's candidates for a lossless W8G4 (``w8g4-paper-h128``, and the LoCo gradients that became ``w8g4``)
    keep ``w8g4-paper``'s 8-bit weights and 4-bit gradients, and send at most 10% more bytes per step than it does
    (weights once, gradients twice: the protocol's 2 microbatches per rank)."""
    import wire_bytes

    from composer_qsdp.schemes.build import build_codec

    names = ("w8g4-paper", "w8g4-paper-h128", "w8g4")
    plan = family_plan(tmp_path, "350m", *names)
    assert {plan.nproc(name) for name in names} == {2}
    configs = {name: arm_qsdp_config(plan, name) for name in names}
    n = 1 << 20
    paper = configs["w8g4-paper"]
    weight, grad = build_codec(paper.weights, 8).wire_bytes(n), build_codec(paper.grads, 4).wire_bytes(n)
    for name in names[1:]:
        config = configs[name]
        assert config.weights == paper.weights and config.grads.bits == 4
        assert config.grads.codec_options.hadamard
        candidate = build_codec(config.grads, 4).wire_bytes(n)
        assert candidate == wire_bytes.hadamard_minmax_bytes(n, 4, config.grads.bucket_size)
        assert 1 < (weight + 2 * candidate) / (weight + 2 * grad) < 1.1
    h128, loco = configs["w8g4-paper-h128"].grads, configs["w8g4"].grads
    assert (h128.scheme, h128.bucket_size, h128.rounding) == (paper.grads.scheme, 128, paper.grads.rounding)
    assert (loco.scheme, loco.bucket_size, loco.rounding) == ("loco", 256, "nearest")
    assert (loco.scheme_options.beta, loco.scheme_options.residual_dtype) == (0.5, "int8")


def test_hadamard_weight_arm_changes_only_the_rotation_and_the_alignment(tmp_path):
    """``w8-hadamard-only`` is ``w8-only`` with the rotation and parameter-aligned buckets (without them a LayerNorm's
    gains rotate into a spike that sets its neighbours' step), and gradients left unquantized."""
    import dataclasses as dc

    from composer_qsdp.config import CodecOptions

    plan = family_plan(tmp_path, "125m", "w8-only", "w8-hadamard-only")
    plain, rotated = (arm_qsdp_config(plan, name) for name in ("w8-only", "w8-hadamard-only"))
    assert rotated.weights.codec_options.hadamard and not plain.weights.codec_options.hadamard
    assert (plain.weights.scheme_options, rotated.weights.scheme_options) == ({}, {"align_buckets": True})
    assert dc.replace(rotated.weights, codec_options=CodecOptions(), scheme_options={}) == plain.weights
    assert rotated.grads.bits is None and plain.grads.bits is None


def test_renamed_arms_run_what_their_old_names_ran(tmp_path):
    """``w8g4`` builds what the arm ``w8g4-loco`` built (the overrides its records name, over the ``qsdp-w8g4.yaml``
    of then: ``qsdp-w8g8.yaml`` with 4-bit gradients), ``w8g4-paper`` what ``w8g4`` built; ``g4-only`` and
    ``w8g4-nearest`` keep the paper's gradients."""
    q = "algorithms.qsdp."
    recorded = (f"{q}grad_codec_options.hadamard=true", f"{q}grad_scheme_options.beta=0.5",
                f"{q}grad_scheme_options.residual_dtype=int8", f"{q}grad_scheme=loco", f"{q}grad_rounding=nearest",
                f"{q}grad_bucket_size=256", f"{q}grad_bits=4")
    names = ("w8g4", "w8g4-paper", "g4-only", "w8g4-nearest", "w8g8")
    plan = family_plan(tmp_path, "350m", *names)
    plan.arms["old-w8g4-loco"] = convergence_arms.Arm("qsdp-w8g8.yaml", (f"{q}grad_bits=4", *recorded), "w8g4-loco")
    configs = {name: arm_qsdp_config(plan, name) for name in (*names, "old-w8g4-loco")}
    new, old = configs["w8g4"], configs["old-w8g4-loco"]
    assert (new.weights, new.grads) == (old.weights, old.grads)
    paper = configs["w8g4-paper"]
    assert (paper.weights, paper.grads.bits) == (configs["w8g8"].weights, 4)
    assert dataclasses.replace(paper.grads, bits=8) == configs["w8g8"].grads  # the paper's w8g4: w8g8 at 4 bits
    assert configs["g4-only"].grads == configs["w8g4-nearest"].grads == paper.grads
    assert configs["g4-only"].weights.bits is None
    assert configs["w8g4-nearest"].weights.rounding == "nearest"
    assert not {"w8g4-loco", "w8g4-h128"} & set(convergence_arms.ARMS)


@pytest.mark.parametrize("bits,weights,grads", [("3bit", "qwd3", "g3loco"), ("4bit", "qwd4", "g4")])
def test_policy_auto_arms_name_the_opt_in_candidates_as_bench_e2e_does(tmp_path, bits, weights, grads):
    import bench_e2e_configs

    name = f"policy-auto-{bits}"
    arm = convergence_arms.ARMS[name]
    assert set(arm.overrides) <= set(bench_e2e_configs.CONFIGS[f"qsdp-auto-{bits}"].overrides)
    assert name not in convergence_arms.DEFAULT_ARMS + convergence_arms.MATRIX_ARMS
    options = arm_qsdp_config(family_plan(tmp_path, "125m", name), name).auto_options
    assert (options.weight_candidates, options.grad_candidates) == (("off", "w8", weights), ("off", "g8", grads))


def test_shared_gpus_put_every_arm_on_them_over_gloo(tiny_recipes, tmp_path, monkeypatch):
    monkeypatch.setattr(convergence_plan, "_visible_gpus", lambda: ["0"])
    gpu = ["-o", "device=gpu", "-o", "precision=amp_bf16"]  # shared_gpu=true is for GPU recipes
    with pytest.raises(SystemExit, match=r"arms of 2 and 4 processes evaluate --eval-batches 8 .*--eval-batches -1"):
        plan_for(tiny_recipes, tmp_path, "--matrix", *gpu)
    plan = plan_for(tiny_recipes, tmp_path, "--matrix", "--micro-batch", "2", "--eval-batches", "-1", *gpu)
    assert plan.shared and plan.max_ranks == 4  # default: the widest arm alone
    assert plan.args.arms == list(convergence_arms.MATRIX_ARMS)
    for arm in plan.args.arms:
        assert "shared_gpu=true" in plan.overrides(arm, 0)
        assert plan.nproc(arm) == (4 if arm.endswith("-2x2") else 2)
    assert "seed=18" in plan.overrides("baseline-seed2", 0)
    with pytest.raises(SystemExit, match=r"--max-ranks 3 is invalid; it must be >= 4"):
        plan_for(tiny_recipes, tmp_path, "--matrix", "--max-ranks", "3", "--eval-batches", "-1", *gpu)
    with pytest.raises(SystemExit, match=r"--shared-gpu false: an arm of 4 processes needs 4 GPUs, 1 visible"):
        plan_for(tiny_recipes, tmp_path, "--matrix", "--shared-gpu", "false", "--eval-batches", "-1", *gpu)


def test_arms_with_a_gpu_per_rank_keep_nccl_beside_shared_ones(tiny_recipes, tmp_path, monkeypatch):
    monkeypatch.setattr(convergence_plan, "_visible_gpus", lambda: ["0", "1"])
    gpu = ["-o", "device=gpu", "-o", "precision=amp_bf16"]
    plan = plan_for(tiny_recipes, tmp_path, "--matrix", "--micro-batch", "2", "--eval-batches", "-1",
                    "--max-ranks", "8", *gpu)
    assert plan.shared and plan.max_ranks == 8
    for arm in plan.args.arms:
        four = arm.endswith("-2x2")
        assert f"shared_gpu={str(four).lower()}" in plan.overrides(arm, 0)
        assert plan.backend(arm) == ("gloo" if four else "nccl")
    forced = plan_for(tiny_recipes, tmp_path, "--matrix", "--micro-batch", "2", "--eval-batches", "-1",
                      "--shared-gpu", "true", *gpu)
    assert all("shared_gpu=true" in forced.overrides(arm, 0) for arm in forced.args.arms)
    assert all("shared_gpu_transport=gloo" in forced.overrides(arm, 0) for arm in forced.args.arms)
    # The staging-buffer transport goes to the arms that share GPUs only, and not into the settings that decide
    # which records can be combined: it computes what gloo computes.
    staged = plan_for(tiny_recipes, tmp_path, "--matrix", "--micro-batch", "2", "--eval-batches", "-1",
                      "--max-ranks", "8", "--shared-gpu-transport", "samedev", *gpu)
    for arm in staged.args.arms:
        four = arm.endswith("-2x2")
        assert ("shared_gpu_transport=samedev" in staged.overrides(arm, 0)) == four
        assert staged.backend(arm) == ("samedev" if four else "nccl")
    assert staged.settings == plan.settings
    md = convergence_report.markdown(staged, {"device": "gpu", "git": "x"}, {"command": "c", "tokens": {
        "train": 1, "val": 1}, "input": {"files": 1, "bytes": 1, "sha256": "ab"}}, {}, "incomplete")
    assert "ranks sharing 2 GPU(s); over samedev (shared_gpu: the numerics of a GPU per rank)" in md


def test_a_shared_runs_header_and_settings_name_the_transports_its_arms_logged(tiny_recipes, tmp_path, monkeypatch):
    # --collect on the host that ran the arms, without the running commands' --shared-gpu-transport: the header
    # takes the transport from what the launches logged (one arm resumed over samedev), not the default.
    monkeypatch.setattr(convergence_plan, "_visible_gpus", lambda: ["0"])
    plan = plan_for(tiny_recipes, tmp_path, "--arms", "w8g8", "w8g4", "--micro-batch", "2", "--eval-batches", "-1",
                    "-o", "device=gpu", "-o", "precision=amp_bf16", "--collect", str(tmp_path / "c"))
    for arm, backends in (("w8g8", ("gloo", "samedev")), ("w8g4", ("samedev",))):
        for i, backend in enumerate(backends):
            segment = plan.out_dir / arm / f"metrics-0{i}.json"
            write_segment(segment, {10 * (i + 1): 5.0 - i})
            segment.write_text(json.dumps(json.loads(segment.read_text()) | {"hyperparameters": {
                "dist_backend": backend}}))
    manifest = {"command": "c", "tokens": {"train": 1, "val": 1}, "input": {"files": 1, "bytes": 1, "sha256": "ab"}}
    record = convergence_report.write_results(plan, manifest, "incomplete", quiet=True)
    assert record["header"]["device"].endswith("arms with more processes than GPUs over gloo and samedev (shared_gpu)")
    md = (plan.out_dir / f"convergence-{plan.name}.md").read_text()
    assert "ranks sharing 1 GPU(s); over gloo and samedev (shared_gpu: the numerics of a GPU per rank)" in md


def test_a_gpu_per_rank_changes_nothing(tiny_recipes, tmp_path, monkeypatch):
    monkeypatch.setattr(convergence_plan, "_visible_gpus", lambda: [str(i) for i in range(8)])
    plan = plan_for(tiny_recipes, tmp_path, "--matrix", "--eval-batches", "-1")
    assert not plan.shared and plan.max_ranks == 8
    assert not any(o.startswith("shared_gpu") for o in plan.overrides("baseline", 0))
    with pytest.raises(SystemExit, match=r"--max-ranks 9 is invalid; .* <= 8 \(the GPUs, with --shared-gpu false"):
        plan_for(tiny_recipes, tmp_path, "--matrix", "--max-ranks", "9", "--eval-batches", "-1", "--shared-gpu",
                 "false")
    more = plan_for(tiny_recipes, tmp_path, "--matrix", "--max-ranks", "16", "--eval-batches", "-1")
    assert more.shared and all(more.backend(arm) == "nccl" for arm in more.args.arms)


def test_scheduler_keeps_the_running_ranks_within_the_budget(tiny_recipes, tmp_path, monkeypatch):
    monkeypatch.setattr(convergence_plan, "_visible_gpus", lambda: ["0", "1", "2", "3", "4", "5"])
    plan = plan_for(tiny_recipes, tmp_path, "--arms", "baseline", "w8g8", "sdp4bit-2x2", "zeropp-2x2", "w4g4",
                    "--shared-gpu", "false", "--stagger-s", "0", "--results-interval-s", "0", "--eval-batches", "-1")
    events, held = [], {}

    def fake_start(plan_, arm, gpus):
        held[arm] = gpus
        events.append(("start", arm))
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.4)"])

    monkeypatch.setattr(convergence_runner, "_start_arm", fake_start)
    progress = []
    assert convergence_runner.run_arms(plan, e2e_common.Budget(None), lambda: progress.append(1)) == "complete"
    starts = [arm for kind, arm in events]
    assert starts[:3] == ["baseline", "w8g8", "w4g4"]  # --arms order; the first that fits the free ranks
    assert sorted(starts) == sorted(plan.args.arms) and progress
    assert all(len(held[arm]) == plan.nproc(arm) for arm in held)
    first = [set(held[arm]) for arm in starts[:3]]  # they run together: their GPUs never overlap
    assert len(set.union(*first)) == sum(map(len, first))
    assert all((plan.arm_dir(arm) / "done.json").is_file() for arm in plan.args.arms)
    assert convergence_runner.running_launches(plan) == {}


def test_a_launch_out_of_gpu_memory_beside_others_waits_for_room_without_a_retry(tiny_recipes, tmp_path,
                                                                                  monkeypatch, capsys):
    monkeypatch.setattr(convergence_plan, "_visible_gpus", lambda: ["0"])
    gpu = ["-o", "device=gpu", "-o", "precision=amp_bf16"]
    plan = plan_for(tiny_recipes, tmp_path, "--arms", "baseline", "w8g8", "w4g4", "--max-ranks", "6", "--retries", "0",
                    "--stagger-s", "0", "--results-interval-s", "0", "--eval-batches", "-1", "--shared-gpu", "true",
                    *gpu)
    oomed, procs, starts = tmp_path / "oomed", {}, []

    def fake_start(plan_, arm, gpus):
        plan.arm_dir(arm).mkdir(parents=True, exist_ok=True)
        launch = convergence_runner.launch_count(plan.arm_dir(arm))
        log = plan.arm_dir(arm) / f"log-{launch:02d}.txt"
        starts.append((arm, launch))
        if arm == "w4g4" and launch == 0:  # all three ran: this one did not fit
            log.write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.53 GiB.\n")
            code = f"import pathlib, sys; pathlib.Path({str(oomed)!r}).touch(); sys.exit(1)"
        elif arm == "w4g4":
            assert procs["baseline"].poll() is not None  # it waited until two processes ran beside it, not four
            log.write_text("ok\n")
            code = "pass"
        else:  # baseline ends 2 s after w4g4 failed (the driver polls every second); w8g8 once w4g4 ran again
            log.write_text("ok\n")
            flag, after = (oomed, 2.0) if arm == "baseline" else (plan.arm_dir("w4g4") / "log-01.txt", 0.0)
            code = (f"import os, sys, time\nend = time.time() + 60\nwhile not os.path.exists({str(flag)!r}):\n"
                    f"    time.sleep(0.01)\n    if time.time() > end: sys.exit(1)\ntime.sleep({after})")
        procs[arm] = subprocess.Popen([sys.executable, "-c", code])
        return procs[arm]

    monkeypatch.setattr(convergence_runner, "_start_arm", fake_start)
    assert convergence_runner.run_arms(plan, e2e_common.Budget(None)) == "complete"  # no retry was spent on it
    assert starts == [("baseline", 0), ("w8g8", 0), ("w4g4", 0), ("w4g4", 1)]
    assert ("w4g4: out of GPU memory beside 4 other processes; at most 4 run at once from now (give --max-ranks 4 "
            "next time)") in capsys.readouterr().out


def test_arms_whose_saves_were_cut_short_start_again_and_trained_out_arms_are_done(tiny_recipes, tmp_path,
                                                                                   monkeypatch, capsys):
    from composer_qsdp.recipes.resume import NO_COMPLETE_CHECKPOINT

    plan = plan_for(tiny_recipes, tmp_path, "--arms", "baseline", "w8g8", "w4g4", "--retries", "0",
                    "--stagger-s", "0", "--results-interval-s", "0", "--eval-batches", "-1")

    # An earlier run stopped the baseline while it saved batch 7, its only checkpoint, and w8g8 after it saved the
    # final batch (20) but before it exited.
    for arm in ("baseline", "w8g8"):
        plan.arm_dir(arm).mkdir(parents=True)
        (plan.arm_dir(arm) / "log-00.txt").write_text("stopped\n")
    write_checkpoint(plan.arm_dir("baseline"), 7, complete=False)
    write_checkpoint(plan.arm_dir("w8g8"), 20)
    starts = []

    def fake_start(plan_, arm, gpus):
        launch = convergence_runner.launch_count(plan.arm_dir(arm))
        starts.append((arm, launch))
        log = plan.arm_dir(arm) / f"log-{launch:02d}.txt"
        log.parent.mkdir(parents=True, exist_ok=True)
        code = "import sys; sys.exit(0)"
        if arm == "baseline" and launch == 1:  # autoresume refuses the folder
            log.write_text(f"recipe error: ... checkpoint(s) ep0-ba7 but ..., and {NO_COMPLETE_CHECKPOINT}; ...\n")
            code = "import sys; sys.exit(2)"
        elif arm == "baseline":
            assert not (plan.arm_dir(arm) / "checkpoints" / "ep0-ba7").exists()  # it starts again from batch 0
            log.write_text("ok\n")
        else:  # w4g4 saves its final batch, then is stopped before it exits
            log.write_text("ok\n")
            write_checkpoint(plan.arm_dir(arm), 20)
            code = "import sys; sys.exit(143)"
        return subprocess.Popen([sys.executable, "-c", code])

    monkeypatch.setattr(convergence_runner, "_start_arm", fake_start)
    assert convergence_runner.run_arms(plan, e2e_common.Budget(None)) == "complete"  # no retry was spent
    assert starts == [("baseline", 1), ("w4g4", 0), ("baseline", 2)]  # w8g8 had finished
    assert (plan.arm_dir("baseline") / "checkpoints" / "ep0-ba7.incomplete").is_dir()  # set aside, not deleted
    assert all((plan.arm_dir(arm) / "done.json").is_file() for arm in plan.args.arms)
    out = capsys.readouterr().out
    assert "baseline: every checkpoint's save was cut short (ep0-ba7.incomplete, set aside); it starts again" in out
    assert "w4g4: finished (its launch ended with status 143 after saving the final batch)" in out


def test_a_time_budget_stops_the_arms_their_grace_before_its_end(tiny_recipes, tmp_path, monkeypatch):
    plan = plan_for(tiny_recipes, tmp_path, "--arms", "baseline", "--stop-grace-s", "3", "--min-launch-s", "0",
                    "--results-interval-s", "0", "--eval-batches", "-1")
    stopped = tmp_path / "stopped"
    code = (f"import signal, sys, time\ndef term(*_):\n    time.sleep(1)\n    open({str(stopped)!r}, 'w')"
            f".write(repr(time.monotonic()))\n    sys.exit(143)\nsignal.signal(signal.SIGTERM, term)\n"
            "while True: time.sleep(0.05)")
    monkeypatch.setattr(convergence_runner, "_start_arm",
                        lambda plan_, arm, gpus: subprocess.Popen([sys.executable, "-c", code], start_new_session=True))
    start = time.monotonic()
    assert convergence_runner.run_arms(plan, e2e_common.Budget(6.0)) == "incomplete"
    # Stopped 3 s before the budget's end (the driver polls every second), its 1 s save inside the budget.
    assert 2.0 <= float(stopped.read_text()) - start <= 5.5 and time.monotonic() - start < 6.0


def test_shared_arms_over_nccl_spread_over_the_least_used_gpus(tiny_recipes, tmp_path, monkeypatch):
    monkeypatch.setattr(convergence_plan, "_visible_gpus", lambda: ["4", "5", "6", "7"])
    gpu = ["-o", "device=gpu", "-o", "precision=amp_bf16"]
    arms = ["baseline", "w8g8", "w4g4", "w8g4", "sdp4bit-2x2", "qwd-w4g4"]
    plan = plan_for(tiny_recipes, tmp_path, "--arms", *arms, "--max-ranks", "12", "--stagger-s", "0",
                    "--results-interval-s", "0", "--eval-batches", "-1", "--shared-gpu", "auto", *gpu)
    assert plan.shared and plan.backend("sdp4bit-2x2") == "nccl"
    held = {}
    # baseline ends once the fifth arm has started (its GPUs are then the least used); the others once the last has.
    first, rest = tmp_path / "end-baseline", tmp_path / "end-rest"

    def fake_start(plan_, arm, gpus):
        held[arm] = gpus
        {"sdp4bit-2x2": first, "qwd-w4g4": rest}.get(arm, tmp_path / "start").touch()
        flag = first if arm == "baseline" else rest
        return subprocess.Popen([sys.executable, "-c", "import os, time\n"
                                 f"while not os.path.exists({str(flag)!r}): time.sleep(0.01)"])

    monkeypatch.setattr(convergence_runner, "_start_arm", fake_start)
    assert convergence_runner.run_arms(plan, e2e_common.Budget(None)) == "complete"
    # Two processes on each GPU after the first four arms (baseline, w8g8, w4g4, w8g4), instead of eight on 4 and 5.
    assert [held[arm] for arm in arms[:4]] == [["4", "5"], ["6", "7"], ["4", "5"], ["6", "7"]]
    assert held["sdp4bit-2x2"] == ["4", "5", "6", "7"]  # as wide as the GPUs
    # baseline ended before the last arm started: GPUs 4 and 5 carried 2 processes, 6 and 7 three.
    assert held["qwd-w4g4"] == ["4", "5"]


def test_samedev_arms_take_one_least_used_gpu_of_several(tiny_recipes, tmp_path, monkeypatch):
    # samedev joins the ranks of one GPU: on a 2-GPU host each shared arm runs on one, the least used, and the
    # 2-rank arms over NCCL beside them count its ranks there.
    monkeypatch.setattr(convergence_plan, "_visible_gpus", lambda: ["0", "1"])
    gpu = ["-o", "device=gpu", "-o", "precision=amp_bf16"]
    arms = ["sdp4bit-2x2", "baseline", "tlq-hs-2x2", "w8g8"]
    plan = plan_for(tiny_recipes, tmp_path, "--arms", *arms, "--max-ranks", "12", "--stagger-s", "0",
                    "--results-interval-s", "0", "--eval-batches", "-1", "--shared-gpu-transport", "samedev", *gpu)
    assert [plan.backend(arm) for arm in arms] == ["samedev", "nccl", "samedev", "nccl"]
    held, done = {}, tmp_path / "done"

    def fake_start(plan_, arm, gpus):
        held[arm] = gpus
        if arm == arms[-1]:
            done.touch()
        return subprocess.Popen([sys.executable, "-c", "import os, time\n"
                                 f"while not os.path.exists({str(done)!r}): time.sleep(0.01)"])

    monkeypatch.setattr(convergence_runner, "_start_arm", fake_start)
    assert convergence_runner.run_arms(plan, e2e_common.Budget(None)) == "complete"
    # 4 ranks on GPU 0; the NCCL arm a rank on each; the next 4 ranks on GPU 1, the less used (1 process against 5).
    assert [held[arm] for arm in arms] == [["0"], ["0", "1"], ["1"], ["0", "1"]]


def test_noise_band_and_gaps_to_both_seeds(tiny_recipes, tmp_path):
    plan = plan_for(tiny_recipes, tmp_path, "--arms", "baseline", "baseline-seed2", "w8g8", "ddp-baseline")
    out = plan.out_dir
    write_segment(out / "baseline" / "metrics-00.json", {10: 5.0, 20: 4.0})
    write_segment(out / "baseline-seed2" / "metrics-00.json", {10: 5.0, 20: 4.04})
    write_segment(out / "w8g8" / "metrics-00.json", {10: 5.0, 20: 4.02})
    write_segment(out / "ddp-baseline" / "metrics-00.json", {10: 5.0, 20: 4.1})
    arms = convergence_report.summarize(plan)
    assert convergence_report.noise_band_pct(arms) == pytest.approx(1.0)
    assert arms["w8g8"]["gap_vs_baseline_pct"] == pytest.approx(0.5)
    assert arms["w8g8"]["gap_vs_baseline_seed2_pct"] == pytest.approx(100 * (4.02 - 4.04) / 4.04)
    assert "gap_vs_baseline_seed2_pct" not in arms["ddp-baseline"]  # DDP arms: ddp-baseline only
    manifest = {"command": "c", "tokens": {"train": 1, "val": 1}, "input": {"files": 1, "bytes": 1, "sha256": "ab"}}
    md = convergence_report.markdown(plan, {"device": "cpu", "git": "x"}, manifest, arms, "complete")
    assert "Noise band: the FSDP2 baselines of seeds 17 and 18 end 1.00% apart" in md
    assert "w8g8 -0.50%" in md


def test_status_and_collect_report_each_arm_and_pack_the_results(tiny_recipes, tmp_path, capsys):
    plan = plan_for(tiny_recipes, tmp_path, "--arms", "baseline", "w8g8", "w4g4", "w8g4")
    out = plan.out_dir
    write_segment(out / "baseline" / "metrics-00.json", {10: 5.0, 20: 4.0})
    (out / "baseline" / "log-00.txt").write_text("$ composer ...\nfinished\n")
    (out / "baseline" / "done.json").write_text("{}")
    write_segment(out / "w8g8" / "metrics-00.json", {10: 5.1})
    (out / "w8g8" / "log-00.txt").write_text("Traceback (most recent call last):\nRuntimeError: boom\n")
    (out / "w8g4").mkdir()  # stopped by the driver's SIGTERM: saved, resumable, not failed
    (out / "w8g4" / "log-00.txt").write_text(  # as the launcher logs its own SIGTERM, and each rank its stop
        "Traceback (most recent call last):\n  File \"composer/core/engine.py\", line 123, in sigterm_handler\n"
        "SystemExit: 143\nrank 0: stopped by SIGTERM after batch 1850; checkpoint saved at /tmp/cv0/w8g4/"
        "checkpoints/ep0-ba1850: autoresume (or load_path) continues from it\n"
        "ERROR:composer.cli.launcher:Global rank 0 (PID 9140) exited with code 143\n")
    write_corpus_manifest(tmp_path / "corpus")
    collected = tmp_path / "collected"
    assert convergence.report_progress(plan, collected) == 3  # not every arm is done
    text = capsys.readouterr().out
    assert "baseline         done" in text and "val loss 4.0000 at step 20" in text
    assert "w8g8             failed" in text and "RuntimeError: boom" in text
    assert "w4g4             not started" in text
    assert "w8g4             stopped" in text
    stem = f"convergence-{plan.name}"
    names = {p.name for p in collected.iterdir()}
    assert {f"{stem}.csv", f"{stem}.md", f"{stem}.json", "progress.json", "arms-logs.tar.gz"} <= names
    import tarfile

    with tarfile.open(collected / "arms-logs.tar.gz") as tar:
        assert {"baseline/metrics-00.json", "baseline/log-00.txt", "w8g8/log-00.txt"} <= set(tar.getnames())


def test_collect_counts_an_arm_stopped_after_saving_its_final_batch_as_done(tiny_recipes, tmp_path, capsys):
    # The driver's budget stopped the launch between its final save and its exit (Composer's launcher waiting for
    # the other ranks): the run trained every batch, and the collected record must say so.
    plan = plan_for(tiny_recipes, tmp_path, "--arms", "baseline", "w8g8")
    out = plan.out_dir
    for arm, batch in (("baseline", 20), ("w8g8", 10)):
        write_segment(out / arm / "metrics-00.json", {10: 5.0, 20: 4.0} if batch == 20 else {10: 5.1})
        (out / arm / "log-00.txt").write_text("Waiting up to 30 seconds for all training processes to terminate.\n")
        write_checkpoint(out / arm, batch)
    write_corpus_manifest(tmp_path / "corpus")
    assert convergence.report_progress(plan, tmp_path / "collected") == 3  # w8g8 stopped at batch 10 of 20
    text = capsys.readouterr().out
    assert "baseline         done" in text and "w8g8             stopped" in text
    record = json.loads((tmp_path / "collected" / f"convergence-{plan.name}.json").read_text())
    assert record["arms"]["baseline"]["complete"] and not record["arms"]["w8g8"]["complete"]
    assert record["arms"]["baseline"]["final_step"] == 20


def test_a_status_command_states_the_concurrency_only_when_told(tiny_recipes, tmp_path):
    # --status and --collect read arms that earlier commands ran: their own default --max-ranks says nothing about
    # how many processes those ran at once, so the settings line says it only when the command is given it.
    manifest = {"command": "c", "tokens": {"train": 1, "val": 1}, "input": {"files": 1, "bytes": 1, "sha256": "ab"}}
    texts = {}
    for extra in ((), ("--status",), ("--status", "--max-ranks", "3"), ("--collect", str(tmp_path / "c"))):
        plan = plan_for(tiny_recipes, tmp_path, "--arms", "baseline", "w8g8", *extra)
        texts[extra[:1] + extra[2:]] = convergence_report.markdown(plan, {"device": "cpu", "git": "x"}, manifest, {},
                                                                  "incomplete")
    assert "at most 2 processes at once" in texts[()]  # a run: the widest arm's 2 processes by default
    assert "processes at once" not in texts[("--status",)] and "processes at once" not in texts[("--collect",)]
    assert "at most 3 processes at once" in texts[("--status", "3")]


def test_tables_rewritten_elsewhere_keep_the_header_and_backends_of_the_host_that_ran_the_arms(tiny_recipes,
                                                                                               tmp_path):
    # Arms of two sessions on a GPU host, their logs unpacked on a CPU machine: the tables must name that host, both
    # sessions' revisions and how the arms' ranks communicated, not this machine.
    records = []
    for session, (git, date) in enumerate((("aaa1111", "2026-11-28 10:00 UTC"), ("bbb2222", "2026-11-29 11:00 UTC"))):
        records.append(tmp_path / f"record-{session}.json")
        records[-1].write_text(json.dumps({"header": {
            "device": "1 x NVIDIA H200 (140 GiB) of 1 visible; arms share the GPU(s)", "torch": "2.11.0+cu130",
            "nccl": "2.28.9", "python": "3.12.3", "date": date, "git": git, "command": f"python3 convergence.py s{session}"},
            "settings": {"shared_gpu": session == 1}}))
    plan = plan_for(tiny_recipes, tmp_path, "--arms", "baseline", "w8g8", "--status", "--header-from", *map(str, records))
    for arm, backend in (("baseline", "nccl"), ("w8g8", "gloo")):
        write_segment(plan.out_dir / arm / "metrics-00.json", {10: 5.0})
        segment = plan.out_dir / arm / "metrics-00.json"
        segment.write_text(json.dumps(json.loads(segment.read_text()) | {"hyperparameters": {"dist_backend": backend}}))
    manifest = {"command": "c", "tokens": {"train": 1, "val": 1}, "input": {"files": 1, "bytes": 1, "sha256": "ab"}}
    record = convergence_report.write_results(plan, manifest, "incomplete", quiet=True)
    head = record["header"]
    assert head["device"] == "1 x NVIDIA H200 (140 GiB) of 1 visible; arms share the GPU(s)"
    assert (head["git"], head["torch"]) == ("aaa1111 + bbb2222", "2.11.0+cu130")
    assert head["command"] == "python3 convergence.py s0 ; python3 convergence.py s1" and head["tables"]  # this command
    assert (record["arms"]["baseline"]["backend"], record["arms"]["w8g8"]["backend"]) == ("nccl", "gloo")
    assert record["settings"]["shared_gpu"] is True  # as the host ran them (one session shared), not this CPU's False
    md = (plan.out_dir / f"convergence-{plan.name}.md").read_text()
    assert "over gloo w8g8, over NCCL baseline" in md and "CPU processes" not in md
    # An arm resumed on the other transport says so, in launch order.
    write_segment(plan.out_dir / "w8g8" / "metrics-01.json", {20: 4.0})
    segment = plan.out_dir / "w8g8" / "metrics-01.json"
    segment.write_text(json.dumps(json.loads(segment.read_text()) | {"hyperparameters": {"dist_backend": "nccl"}}))
    record = convergence_report.write_results(plan, manifest, "incomplete", quiet=True)
    assert record["arms"]["w8g8"]["backend"] == "gloo, then nccl"
    md = (plan.out_dir / f"convergence-{plan.name}.md").read_text()
    assert "over gloo none, over NCCL baseline, resumed on the other: w8g8 (gloo, then NCCL)" in md

    with pytest.raises(SystemExit, match="with --status or --collect"):
        convergence.main(["--recipe-dir", str(tiny_recipes), "--header-from", str(records[0])])
    (tmp_path / "not-a-record.json").write_text("[]")
    bad = plan_for(tiny_recipes, tmp_path, "--arms", "baseline", "--status", "--header-from",
                   str(tmp_path / "not-a-record.json"))
    with pytest.raises(SystemExit, match="not-a-record.json: not a convergence record"):
        convergence_report.write_results(bad, manifest, "incomplete", quiet=True)


def test_ddp_arms_compare_with_ddp_adamw_and_count_their_bytes(tiny_recipes, tmp_path):
    plan = plan_for(tiny_recipes, tmp_path, "--arms", "baseline", "ddp-baseline", "zero-one-adam",
                    "zero-one-adam-rescale")
    out = plan.out_dir
    write_segment(out / "baseline" / "metrics-00.json", {10: 5.0, 20: 3.0})
    write_segment(out / "ddp-baseline" / "metrics-00.json", {10: 5.0, 20: 4.0})
    write_segment(out / "zero-one-adam" / "metrics-00.json", {10: 5.1, 20: 4.02},
                  zero_one_adam__compression_vs_fp32_allreduce={1: 1.0, 19: 12.0, 20: 12.5},
                  zero_one_adam__total_bytes_sent={1: 1e9, 20: 2.5e9})
    write_segment(out / "zero-one-adam-rescale" / "metrics-00.json", {10: 5.0, 20: 3.98},
                  zero_one_adam__compression_vs_fp32_allreduce={20: 9.5}, zero_one_adam__total_bytes_sent={20: 3e9})
    arms = convergence_report.summarize(plan)
    assert arms["zero-one-adam"]["gap_vs_baseline_pct"] == pytest.approx(0.5)  # against ddp-baseline's 4.0
    assert arms["zero-one-adam"]["compression_vs_unquantized"] == 12.5  # the whole run's, its last value
    assert arms["zero-one-adam"]["total_bytes_sent"] == 2.5e9 and arms["ddp-baseline"]["total_bytes_sent"] is None
    manifest = {"command": "c", "tokens": {"train": 1, "val": 1}, "input": {"files": 1, "bytes": 1, "sha256": "ab"}}
    md = convergence_report.markdown(plan, {"device": "cpu", "git": "x"}, manifest, arms, "complete")
    assert "| zero-one-adam | 2 | 20 (partial) | 4.0200 | n/a | +0.50% | 12.50x | n/a | 2.500 |" in md
    assert ("0/1 Adam final validation loss within 1% of DDP AdamW: +0.50% (met); bytes sent per rank at least 10x "
            "fewer than DDP's fp32 all-reduce: 12.5x (met)") in md
    assert ("0/1 Adam (zero-one-adam-rescale) final validation loss within 1% of DDP AdamW: -0.50% (met); "
            "bytes sent per rank at least 10x fewer than DDP's fp32 all-reduce: 9.5x (NOT met)") in md


def test_corpus_manifest_fingerprint_and_checks(tiny_recipes, tmp_path):
    tree = tmp_path / "src"
    for i in range(40):
        (tree / f"pkg{i % 3}").mkdir(parents=True, exist_ok=True)
        (tree / f"pkg{i % 3}" / f"m{i}.py").write_text(f"def f{i}(x):\n    return x ** {i} + {i}\n" * 20)
    manifest = convergence_corpus.build_corpus(tmp_path / "corpus", 16, 0.25, str(tree), None)
    assert manifest["samples"] == {split: convergence_corpus.split_samples(tmp_path / "corpus", split)
                                   for split in ("train", "val")}
    assert manifest["samples"]["val"] > 0 and manifest["input"]["files"] == 40
    assert convergence_corpus.build_corpus(tmp_path / "corpus", 16, 0.25, str(tree), None) == manifest  # no rebuild
    with pytest.raises(SystemExit, match="was built from pysource with val_fraction=0.25"):
        convergence_corpus.build_corpus(tmp_path / "corpus", 16, 0.1, str(tree), None)
    with pytest.raises(SystemExit, match="was built from pysource"):  # another kind of text: not this corpus
        convergence_corpus.build_corpus(tmp_path / "corpus", 16, 0.25, str(tree), None, kind="prose")
    (tmp_path / "other").mkdir()
    with pytest.raises(SystemExit, match="exists but has no manifest.json"):
        convergence_corpus.build_corpus(tmp_path / "other", 16, 0.25, str(tree), None)

    # The fingerprint depends on relative paths and contents only.
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(tree), str(copy)], check=True)
    assert convergence_corpus.source_fingerprint("pysource", [str(copy)])["sha256"] == manifest["input"]["sha256"]
    (copy / "pkg0" / "m0.py").write_text("changed = True\n")
    assert convergence_corpus.source_fingerprint("pysource", [str(copy)])["sha256"] != manifest["input"]["sha256"]

    # Another kind builds from the same roots with its own files (the sources themselves: test_code_corpora.py).
    for i in range(40):
        (tree / f"h{i}.h").write_text(f"/* header {i} */\nint f{i}(int x);\n" * 20)
    built = convergence_corpus.build_corpus(tmp_path / "csource", 16, 0.25, str(tree), None, kind="csource")
    assert built["kind"] == "csource" and built["input"]["files"] == 40 and built["samples"]["train"] > 0
    assert built["command"].split()[3] == "csource"
    assert built["input"]["sha256"] != manifest["input"]["sha256"]
    # The prose corpus reads the C headers, the documentation files and the package metadata too.
    (tree / "README.md").write_text("A guide.\n")
    (tree / "pkg0-1.0.dist-info").mkdir()
    (tree / "pkg0-1.0.dist-info" / "METADATA").write_text("Name: pkg0\n\nA description.\n")
    (tree / "LICENSE.txt").write_text("Not read.\n")
    prose = convergence_corpus.source_fingerprint("prose", [str(tree)])
    assert prose["files"] == 40 + 40 + 2  # not the license
    assert convergence_corpus.source_fingerprint("pysource", [str(tree)])["files"] == 40

    plan = plan_for(tiny_recipes, tmp_path, "--steps", "1000", "--seq-len", "16")  # the corpus above
    with pytest.raises(SystemExit, match="train samples but 1000 steps x 8 = 8000 are needed"):
        convergence_corpus.check_corpus(manifest, plan.args.steps, plan.args.global_batch)


def test_build_only_fails_when_the_corpus_is_too_small_for_the_run(tiny_recipes, tmp_path, capsys):
    """``--build-only`` checks the corpus against the run's --steps x --global-batch as the run would, so a script
    that chains ``--build-only && <the run>`` stops at the build, with the driver's message; the corpus is kept."""
    tree = tmp_path / "src"
    tree.mkdir()
    for i in range(40):
        (tree / f"m{i}.py").write_text(f"def f{i}(x):\n    return x ** {i} + {i}\n" * 20)
    command = [sys.executable, str(ROOT / "benchmarks" / "convergence.py"), "--recipe-dir", str(tiny_recipes),
               "--build-only", "--corpus", str(tmp_path / "corpus"), "--corpus-input", str(tree), "--seq-len", "16",
               "--val-fraction", "0.25", "--global-batch", "8", "--out-dir", str(tmp_path / "out")]
    chained = subprocess.run(["bash", "-c", '"$@" --steps 1000 && touch "$RAN"', "bash", *command],
                             env={**os.environ, "RAN": str(tmp_path / "ran")}, capture_output=True, text=True)
    assert chained.returncode == 1, chained.stdout + chained.stderr
    assert "train samples but 1000 steps x 8 = 8000 are needed so that no sample repeats" in chained.stderr
    assert not (tmp_path / "ran").exists()  # what was chained after the build did not run
    manifest = json.loads((tmp_path / "corpus" / "manifest.json").read_text())
    samples = manifest["samples"]["train"]
    assert 0 < samples < 8000
    # The same corpus is found, not rebuilt, and is enough for a run of fewer steps, one step short of more.
    assert convergence.main([*command[2:], "--steps", str(samples // 8)]) == 0
    assert "building the corpus" not in capsys.readouterr().out
    with pytest.raises(SystemExit, match=f"has {samples} train samples but {samples // 8 + 1} steps x 8"):
        convergence.main([*command[2:], "--steps", str(samples // 8 + 1)])


# ------------------------------------------------------------------------------------------------------- slow
@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_cpu_arms_resume_after_a_kill_and_skip_finished_ones(tiny_recipes, tmp_path):
    out = tmp_path / "runs"
    command = [sys.executable, str(ROOT / "benchmarks" / "convergence.py"), "--recipe-dir", str(tiny_recipes),
               "--arms", "baseline", "w4g4-hadamard", "--steps", "40", "--seq-len", "32", "--global-batch", "8",
               "--eval-interval", "5", "--eval-batches", "2", "--eval-batch-size", "4", "--save-interval", "10",
               "--corpus", str(tmp_path / "corpus"), "--corpus-input", str(ROOT / "composer_qsdp"),
               "--val-fraction", "0.2", "--out-dir", str(out), "--min-launch-s", "0", "--stagger-s", "0"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    stem = f"convergence-{tiny_recipes.name}-t32-b8-s40"

    # 1. Stop the driver (as an outer time limit would) once the first arm has its first checkpoint.
    driver = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    latest = out / "baseline" / "checkpoints" / "latest-rank0.pt"
    deadline = time.monotonic() + 600
    while not latest.exists() and driver.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    driver.send_signal(signal.SIGTERM)
    log = driver.communicate(timeout=120)[0]
    assert driver.returncode == 3, log[-3000:]
    checkpoint = int(os.readlink(latest).rsplit("ba", 1)[1])
    assert 0 < checkpoint < 40
    partial = json.loads((out / f"{stem}.json").read_text())
    assert partial["status"] == "incomplete" and not partial["arms"]["baseline"]["complete"]
    kept = dict(map(tuple, partial["arms"]["baseline"]["curve"]))
    # Every evaluation up to the checkpoint survived the kill; the checkpoint is the SIGTERM save of the batch the
    # ranks were in, not an older scheduled one: the stop reached them directly, and their save finished.
    assert set(range(5, checkpoint + 1, 5)) <= set(kept) and checkpoint % 10 != 0

    # 2. Rerun: the baseline continues from its checkpoint, the second arm runs, all evaluations are there.
    second = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    record = json.loads((out / f"{stem}.json").read_text())
    for arm in ("baseline", "w4g4-hadamard"):
        assert record["arms"][arm]["complete"]
        assert [step for step, _ in record["arms"][arm]["curve"]] == list(range(5, 45, 5))
    # No gather is served from a replica in w4g4: plain FSDP2 sends what the same collectives unquantized send.
    hadamard = record["arms"]["w4g4-hadamard"]
    assert hadamard["compression_vs_plain_fsdp"] == pytest.approx(hadamard["compression_vs_unquantized"])
    # Two launches, or more when a start-up failure was retried: the first and the one that finished count.
    segments = sorted((out / "baseline").glob("metrics-*.json"))
    assert record["arms"]["baseline"]["launches"] >= 2 and segments[0].name == "metrics-00.json"
    first_seg, resumed = (json.loads(path.read_text())["metrics"] for path in (segments[0], segments[-1]))
    first_losses, resumed_losses = (dict(map(tuple, m["loss/train/total"])) for m in (first_seg, resumed))
    assert min(resumed_losses) == checkpoint  # resumed, not restarted: batches are keyed 0-based
    overlap = set(first_losses) & set(resumed_losses)
    assert {b: resumed_losses[b] for b in overlap} == {b: first_losses[b] for b in overlap}  # exact resume
    merged = dict(map(tuple, record["arms"]["baseline"]["curve"]))
    assert all(merged[s] == v for s, v in kept.items() if s <= checkpoint)
    rows = list(csv.reader((out / f"{stem}.csv").read_text().splitlines()))
    assert rows[0] == ["step", "tokens", "baseline", "w4g4-hadamard"] and len(rows) == 9
    assert (out / f"{stem}.png").read_bytes().startswith(PNG_MAGIC)
    manifest = json.loads((tmp_path / "corpus" / "manifest.json").read_text())
    assert manifest["samples"]["train"] >= 40 * 8

    # 3. Nothing left to do: no launch.
    logs = sorted(out.glob("*/log-*.txt"))
    third = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert third.returncode == 0 and ": launch " not in third.stdout
    assert sorted(out.glob("*/log-*.txt")) == logs


def _cells(md: str, start: str) -> list[str]:
    """The cells of the markdown table row of ``md`` that starts with ``start``."""
    row = next(line for line in md.splitlines() if line.startswith(start))
    return [cell.strip() for cell in row.strip("|").split("|")]


def fake_record(git: str, arms: dict[str, dict[int, float]], steps: int = 20, sha: str = "ab" * 32) -> dict:
    """A convergence record as ``write_results`` writes it, with the given validation curves."""
    return {
        "arm_names": convergence_arms.ARM_NAMES,
        "header": {"device": "2 CPU processes", "date": "2026-11-21 20:00 UTC", "git": git,
                   "command": "python3 benchmarks/convergence.py"},
        "settings": {"recipe_dir": "/r/gpt-125m", "steps": steps, "seq_len": 32, "global_batch": 8, "micro_batch": 4},
        "status": "complete", "corpus": {"kind": "pysource", "val_fraction": 0.02, "input": {"sha256": sha},
                                         "command": "python -m composer_qsdp.recipes.data.build pysource /tmp/c"},
        "arms": {arm: {"description": arm, "complete": max(curve) == steps, "curve": sorted(curve.items()),
                       "final_step": max(curve), "final_val_loss": curve[max(curve)],
                       "compression_vs_unquantized": None, "rel_error": {"weights": None, "grads": None},
                       "step_time_s_median": None, "gap_vs_baseline_pct": None}
                 for arm, curve in arms.items()},
    }


def test_combine_labels_repeated_arms_and_gaps_to_every_baseline(tmp_path):
    first = fake_record("aaa1111", {"baseline": {10: 5.0, 20: 4.0}, "w8g8": {10: 5.0, 20: 3.97}, "w4g4": {10: 5.5},
                                    "w4g4-learned": {10: 5.4}})
    second = fake_record("bbb2222", {"baseline": {10: 4.8, 20: 4.2}, "w4g4-learned": {10: 5.4, 20: 4.41}})
    paths = [tmp_path / "run1" / "convergence-x.json", tmp_path / "run2" / "convergence-x.json"]
    for path, record in zip(paths, (first, second)):
        path.parent.mkdir()
        path.write_text(json.dumps(record))
    assert convergence.main(["--combine", *map(str, paths)]) == 0
    stem = tmp_path / "run1" / "convergence-x-combined"
    combined = json.loads(stem.with_suffix(".json").read_text())
    arms = combined["arms"]
    # w4g4-learned stopped at step 10 in run 1 and run 2 continued it (the same loss there): run 2's supersedes it
    assert list(arms) == ["baseline@run1", "w8g8", "w4g4", "baseline@run2", "w4g4-learned"]
    assert (arms["w8g8"]["run"], arms["baseline@run2"]["run"]) == (1, 2)
    assert arms["w8g8"]["gap_vs_baselines_pct"] == pytest.approx({"baseline@run1": -0.75,
                                                                   "baseline@run2": 3.97 / 4.2 * 100 - 100})
    # a partial arm is compared with each baseline at its own last step (10)
    assert arms["w4g4"]["gap_vs_baselines_pct"] == pytest.approx({"baseline@run1": 10.0,
                                                                  "baseline@run2": 5.5 / 4.8 * 100 - 100})
    assert arms["w4g4-learned"]["gap_vs_baselines_pct"]["baseline@run1"] == pytest.approx(10.25)
    assert combined["header"]["git"] == "aaa1111 + bbb2222"
    # Another loss at a shared step is another run of the arm: both are kept.
    first["arms"]["w4g4-learned"]["curve"] = [[10, 5.5]]
    rerun = convergence_report.combine_records([first, second])["arms"]
    assert [label for label in rerun if label.startswith("w4g4-learned")] == ["w4g4-learned@run1", "w4g4-learned@run2"]
    rows = list(csv.reader(io.StringIO(stem.with_suffix(".csv").read_text())))
    assert rows[0] == ["step", "tokens", *arms]
    assert rows[2] == ["20", str(20 * 8 * 32), "4.000000", "3.970000", "", "4.200000", "4.410000"]
    md = stem.with_suffix(".md").read_text()
    assert "Baseline run-to-run spread: 5.00% between the final losses of baseline@run1, baseline@run2." in md
    assert "vs baseline@run1: -0.75% (met; W8G8 ended below the baseline)" in md
    assert "vs baseline@run2: -5.48% (NOT met; W8G8 ended below the baseline)" in md
    header, rule = md.splitlines()[7:9]
    assert header.count("|") == rule.count("|")
    # Records written before the plain-FSDP2 ratio was logged show it as n/a.
    assert _cells(md, "| w8g8 ")[_cells(md, "| arm ").index("compression vs plain FSDP2")] == "n/a"
    assert stem.with_suffix(".png").read_bytes().startswith(PNG_MAGIC)


@pytest.mark.parametrize("change, message", [
    ({"settings": {"steps": 30}}, "run 2 differs from run 1 in setting 'steps': 30 != 20"),
    ({"corpus": {"input": {"sha256": "cd" * 32}}}, "run 2 used another corpus"),
    ({"corpus": {"val_fraction": 0.05}}, "run 2 built its corpus otherwise: 'val_fraction' 0.05 != 0.02"),
])
def test_combine_refuses_runs_that_differ(change, message):
    first = fake_record("a", {"baseline": {20: 4.0}})
    second = fake_record("b", {"baseline": {20: 4.1}})
    for key, value in change.items():
        second[key] = {**second[key], **value}
    with pytest.raises(ValueError, match=message):
        convergence_report.combine_records([first, second])
    with pytest.raises(ValueError, match="at least 2 records, got 1"):
        convergence_report.combine_records([first])
    alike = second | {"settings": first["settings"], "corpus": first["corpus"], "header": {**second["header"],
                                                                                         "git": "c"}}
    with pytest.raises(ValueError, match=message.replace("run 2", "run 3")):  # a combined record counts its runs
        convergence_report.combine_records([convergence_report.combine_records([first, alike]), second])


def test_combine_pools_runs_whose_corpus_was_built_in_other_folders():
    """Two machines building the same corpus into other folders, from input files under other roots, ran on the same
    data: the paths count for nothing, the input's sha256 and the build settings for everything."""
    first = fake_record("a", {"baseline": {20: 4.0}})
    second = fake_record("b", {"w8g8": {20: 4.1}})
    first["settings"]["corpus"], second["settings"]["corpus"] = "/tmp/pysrc", "/tmp/pysource"
    second["corpus"] = {**second["corpus"], "command": "python -m composer_qsdp.recipes.data.build pysource /tmp/d",
                        "input": {**second["corpus"]["input"], "roots": ["/another/site-packages"]}}
    assert list(convergence_report.combine_records([first, second])["arms"]) == ["baseline", "w8g8"]
    older = {**second, "corpus": {"input": second["corpus"]["input"]}}  # records from before the build fields
    assert list(convergence_report.combine_records([first, older])["arms"]) == ["baseline", "w8g8"]


def test_combine_pools_runs_of_other_evaluation_intervals_only_where_evaluations_left_training_alone():
    """A run that evaluated only at its end joins one that evaluated every 10 steps when every arm evaluated the exact
    weights (which leave training bit for bit as without them), not when a QSDP arm evaluated the quantized ones;
    sharing no evaluation, the two runs of one arm are told apart by their training windows."""
    every = fake_record("a", {"baseline": {10: 5.0, 20: 4.0}, "w8g8": {10: 5.01, 20: 4.02}})
    final = fake_record("b", {"baseline": {20: 4.03}, "w8g8": {20: 4.01}})
    for record, interval in ((every, 10), (final, 20)):
        record["settings"] = {**record["settings"], "eval_interval": interval}
        record["arms"]["w8g8"] |= {"eval_weights": "exact", "compression_vs_unquantized": 2.6}
        for r in record["arms"].values():
            r["train_curve"] = [[10, 5.2 + (record is final) / 100], [20, 4.1]]
    combined = convergence_report.combine_records([every, final])
    assert list(combined["arms"]) == ["baseline@run1", "w8g8@run1", "baseline@run2", "w8g8@run2"]
    assert [r["final_step"] for r in combined["arms"].values()] == [20, 20, 20, 20]
    final["arms"]["w8g8"] |= {"train_curve": every["arms"]["w8g8"]["train_curve"], "curve": [(20, 4.02)]}
    assert convergence_report.combine_records([every, final])["arms"]["w8g8"]["run"] == 1  # one run, tabled twice
    final["arms"]["w8g8"]["eval_weights"] = "quantized"
    with pytest.raises(ValueError, match="'eval_interval': 20 != 10, and run 2's w8g8 evaluated the quantized"):
        convergence_report.combine_records([every, final])
    del final["arms"]["w8g8"]["eval_weights"]  # a QSDP run from before exact evaluations: quantized
    with pytest.raises(ValueError, match="run 2's w8g8 evaluated the quantized"):
        convergence_report.combine_records([every, final])


def test_a_combined_record_joins_a_later_run_as_its_runs_own_records_would(tmp_path):
    """Combining an earlier combination with a new run gives the record that combining all the runs' own records
    gives: the same arms, run labels, gaps, seed tables and header; on the command line it replaces the earlier
    combination."""
    base = {f"baseline-1r@s{s}": {10: 5.0, 20: 4.0 + (s - 18) / 100} for s in (17, 18, 19)}
    first = _seeded("a", {**base, "w8g4@s17": {10: 5.02, 20: 4.03}, "w8g4@s18": {10: 5.01}})
    first["settings"] = {**first["settings"], "shared_gpu": False}
    second = _seeded("b", {"w8g4@s18": {10: 5.01, 20: 4.05}, "w8g4@s19": {10: 5.03, 20: 4.02},
                           "w8g4@s17": {10: 5.0, 20: 4.01}})  # s18 continued; s17 run again
    second["settings"] = {**second["settings"], "shared_gpu": True}
    third = _seeded("c", {f"w8g4-h128@s{s}": {10: 5.0, 20: 4.0 + (s - 18) / 1000} for s in (17, 18, 19)})
    for record in (first, second, third):
        for r in record["arms"].values():
            r["train_curve"] = [[10, r["curve"][0][1] + 1.0]]
    every = convergence_report.combine_records([first, second, third])
    stepwise = convergence_report.combine_records([convergence_report.combine_records([first, second]), third])
    assert stepwise == every
    assert list(every["arms"]) == [*base, "w8g4@s17@run1", "w8g4@s18", "w8g4@s19", "w8g4@s17@run2",
                                   *(f"w8g4-h128@s{s}" for s in (17, 18, 19))]
    assert [run["shared_gpu"] for run in every["runs"]] == [False, True, None]
    assert every["seed_groups"]["w8g4-h128"]["comparison"]["verdict"] == "inside"
    earlier, later = tmp_path / "convergence-x-combined.json", tmp_path / "new" / "convergence-x.json"
    later.parent.mkdir()
    earlier.write_text(json.dumps(convergence_report.combine_records([first, second])))
    later.write_text(json.dumps(third))
    assert convergence.main(["--combine", str(earlier), str(later)]) == 0
    assert json.loads(earlier.read_text()) == json.loads(json.dumps(every))


def test_current_name_maps_the_arm_of_any_variant_at_once():
    names = {"w8g4@s17": "w8g4-paper@s17", "w8g4-loco@s18@run9": "w8g4@s18@run9", "w8g4@lr2x": "w8g4-paper@lr2x",
             "w8g4-h128@lr0.5x@s19@run2": "w8g4-paper-h128@lr0.5x@s19@run2", "w8g4@run3": "w8g4-paper@run3",
             "w8g4-loco": "w8g4", "w8g4-paper@s17": "w8g4-paper@s17", "w8g8@s17": "w8g8@s17", "baseline": "baseline"}
    assert {old: convergence_arms.current_name(old) for old in names} == names


def _renaming_runs(paper: str, loco: str) -> list[dict]:
    """Two records of seeds 17-19 against ``baseline-1r``: the paper's W8G4 named ``paper`` with its Hadamard variant
    ``<paper>-h128``, and the LoCo W8G4 ``loco`` run in both; with training windows enough for a trend."""
    losses = {"baseline-1r": 4.0, paper: 4.02, f"{paper}-h128": 4.01, loco: 4.0}
    first, second = (_seeded(git, {f"{arm}@s{s}": {10: 5.0, 20: loss + (s - 18) / 100 + shift}
                                   for arm, loss in losses.items() if arm == loco or git == "a" for s in (17, 18, 19)})
                     for git, shift in (("a", 0.0), ("b", 0.001)))
    for record in (first, second):
        for r in record["arms"].values():  # described alike under either name
            r["train_curve"] = [[step, r["final_val_loss"] + 1.0 / step] for step in (5, 10, 15, 20)]
            r["description"] = "a seed run"
    return [first, second]


def test_records_without_arm_names_are_read_with_the_arms_current_names(tmp_path):
    """A record written before the arms were renamed names the paper's W8G4 ``w8g4`` and the LoCo one ``w8g4-loco``:
    read, it holds every arm under its current name, each name-keyed part as combining the renamed runs gives it; a
    record with ``arm_names`` is read as written, and combining an old record with a new one pools the LoCo runs."""
    path = tmp_path / "convergence-x-combined.json"
    old = convergence_report.combine_records(_renaming_runs("w8g4", "w8g4-loco"))
    del old["arm_names"]
    old["lr_sweep"] = {"w8g4-loco": {"baseline": "baseline", "scales": {}}}  # a part only a run's own record has
    path.write_text(json.dumps(old))
    read = convergence_report.read_record(path)
    renamed = convergence_report.combine_records(_renaming_runs("w8g4-paper", "w8g4"))
    assert {k: v for k, v in read.items() if k != "lr_sweep"} == json.loads(json.dumps(renamed))
    assert read["lr_sweep"] == {"w8g4": {"baseline": "baseline", "scales": {}}}
    assert {"w8g4-paper@s17", "w8g4-paper-h128@s17", "w8g4@s17@run1", "w8g4@s17@run2"} <= set(read["arms"])
    assert {"w8g4", "w8g4-paper", "w8g4-paper-h128"} <= set(read["seed_groups"]) and read["train_trends"]
    assert not any("loco" in name or "h128" in name and "paper" not in name
                   for part in ("arms", "seed_groups", "seed_groups_by_step", "train_seed_groups_by_step",
                                "train_trends") for name in read[part])
    path.write_text(json.dumps(renamed))
    assert convergence_report.read_record(path) == json.loads(json.dumps(renamed))
    # An old run's own record and a new run's: w8g4-loco's seeds join the new w8g4's, the paper's stay apart.
    old_run, new_run = tmp_path / "old.json", tmp_path / "new.json"
    first, _ = _renaming_runs("w8g4", "w8g4-loco")
    del first["arm_names"]
    old_run.write_text(json.dumps(first))
    new_run.write_text(json.dumps(_renaming_runs("w8g4-paper", "w8g4")[1]))
    assert convergence.main(["--combine", str(old_run), str(new_run), "--out-dir", str(tmp_path / "c")]) == 0
    combined = json.loads((tmp_path / "c" / "old-combined.json").read_text())
    assert combined["arm_names"] == convergence_arms.ARM_NAMES
    assert (combined["seed_groups"]["w8g4"]["runs"], combined["seed_groups"]["w8g4-paper"]["runs"]) == (6, 3)


def _evaluating(record: dict, weights: dict[str, object], settings: dict | None = None) -> dict:
    """``record`` with each named arm's recorded ``eval_weights`` and extra ``settings``."""
    record["settings"] = {**record["settings"], **(settings or {})}
    for arm, recorded in weights.items():
        record["arms"][arm]["eval_weights"] = recorded
    return record


def test_combine_pools_records_of_either_evaluation_setting_where_each_arm_evaluated_alike():
    # A record from before --eval-weights (no setting; its QSDP arms evaluated quantized weights) with plain FSDP2's
    # seeds, and one run with exact evaluation: the baselines pool, and w8g8 evaluated alike in every run it has.
    old = _seeded("a", {f"baseline-1r@s{s}": {20: 4.0 + s / 100} for s in (17, 18, 19)})
    new = _evaluating(_seeded("b", {**{f"baseline-1r@s{s}": {20: 4.01 + s / 100} for s in (20, 21)},
                                    **{f"w8g8@s{s}": {20: 4.2} for s in (17, 18, 19)}}),
                      {"w8g8@s17": "exact", "w8g8@s18": "exact", "w8g8@s19": "val=exact, val_quantized=quantized"},
                      {"eval_weights": "exact"})
    new["arms"]["w8g8@s20"] = {**new["arms"]["w8g8@s19"], "curve": [], "eval_weights": None}  # not started
    record = convergence_report.combine_records([old, new])
    group = record["seed_groups"]["w8g8"]
    assert group["runs"] == 3 and len(group["comparison"]["baseline_losses"]) == 5


@pytest.mark.parametrize("first, second, message", [
    (None, "exact", "w8g8 evaluated the exact weights in run 2 \\(w8g8@s18\\) but the unrecorded ones in run 1"),
    ("quantized", "val=exact, val_quantized=quantized", "the exact weights in run 2 .* the quantized ones in run 1"),
])
def test_combine_refuses_an_arm_whose_runs_evaluated_different_weights(first, second, message):
    runs = [_evaluating(_seeded("a", {"baseline-1r@s17": {20: 4.0}, "w8g8@s17": {20: 4.1}}), {"w8g8@s17": first}),
            _evaluating(_seeded("b", {"baseline-1r@s18": {20: 4.0}, "w8g8@s18": {20: 4.1}}), {"w8g8@s18": second},
                        {"eval_weights": "exact"})]
    with pytest.raises(ValueError, match=message):
        convergence_report.combine_records(runs)


def test_combine_compares_with_both_baseline_seeds_and_ignores_how_many_ran_at_once_and_how():
    first = fake_record("a", {"baseline": {20: 4.0}, "baseline-seed2": {20: 4.1}})
    first["settings"] = {**first["settings"], "shared_gpu": False}
    second = fake_record("b", {"qwd-w3g3-loco": {20: 4.05}})
    second["settings"] = {**second["settings"], "max_ranks": 12, "shared_gpu": True}
    record = convergence_report.combine_records([first, second])
    assert record["arms"]["qwd-w3g3-loco"]["gap_vs_baselines_pct"] == pytest.approx(
        {"baseline": 1.25, "baseline-seed2": 4.05 / 4.1 * 100 - 100})
    md = convergence_report.combined_markdown(record)
    assert "Baseline run-to-run spread: 2.50% between the final losses of baseline, baseline-seed2." in md
    # each run says how its ranks communicated: over the transports its arms' launches logged, gloo where none did
    assert "git `a`, 2 CPU processes, NCCL, a GPU per rank:" in md
    assert "git `b`, 2 CPU processes, ranks sharing GPUs over gloo:" in md
    third = fake_record("c", {"w8g8": {20: 4.02}, "w8g4": {20: 4.03}})
    third["settings"] = {**third["settings"], "shared_gpu": True}
    third["arms"]["w8g8"]["backend"], third["arms"]["w8g4"]["backend"] = "gloo, then samedev", "samedev"
    md = convergence_report.combined_markdown(convergence_report.combine_records([first, second, third]))
    assert "git `c`, 2 CPU processes, ranks sharing GPUs over gloo and samedev:" in md
    again = convergence_report.combine_records([convergence_report.combine_records([first, third]), second])
    assert [run.get("transport") for run in again["runs"]] == [None, "gloo and samedev", None]


def test_combine_sets_each_arms_seeds_against_its_baselines_seeds():
    """Seeds of one arm finished in different runs (--seeds) are compared together with their baseline's seeds."""
    base = {f"baseline-1r@s{s}": {10: 5.0, 20: loss} for s, loss in ((17, 4.00), (18, 4.02), (19, 3.98))}
    first = fake_record("a", {**base, "w8g8-nearest@s17": {10: 5.0}})
    second = fake_record("b", {f"w8g8-nearest@s{s}": {10: 5.0, 20: loss}
                               for s, loss in ((17, 4.01), (18, 4.00), (19, 3.99))})
    for record in (first, second):
        for name, r in record["arms"].items():
            r["baseline"] = "baseline" + name[name.index("@"):] if name.startswith("baseline") else \
                "baseline-1r" + name[name.index("@"):]
    record = convergence_report.combine_records([first, second])
    group = record["seed_groups"]["w8g8-nearest"]
    assert group["baseline"] == "baseline-1r" and group["seeds"] == [17, 18, 19]
    comparison = group["comparison"]
    assert comparison["step"] == 20 and comparison["verdict"] == "inside"  # run 2's finished seed 17 counts
    assert comparison["gap_pct"] == pytest.approx(0.0)
    md = convergence_report.combined_markdown(record)
    assert _cells(md, "| w8g8-nearest |")[-1] == "inside"


def _seeded(git: str, arms: dict[str, dict[int, float]]) -> dict:
    """A record of seed arms (``<arm>@s<seed>``), each compared with ``baseline-1r`` of its seed."""
    record = fake_record(git, arms)
    for name, r in record["arms"].items():
        r["baseline"] = "baseline-1r" + name[name.index("@"):]
    return record


def test_combine_pools_every_run_of_a_seed_against_the_baselines_runs():
    """A seed started again in a later session is another sample of the arm: the statistics take every run."""
    base = {f"baseline-1r@s{s}": {10: 5.0, 20: loss} for s, loss in ((17, 4.00), (18, 4.02), (19, 3.98))}
    first = _seeded("a", {**base, **{f"w8g8@s{s}": {10: 5.01, 20: loss}
                                     for s, loss in ((17, 4.03), (18, 4.05), (19, 4.01))}})
    # The second record tables the same baseline runs again (one run each, kept once) and reruns the arm's seeds.
    second = _seeded("b", {**base, **{f"w8g8@s{s}": {10: 4.99, 20: loss}
                                      for s, loss in ((17, 3.99), (18, 4.00), (19, 3.96))}})
    second["settings"] = {**second["settings"], "recipe_dir": "r/gpt-125m"}  # another machine's relative path
    record = convergence_report.combine_records([first, second])
    assert [label for label in record["arms"] if label.startswith("baseline")] == list(base)
    group = record["seed_groups"]["w8g8"]
    assert (group["seeds"], group["runs"]) == ([17, 18, 19], 6)
    c = group["comparison"]
    runs = {"17@run1": 4.03, "18@run1": 4.05, "19@run1": 4.01, "17@run2": 3.99, "18@run2": 4.00, "19@run2": 3.96}
    assert c["arm_losses"] == pytest.approx(runs) and (c["arm_seeds"], c["baseline_seeds"]) == (3, 3)
    assert c["baseline_losses"] == pytest.approx({"17": 4.00, "18": 4.02, "19": 3.98})
    assert c["arm_mean"] == pytest.approx(statistics.fmean(runs.values()))
    assert c["arm_std"] == pytest.approx(statistics.stdev(runs.values()))
    base_final = {17: 4.00, 18: 4.02, 19: 3.98}
    paired = [100 * (loss / base_final[int(run[:2])] - 1) for run, loss in runs.items()]
    assert c["paired_gap_pct"] == pytest.approx(statistics.fmean(paired))
    assert c["verdict"] == "inside"  # 4.00667 inside 3.98 .. 4.02, where run 1's seeds alone (4.03) are above
    md = convergence_report.combined_markdown(record)
    assert _cells(md, "| w8g8 |")[3] == "6 (3 seeds) vs 3"
    # A rerun still short of the end is left out of the final comparison (three seeds a side finished) and counts
    # at the steps it reached.
    second["arms"]["w8g8@s19"].update(curve=[[10, 4.98]], complete=False)
    record = convergence_report.combine_records([first, second])
    final = record["seed_groups"]["w8g8"]["comparison"]
    assert (final["step"], final["verdict"], final["left_out"]) == (20, "inside", ["19@run2"])
    assert final["arm_mean"] == pytest.approx(statistics.fmean([4.03, 4.05, 4.01, 3.99, 4.00]))
    by_step = record["seed_groups_by_step"]["w8g8"]
    assert [(c["step"], len(c["arm_losses"])) for c in by_step] == [(10, 6), (20, 5)]
    assert by_step[0]["arm_mean"] == pytest.approx(statistics.fmean([5.01] * 3 + [4.99, 4.99, 4.98]))
    md = convergence_report.combined_markdown(record)
    assert "20 (1 stopped run left out)" in md and "w8g8 at every evaluation" in md
    assert _cells(md, "| 10 |")[:3] == ["10", "6 (3 seeds)", f"{statistics.fmean([5.01] * 3 + [4.99, 4.99, 4.98]):.4f}"]


def test_combine_compares_the_seeds_training_loss_window_by_window():
    """The paired gap of the training loss at each window over the seeds both sides recorded; a record from before
    the windows were recorded (no ``train_curve``) adds no run to them."""
    base = {17: [5.0, 4.0], 18: [5.1, 4.1], 19: [4.9, 3.9]}
    arm = {17: [5.05, 4.02], 18: [5.1, 4.12], 19: [4.95, 3.91]}
    arms = {f"{name}@s{s}": {10: 5.0, 20: w[1]} for name, by_seed in (("baseline-1r", base), ("w8g4", arm))
            for s, w in by_seed.items()}
    record = _seeded("a", arms)
    for label, r in record["arms"].items():
        windows = (base if label.startswith("baseline") else arm)[int(label[-2:])]
        r["train_curve"] = [[10, windows[0]], [20, windows[1]]]
    older = _seeded("b", {"w8g4@s20": {10: 5.0, 20: 4.0}, "baseline-1r@s20": {10: 5.0, 20: 4.0}})
    combined = convergence_report.combine_records([record, older])
    rows = combined["train_seed_groups_by_step"]["w8g4"]
    assert [(c["step"], len(c["arm_losses"])) for c in rows] == [(10, 3), (20, 3)]
    for c, i in zip(rows, (0, 1)):
        paired = [100 * (arm[s][i] / base[s][i] - 1) for s in base]
        assert c["paired_gap_pct"] == pytest.approx(statistics.fmean(paired))
    assert combined["seed_groups"]["w8g4"]["seeds"] == [17, 18, 19, 20]  # the validation loss counts seed 20
    # The second half (windows from step 10 of 20) has two windows per seed: too few for a trend.
    assert combined["train_trends"] == {}
    md = convergence_report.combined_markdown(combined)
    assert "w8g4 by its training loss, the mean of the 100 batches before each step" in md
    trend = {"from_step": 10, "to_step": 20, "seeds": 3, "slope_per_100_pct": 0.04, "ci95": [0.01, 0.07],
             "p_value": 0.03, "slopes": {}}
    md = convergence_report.combined_markdown({**combined, "train_trends": {"w8g4": trend}})
    assert ("Trend of the paired gap from step 10 to 20: +0.040% per 100 steps (3 seeds, 95% +0.010 .. +0.070, "
            "p 0.03).") in md


def test_combine_adds_later_seeds_of_both_sides_to_the_comparison():
    """Seeds 20 and 21 of the arm and of plain FSDP2, run in a later session, join seeds 17-19 of an earlier one:
    five seeds a side, the range and the paired gap over all five."""
    losses = {"baseline-1r": {17: 4.00, 18: 4.02, 19: 3.98, 20: 4.06, 21: 3.97},
              "qwd": {17: 4.03, 18: 4.04, 19: 4.00, 20: 4.02, 21: 3.99}}
    first, second = ({f"{arm}@s{s}": {10: 5.0, 20: by_seed[s]} for arm, by_seed in losses.items() for s in seeds}
                     for seeds in ((17, 18, 19), (20, 21)))
    record = convergence_report.combine_records([_seeded("a", first), _seeded("b", second)])
    group = record["seed_groups"]["qwd"]
    assert group["seeds"] == [17, 18, 19, 20, 21]
    c = group["comparison"]
    assert (c["arm_seeds"], c["baseline_seeds"]) == (5, 5)
    assert c["baseline_losses"] == pytest.approx({str(s): v for s, v in losses["baseline-1r"].items()})
    assert c["arm_mean"] == pytest.approx(statistics.fmean(losses["qwd"].values()))
    paired = [100 * (losses["qwd"][s] / losses["baseline-1r"][s] - 1) for s in losses["qwd"]]
    assert c["paired_gap_pct"] == pytest.approx(statistics.fmean(paired))
    # 4.016 lies inside 3.97 .. 4.06; seeds 17-19 alone (4.0233 against 3.98 .. 4.02) were above.
    assert c["verdict"] == "inside"


def test_combined_table_without_a_baseline_has_as_many_titles_as_cells():
    record = convergence_report.combine_records([fake_record("a", {"w8g8": {20: 4.0}}),
                                                 fake_record("b", {"w8g8": {20: 4.1}})])
    table = [line for line in convergence_report.combined_markdown(record).splitlines() if line.startswith("|")]
    assert len(table) == 4  # titles, rule, two arms
    assert len({line.count("|") for line in table}) == 1
    assert "Target" not in convergence_report.combined_markdown(record)  # no baseline, no gap to judge


def test_the_shipped_schedule_plans_at_least_10x_fewer_bytes(tmp_path, capsys):
    arms = ["zero-one-adam-deepspeed", "zero-one-adam", "zero-one-adam-4r", "zero-one-adam-4r-sync",
            "zero-one-adam-local2-4r", "zero-one-adam-local4", "zero-one-adam-rescale-4r"]
    args = convergence._parser().parse_args(["--model", "125m", "--out-dir", str(tmp_path), "--corpus",
                                             str(tmp_path / "c"), "--eval-batches", "-1", "--steps", "600", "--plan",
                                             "--arms", *arms])
    assert convergence.print_zero_one_plans(convergence_plan.make_plan(args)) == 0
    lines = dict(line.split(" (", 1) for line in capsys.readouterr().out.splitlines())
    # DeepSpeed's schedule plans the ratio its GPU run measured (11.87x, RESULTS.md).
    assert "11.87x fewer bytes" in lines["zero-one-adam-deepspeed"]
    for arm in arms[1:]:
        ratio = float(lines[arm].split("; ")[-1].split("x fewer")[0])
        assert ratio >= convergence_report.ZERO_ONE_BYTES_TARGET and "below" not in lines[arm]
        assert "exact_steps=150, onebit_steps=0" in lines[arm]  # dense variance until 0.25dur: 150 8-bit updates
    # The recipe's interval reaches 4 at three quarters of the run; local2 stops at 2, local4 reaches 4 before
    # 0.6dur; no local steps: 1.
    assert "largest_interval=4" in lines["zero-one-adam"] and lines["zero-one-adam-4r"].startswith("4 ranks")
    assert int(lines["zero-one-adam"].split("interval_4_at=")[1].split(")")[0]) == 451
    assert "largest_interval=2" in lines["zero-one-adam-local2-4r"]
    assert "largest_interval=1" in lines["zero-one-adam-4r-sync"]
    assert int(lines["zero-one-adam-local4"].split("interval_4_at=")[1].split(")")[0]) <= 360
    # The ratios the GPU runs measured (RESULTS.md): 12.69x, 12.61x, 11.13x, 13.28x, 12.89x.
    for arm, ratio in [("zero-one-adam-4r", "12.69x"), ("zero-one-adam-local2-4r", "12.61x"),
                       ("zero-one-adam-4r-sync", "11.13x"), ("zero-one-adam-local4", "13.28x"),
                       ("zero-one-adam-rescale-4r", "12.89x")]:
        assert f"{ratio} fewer bytes" in lines[arm]


def _launch_recipe(plan, arm):
    """The recipe ``arm``'s launch trains with, less the keys that name the arm (its run name and paths)."""
    from omegaconf import OmegaConf

    from composer_qsdp.recipes.train import load_recipe

    recipe = load_recipe(plan.recipe_dir / plan.arms[arm].recipe, plan.overrides(arm, 0), world_size=plan.nproc(arm))
    cfg = OmegaConf.to_container(recipe.cfg, resolve=True)
    for key in ("run_name", "save_folder", "metrics_file"):
        cfg.pop(key)
    return cfg, recipe.optimizer_kwargs


def test_lr_scales_sweep_every_arm_and_keep_the_recipe_rate_in_the_middle(tmp_path):
    common = ["--model", "125m", "--out-dir", str(tmp_path), "--corpus", str(tmp_path / "c"), "--steps", "600",
              "--eval-batches", "-1", "--arms", "ddp-baseline", "zero-one-adam"]
    base = convergence_plan.make_plan(convergence._parser().parse_args(common))
    plan = convergence_plan.make_plan(convergence._parser().parse_args([*common, "--lr-scales", "0.5", "1", "2"]))
    assert plan.args.arms == ["ddp-baseline@lr0.5x", "ddp-baseline@lr1x", "ddp-baseline@lr2x",
                              "zero-one-adam@lr0.5x", "zero-one-adam@lr1x", "zero-one-adam@lr2x"]
    # The middle arm trains with exactly the recipe's configuration (6e-4 in yamls/gpt-125m/baseline.yaml).
    for arm in ("ddp-baseline", "zero-one-adam"):
        assert _launch_recipe(plan, f"{arm}@lr1x") == _launch_recipe(base, arm)
        assert _launch_recipe(plan, f"{arm}@lr1x")[1]["lr"] == 6.0e-4
        assert plan.overrides(f"{arm}@lr1x", 0)[-1] == "optimizer.lr=0.0006"
        assert _launch_recipe(plan, f"{arm}@lr0.5x")[1]["lr"] == pytest.approx(3.0e-4, rel=1e-12)
        assert _launch_recipe(plan, f"{arm}@lr2x")[1]["lr"] == pytest.approx(1.2e-3, rel=1e-12)
    # Each arm compares with its baseline at its own rate; its directory and metrics file carry the scale.
    assert plan.arms["zero-one-adam@lr2x"].baseline == "ddp-baseline@lr2x"
    assert plan.arms["ddp-baseline@lr0.5x"].baseline == "ddp-baseline@lr0.5x"
    assert f"metrics_file={tmp_path / 'zero-one-adam@lr2x' / 'metrics-00.json'}" in plan.overrides(
        "zero-one-adam@lr2x", 0)
    # -o changes the rate that is scaled; the swept rate is applied after it.
    moved = convergence_plan.make_plan(convergence._parser().parse_args(
        [*common, "--lr-scales", "2", "-o", "optimizer.lr=1e-3"]))
    assert _launch_recipe(moved, "zero-one-adam@lr2x")[1]["lr"] == pytest.approx(2e-3, rel=1e-12)
    with pytest.raises(SystemExit, match=r"--lr-scales 0 is invalid; every scale must be > 0"):
        convergence_plan.make_plan(convergence._parser().parse_args([*common, "--lr-scales", "1", "0"]))
    with pytest.raises(SystemExit, match=r"two scales share the name @lr1x"):
        convergence_plan.make_plan(convergence._parser().parse_args([*common, "--lr-scales", "1", "1.0000001"]))


def test_lr_sweep_table_names_each_rate_and_compares_the_best(tiny_recipes, tmp_path):
    plan = plan_for(tiny_recipes, tmp_path, "--arms", "ddp-baseline", "zero-one-adam", "--lr-scales", "0.5", "1",
                    "2")
    out = plan.out_dir
    lr = plan.arms["ddp-baseline@lr1x"].lr
    losses = {"ddp-baseline@lr0.5x": 4.2, "ddp-baseline@lr1x": 4.0, "ddp-baseline@lr2x": 3.9,
              "zero-one-adam@lr0.5x": 4.1, "zero-one-adam@lr1x": 3.8, "zero-one-adam@lr2x": 3.0}
    for arm, loss in losses.items():
        # zero-one-adam@lr2x stopped at step 10: the best is taken among the arms that finished.
        write_segment(out / arm / "metrics-00.json", {10: 5.0} if arm == "zero-one-adam@lr2x" else {10: 5.0, 20: loss})
    arms = convergence_report.summarize(plan)
    assert arms["zero-one-adam@lr1x"]["gap_vs_baseline_pct"] == pytest.approx(-5.0)  # vs ddp-baseline@lr1x's 4.0
    assert arms["zero-one-adam@lr0.5x"]["gap_vs_baseline_pct"] == pytest.approx(100 * (4.1 - 4.2) / 4.2)
    assert (arms["ddp-baseline@lr2x"]["lr"], arms["ddp-baseline@lr2x"]["lr_scale"]) == (2 * lr, 2.0)
    sweep = convergence_report.lr_sweep(arms, 20)
    assert (sweep["ddp-baseline"]["best_scale"], sweep["zero-one-adam"]["best_scale"]) == ("2", "1")
    assert sweep["zero-one-adam"]["best_vs_baseline_best_pct"] == pytest.approx(100 * (3.8 - 3.9) / 3.9)
    assert sweep["ddp-baseline"]["best_vs_baseline_best_pct"] is None
    manifest = {"command": "c", "tokens": {"train": 1, "val": 1}, "input": {"files": 1, "bytes": 1, "sha256": "ab"}}
    record = convergence_report.write_results(plan, manifest, "incomplete")
    assert record["lr_sweep"] == sweep
    md = (out / f"convergence-{plan.name}.md").read_text()
    assert _cells(md, "| arm | 0.5x ") == ["arm", "0.5x", "1x", "2x", "best", "best vs its baseline's best"]
    assert _cells(md, "| zero-one-adam |") == [
        "zero-one-adam", f"4.1000 ({lr / 2:.3g})", f"3.8000 ({lr:.3g})", f"5.0000 ({2 * lr:.3g}) (partial)", "1x",
        "-2.56%"]
    assert _cells(md, "| ddp-baseline |")[-2:] == ["2x (edge of the sweep)", ""]  # the best rate may be higher
    assert "0/1 Adam (zero-one-adam@lr1x) final validation loss within 1% of DDP AdamW: -5.00% (NOT met)" in md
    csv_head = (out / f"convergence-{plan.name}.csv").read_text().splitlines()[0]
    assert csv_head == "step,tokens," + ",".join(losses)


def test_each_arm_keeps_its_color_in_both_panels():
    """An arm that stopped before the zoomed half is missing there; every other arm keeps its color in both
    panels (the color cycle used to shift, so the zoomed curves wore the legend's wrong labels)."""
    plt = pytest.importorskip("matplotlib.pyplot")
    curves = {"early": [(100, 3.6)], "a": [(100, 3.5), (300, 2.8), (600, 2.3)], "b": [(100, 3.4), (600, 2.2)]}
    record = {"settings": {"steps": 600, "global_batch": 32, "seq_len": 512, "recipe_dir": "yamls/gpt-125m"},
              "header": {"git": "abc"}, "arms": {arm: {"curve": c} for arm, c in curves.items()}}
    fig = convergence_report._figure(record, plt)
    colors = [{line.get_label(): line.get_color() for line in ax.get_lines()} for ax in fig.axes]
    plt.close(fig)
    assert set(colors[0]) == {"early", "a", "b"} and set(colors[1]) == {"a", "b"}
    assert all(colors[1][arm] == colors[0][arm] for arm in colors[1])
    assert len(set(colors[0].values())) == 3
