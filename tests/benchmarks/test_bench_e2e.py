"""``benchmarks/bench_e2e.py`` and its modules (configs, measure, sweep, report): the measurement arithmetic against
hand-computed references, the table's ratios, random-token shards, the planned launches of every paper recipe
family, and (slow) the whole sweep on 2 CPU processes: probe, baseline, QSDP, the compute-only bound, skipping what
is finished on a rerun."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from streaming import StreamingDataset

import bench_e2e
import bench_e2e_configs
import bench_e2e_measure
import bench_e2e_report
import bench_e2e_sweep
import e2e_common
from composer_qsdp.auto import AutoOptions

ROOT = Path(__file__).resolve().parents[2]


def hours(seconds: list[float]) -> list[list[float]]:
    """``time/train`` as train.py records it: [completed batches, cumulative hours]."""
    return [[b + 1, s / 3600.0] for b, s in enumerate(seconds)]


def test_measure_against_hand_computed_reference():
    metrics = {"metrics": {"time/train": hours([10.0, 11.0, 12.5, 13.5, 15.0])},
               "communication": {"QSDP": {side: {"sent": 500, "bf16": 1000, "native": 2000, "calls": 5}
                                          for side in ("weights", "grads", "total")}},
               "memory": {"peak_allocated_bytes": 7, "peak_reserved_bytes": 9}}
    r = bench_e2e_measure.measure(metrics, warmup=2, steps=3, tokens_per_step=1000)
    assert r["step_times_s"] == pytest.approx([1.5, 1.0, 1.5])  # batches 3, 4, 5
    assert r["step_time_s"] == pytest.approx(4.0 / 3)
    assert (r["step_time_min_s"], r["step_time_max_s"], r["step_time_median_s"]) == pytest.approx((1.0, 1.5, 1.5))
    assert r["tokens_per_s"] == pytest.approx(3000 / 4.0)
    assert r["wire_per_step"]["total"] == pytest.approx({"sent": 100, "bf16": 200, "native": 400})
    assert r["memory"] == {"peak_allocated_bytes": 7, "peak_reserved_bytes": 9}
    assert r["gc_gen2_ms"] is None  # no gc_monitor
    logged = metrics | {"metrics": metrics["metrics"] | {"gc/gen2_ms": [[b, 100.0 * b] for b in (1, 2, 4, 5)]}}
    gc_ms = bench_e2e_measure.measure(logged, warmup=2, steps=3, tokens_per_step=1000)["gc_gen2_ms"]
    assert gc_ms == [0.0, 400.0, 500.0]
    assert bench_e2e_measure.measure({"metrics": {"time/train": hours([1.0, 2.0])}}, 1, 1, 10)["wire_per_step"] is None
    assert r["speculation"] is None  # no speculative update
    # A speculative update's cumulative counts: the timed batches' (3-5) are the differences from batch 2's.
    cumulative = {"sent": [3, 6, 9, 12, 15], "hits": [0, 3, 6, 8, 11], "misses": [3, 3, 3, 4, 4],
                  "paused": [0, 0, 0, 0, 1]}
    speculating = metrics | {"metrics": metrics["metrics"] | {
        f"qsdp/speculation/{k}": [[b, float(v)] for b, v in enumerate(vs, start=1)] for k, vs in cumulative.items()}}
    assert bench_e2e_measure.measure(speculating, warmup=2, steps=3, tokens_per_step=1000)["speculation"] == {
        "sent": 9, "hits": 8, "misses": 1, "paused": 1}
    with pytest.raises(ValueError, match=r"no time/train for batch\(es\) \[3\]"):
        bench_e2e_measure.measure(metrics | {"metrics": {"time/train": hours([1.0, 2.0])}}, 1, 2, 10)


def result(nproc: int, tokens_per_s: float, wire: dict | None, status: str = "ok") -> dict:
    return {"status": status, "nproc": nproc, "tokens_per_s": tokens_per_s, "step_time_s": 1.0,
            "step_time_min_s": 0.9, "step_time_max_s": 1.1, "memory": {"peak_allocated_bytes": 2**30},
            "wire_per_step": wire, "error": "the launch exited with status 1"}


def test_rows_ratios_bound_and_targets():
    wire = {"total": {"sent": 10e9, "bf16": 20e9, "native": 40e9}}
    network = {"results": {"baseline": result(4, 100.0, None), "qsdp-w8g8": result(4, 200.0, wire),
                           "qsdp-w4g4": result(4, 300.0, {"total": {**wire["total"], "sent": 5e9}}),
                           "baseline-pure": result(4, 0.0, None, status="failed")}}
    bounds = {"compute-bound": result(1, 90.0, None)}
    rows = {r["config"]: r for r in bench_e2e_report.rows(network, bounds, nproc=4, plain_bytes_per_step=40e9)}
    assert rows["qsdp-w8g8"]["vs_baseline"] == pytest.approx(2.0)
    assert rows["qsdp-w4g4"]["vs_baseline"] == pytest.approx(3.0)
    assert rows["compute-bound"]["tokens_per_s"] == pytest.approx(360.0)  # 4 GPUs x the one-GPU run
    assert rows["qsdp-w4g4"]["of_bound"] == pytest.approx(300 / 360)
    assert rows["baseline"]["wire_gb_per_step"] == pytest.approx(40.0)  # plain FSDP2's, from the model
    assert rows["qsdp-w8g8"]["wire_vs_baseline"] == pytest.approx(0.25)
    assert rows["compute-bound"]["wire_gb_per_step"] == 0.0
    assert rows["qsdp-w8g8"]["peak_allocated_gib"] == pytest.approx(1.0)
    assert rows["baseline-pure"] == {"config": "baseline-pure", "failed": "the launch exited with status 1"}

    socket = bench_e2e_report.targets("socket", list(rows.values()))
    assert socket == ["qsdp-w8g8 tokens/s = 2.00x baseline (target >= 1.8x): met",
                      "qsdp-w4g4 tokens/s = 3.00x baseline (target >= 3.0x): met",
                      "best QSDP (qsdp-w4g4) = 83% of the compute-only bound (target >= 85%): NOT met",
                      "peak memory <= 1.10x plain FSDP2's for every preset: met"]
    assert bench_e2e_report.targets("nvlink", list(rows.values())) == [
        "qsdp-w8g8 tokens/s = 2.00x baseline (target >= 0.97x): met",
        "qsdp-w4g4 tokens/s = 3.00x baseline (target >= 0.97x): met",
        "peak memory <= 1.10x plain FSDP2's for every preset: met"]


@pytest.mark.parametrize("value, goal, percent, shown", [
    (0.987, 0.99, False, "0.987x"),  # 0.99x would read as met
    (0.9899, 0.99, False, "0.9899x"),
    (0.994, 0.99, False, "0.99x"),
    (1.83, 1.8, False, "1.83x"),
    (0.798, 0.80, True, "79.8%"),
    (0.7996, 0.80, True, "79.96%"),
    (0.81, 0.80, True, "81%"),
    (0.64, 0.85, True, "64%"),
])
def test_target_lines_never_print_a_missed_goal_as_reached(value, goal, percent, shown):
    assert bench_e2e_report._shown(value, goal, percent) == shown


def test_ddp_rows_compare_with_the_ddp_baseline_and_bound():
    zoa_wire = {side: {"sent": 1e9, "bf16": 8e9, "native": 16e9} for side in ("weights", "grads", "total")}
    network = {"results": {"baseline": result(2, 50.0, None), "ddp-baseline": result(2, 100.0, None),
                           "zero-one-adam": result(2, 250.0, zoa_wire)}}
    bounds = {"compute-bound": result(1, 60.0, None), "ddp-compute-bound": result(1, 150.0, None)}
    rows = {r["config"]: r for r in bench_e2e_report.rows(network, bounds, nproc=2, plain_bytes_per_step=1e9)}
    assert rows["zero-one-adam"]["vs_baseline"] == pytest.approx(2.5)  # against ddp-baseline, not FSDP's
    assert rows["zero-one-adam"]["of_bound"] == pytest.approx(250 / 300)  # against 2 x the DDP one-GPU run
    assert rows["ddp-baseline"]["wire_gb_per_step"] == pytest.approx(16.0)  # DDP's fp32 all-reduce
    assert rows["zero-one-adam"]["wire_vs_baseline"] == pytest.approx(1 / 16)
    assert rows["baseline"]["of_bound"] == pytest.approx(50 / 120) and rows["baseline"]["wire_gb_per_step"] == 1.0
    assert bench_e2e_report.targets("socket", list(rows.values())) == [
        "zero-one-adam tokens/s = 2.50x ddp-baseline (target >= 2.0x): met"]


def test_measure_takes_zero_one_adams_bytes_from_the_timed_window():
    counts = {side: {"sent": 30, "bf16": 45, "native": 90, "calls": 1} for side in ("weights", "grads", "total")}
    per_batch = [[1, 24], [2, 0], [3, 6]]
    metrics = {"metrics": {"time/train": hours([1.0, 2.0, 3.0]), "zero_one_adam/bytes_sent": per_batch},
               "communication": {"ZeroOneAdamDDP": counts}}
    wire = bench_e2e_measure.measure(metrics, 1, 2, 10)["wire_per_step"]  # warm-up: batch 1 (its fp32 all-reduce)
    assert wire["total"] == pytest.approx({"sent": 3, "bf16": 15, "native": 30})
    assert wire["grads"]["sent"] == pytest.approx(3) and wire["weights"]["sent"] == pytest.approx(10)


def test_measure_takes_qsdps_bytes_from_the_timed_steps():
    """A qWD launch's first step sends the full-precision keyframe: the timed steps' bytes leave it out, and the
    launch's average (every step, as the communication report counts) stays beside them."""
    counts = {"weights": {"sent": 120, "bf16": 60, "native": 60, "calls": 3},
              "grads": {"sent": 30, "bf16": 60, "native": 120, "calls": 3},
              "total": {"sent": 150, "bf16": 120, "native": 180, "calls": 6}}
    per_batch = {"qsdp/weights/bytes_sent": [[1, 100], [2, 8], [3, 12]],
                 "qsdp/weights/bytes_bf16": [[1, 20], [2, 20], [3, 20]],
                 "qsdp/grads/bytes_sent": [[1, 10], [2, 10], [3, 10]],
                 "qsdp/grads/bytes_bf16": [[1, 20], [2, 20], [3, 20]]}
    metrics = {"metrics": {"time/train": hours([1.0, 2.0, 3.0]), **per_batch}, "communication": {"QSDP": counts}}
    r = bench_e2e_measure.measure(metrics, 1, 2, 10)  # warm-up: batch 1, the keyframe
    assert r["wire_per_step"]["weights"] == pytest.approx({"sent": 10, "bf16": 20, "native": 20})
    assert r["wire_per_step"]["grads"] == pytest.approx({"sent": 10, "bf16": 20, "native": 40})
    assert r["wire_per_step"]["total"] == pytest.approx({"sent": 20, "bf16": 40, "native": 60})
    assert r["wire_per_step_launch"]["total"] == pytest.approx({"sent": 50, "bf16": 40, "native": 60})
    gap = {**per_batch, "qsdp/grads/bytes_sent": [[1, 10], [3, 10]]}  # batch 2 unlogged: no silent zero
    partial = bench_e2e_measure.measure(metrics | {"metrics": {"time/train": hours([1.0, 2.0, 3.0]), **gap}}, 1, 2, 10)
    assert partial["wire_per_step"]["total"] == pytest.approx({"sent": 50, "bf16": 40, "native": 60})
    assert "wire_per_step_launch" not in partial


@pytest.mark.parametrize("model", ["125m", "350m"])
def test_zero_one_adam_windows_time_the_regime_they_name(model, tmp_path):
    from composer_qsdp.optim import ZeroOneSchedule
    from composer_qsdp.recipes.train import load_recipe

    configs = ["ddp-baseline", "zero-one-adam", "zero-one-adam-1bit", "ddp-compute-bound"]
    args = bench_e2e.parse_args(["--model", model, "--nproc", "2", "--out-dir", str(tmp_path),
                                           "--configs", *configs])
    plan = bench_e2e_sweep.make_plan(args)
    assert plan.synthetic_samples == (65 + 1) * 2 * plan.micro  # the longest window, zero-one-adam's
    for name in ("zero-one-adam", "zero-one-adam-1bit"):
        config = bench_e2e_configs.CONFIGS[name]
        overrides = plan.overrides(config, 2, tmp_path / "m.json")
        warmup, steps = config.window
        assert f"max_duration={warmup + steps}ba" in overrides
        options = load_recipe(plan.recipe_dir / config.recipe, overrides).algorithm_kwargs["zero_one_adam"]
        schedule = ZeroOneSchedule(*(options[k] for k in ("var_freeze_step", "var_update_scaler",
                                                          "local_step_scaler", "local_step_clipper")))
        timed = [schedule.advance() for _ in range(warmup + steps)][warmup:]
        assert not any(s.update_variance for s in timed)  # no fp32 all-reduce in the window
        if name == "zero-one-adam":  # the steady state: local steps, one sync per 16 of them
            assert all(s.local for s in timed) and [s.step for s in timed if s.sync] == [49, 65]
            assert schedule.local_step_interval == 16
        else:
            assert all(s.sync and not s.local for s in timed)
    base = plan.overrides(bench_e2e_configs.CONFIGS["ddp-baseline"], 2, tmp_path / "m.json")
    assert f"max_duration={args.warmup + args.steps}ba" in base and not any(o.startswith("algorithms.") for o in base)


def test_random_token_shards_are_seeded_and_reused(tmp_path):
    out = e2e_common.random_token_shards(tmp_path / "a", samples=10, seq_len=16, vocab_size=100)
    dataset = StreamingDataset(local=str(out), split="train", shuffle=False)
    tokens = np.stack([dataset[i]["tokens"] for i in range(dataset.num_samples)])
    assert tokens.shape == (10, 16) and tokens.dtype == np.uint16 and tokens.max() < 100
    assert len(np.unique(tokens)) > 50  # spread over the vocabulary, not a constant
    again = e2e_common.random_token_shards(tmp_path / "b", samples=10, seq_len=16, vocab_size=100)
    assert (again / "train" / "shard.00000.mds").read_bytes() == (out / "train" / "shard.00000.mds").read_bytes()
    stamp = (out / "train" / "index.json").stat().st_mtime_ns
    e2e_common.random_token_shards(out, samples=10, seq_len=16, vocab_size=100)
    assert (out / "train" / "index.json").stat().st_mtime_ns == stamp


@pytest.mark.parametrize("model", ["125m", "350m", "1.3b"])
def test_every_paper_family_plans_valid_launches(model, tmp_path):
    from composer_qsdp.recipes.loader import build_algorithm
    from composer_qsdp.recipes.train import load_recipe

    args = bench_e2e.parse_args(["--model", model, "--nproc", "4", "--out-dir", str(tmp_path),
                                           "--configs", *bench_e2e_configs.CONFIGS, "--ranks-per-node", "2"])
    plan = bench_e2e_sweep.make_plan(args)  # loads every configuration's recipe with its overrides
    micro = plan.settings["micro_batch"]
    assert micro == {"125m": 16, "350m": 8, "1.3b": 16}[model]  # the recipe's device_train_microbatch_size
    assert plan.seq_len == 2048 and plan.global_batch(4) == 4 * micro and plan.global_batch(1) == micro
    qsdp = plan.overrides(bench_e2e_configs.CONFIGS["qsdp-w8g8"], 4, tmp_path / "m.json")
    base = plan.overrides(bench_e2e_configs.CONFIGS["baseline"], 4, tmp_path / "m.json")
    assert "algorithms.qsdp.error_sample_interval=0" in qsdp and not any("qsdp" in o for o in base)
    for needed in ("max_duration=13ba", "data.eval_split=null", "save_folder=null",
                   f"global_train_batch_size={4 * micro}"):
        assert needed in base
    hpz = plan.overrides(bench_e2e_configs.CONFIGS["qsdp-tlq-hs-hpz"], 4, tmp_path / "m.json")
    assert {"algorithms.qsdp.preset=tlq-hs", "algorithms.qsdp.ranks_per_node=2",
            "fsdp.reshard_after_forward=2"} <= set(hpz)
    assert "algorithms.qsdp.ranks_per_node=2" in qsdp and "fsdp.reshard_after_forward=2" not in qsdp
    # policy=auto decides and re-checks within 2 x 4 steps, then a keyframe and a compiling step: they stay untimed
    # (10 timed steps after them).
    auto = plan.overrides(bench_e2e_configs.CONFIGS["qsdp-auto"], 4, tmp_path / "m.json")
    assert {"algorithms.qsdp.policy=auto", "algorithms.qsdp.error_sample_interval=0", "max_duration=20ba"} <= set(auto)
    assert plan.window(bench_e2e_configs.CONFIGS["qsdp-auto"]) == (10, 10)
    # qsdp-auto-3bit and -4bit: the same launch with opt-in candidates named, which reach AutoOptions; the plain
    # qsdp-auto launch gets the defaults (w8g8's sides).
    three, four = bench_e2e_configs.CONFIGS["qsdp-auto-3bit"], bench_e2e_configs.CONFIGS["qsdp-auto-4bit"]
    assert plan.window(four) == plan.window(three) == (10, 10)
    defaults = bench_e2e_configs.DEFAULT_CONFIGS
    assert "qsdp-auto-3bit" in defaults and "qsdp-auto-4bit" not in defaults
    three_overrides, four_overrides = (plan.overrides(c, 4, tmp_path / "m.json") for c in (three, four))
    assert set(auto) < set(three_overrides) and set(auto) < set(four_overrides)
    for overrides, expected in ((three_overrides, (("off", "w8", "qwd3"), ("off", "g8", "g3loco"))),
                                (four_overrides, (("off", "w8", "qwd4"), ("off", "g8", "g4"))),
                                (auto, (("off", "w8"), ("off", "g8")))):
        kwargs = load_recipe(plan.recipe_dir / four.recipe, overrides, world_size=4).algorithm_kwargs["qsdp"]
        options = build_algorithm("qsdp", kwargs).config.auto_options
        assert (options.weight_candidates, options.grad_candidates) == expected
    with pytest.raises(SystemExit, match="-hpz configurations reshard to the node: pass --ranks-per-node"):
        bench_e2e_sweep.make_plan(bench_e2e.parse_args(["--model", model, "--nproc", "4", "--out-dir", str(tmp_path),
                                                        "--configs", "qsdp-zeropp-hpz"]))


def test_settings_of_one_directory_cannot_be_mixed(tmp_path, tiny_recipes):
    parse, make_plan = bench_e2e.parse_args, bench_e2e_sweep.make_plan
    plan = make_plan(parse(["--recipe-dir", str(tiny_recipes), "--nproc", "2", "--out-dir", str(tmp_path)]))
    e2e_common.check_settings(plan.out_dir, plan.settings)
    e2e_common.check_settings(plan.out_dir, plan.settings)  # same settings: fine
    other = make_plan(parse(["--recipe-dir", str(tiny_recipes), "--nproc", "2", "--out-dir", str(tmp_path),
                             "--micro-batch", "2"]))
    with pytest.raises(SystemExit, match="other settings \\(data, micro_batch: "):
        e2e_common.check_settings(other.out_dir, other.settings)


def test_network_environments(monkeypatch):
    monkeypatch.setenv("NCCL_NET", "Socket")
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    nvlink, socket = bench_e2e_configs.network_env("nvlink"), bench_e2e_configs.network_env("socket")
    assert "NCCL_NET" not in nvlink and nvlink["NCCL_NVLS_ENABLE"] == "0"
    assert {k: socket[k] for k in bench_e2e_configs._NETWORK_VARS} == {
        "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_NET": "Socket", "NCCL_SOCKET_IFNAME": "lo"}


def test_bad_arguments_are_named(tmp_path):
    with pytest.raises(SystemExit, match="--warmup 0 is invalid"):
        bench_e2e.main(["--nproc", "2", "--warmup", "0"])
    with pytest.raises(SystemExit, match="recipe directory .*nothing.* does not exist"):
        bench_e2e.main(["--recipe-dir", str(tmp_path / "nothing"), "--nproc", "2"])
    with pytest.raises(SystemExit, match="holds no train/index.json"):
        bench_e2e.main(["--model", "125m", "--nproc", "2", "--data", str(tmp_path)])
    with pytest.raises(SystemExit, match="--profile needs --warmup 4 or more"):
        bench_e2e.main(["--nproc", "2", "--warmup", "3", "--profile"])


def test_profile_records_a_warm_up_batch_an_untimed_one_follows(tmp_path):
    plan = bench_e2e_sweep.make_plan(bench_e2e.parse_args(
        ["--model", "1.3b", "--nproc", "4", "--warmup", "4", "--profile", "--out-dir", str(tmp_path)]))
    metrics_file = tmp_path / "socket" / "qsdp-w8g8.metrics.json"
    overrides = plan.overrides(bench_e2e_configs.CONFIGS["qsdp-w8g8"], 4, metrics_file)
    assert "callbacks.step_profile.start=3" in overrides and "callbacks.step_profile.batches=1" in overrides
    assert f"callbacks.step_profile.out_dir={tmp_path / 'socket' / 'qsdp-w8g8.profile'}" in overrides
    bound = plan.overrides(bench_e2e_configs.CONFIGS["compute-bound"], 1, tmp_path / "compute-bound.metrics.json")
    assert f"callbacks.step_profile.out_dir={tmp_path / 'compute-bound.profile'}" in bound


# ------------------------------------------------------------------------------------------------------- slow
def sweep(tiny_recipes, out, *extra):
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_e2e.py"), "--recipe-dir", str(tiny_recipes),
               "--nproc", "2", "--network", "nvlink", "--probe-mb", "1", "--warmup", "1", "--steps", "3",
               "--out-dir", str(out), "--min-launch-s", "0", *extra]
    return subprocess.run(command, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=900)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_cpu_sweep_of_the_ddp_configs(tiny_recipes, tmp_path):
    out = tmp_path / "e2e"
    configs = ("ddp-baseline", "zero-one-adam", "zero-one-adam-1bit", "ddp-compute-bound")
    run = sweep(tiny_recipes, out, "--configs", *configs)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    record = json.loads((out / f"bench_e2e-{tiny_recipes.name}-2x.json").read_text())
    rows = {r["config"]: r for r in record["tables"]["nvlink"]}
    assert set(rows) == set(configs) and all("failed" not in r for r in rows.values())
    assert rows["ddp-compute-bound"]["gpus"] == 1 and rows["zero-one-adam"]["of_bound"] is not None
    # The tiny GPT's default bucket is 64 elements: 1 + 32/64 bits per element where the fp32 all-reduce sends 32.
    assert 15 < 1 / rows["zero-one-adam-1bit"]["wire_vs_baseline"] < 22  # a 1-bit sync every timed step
    assert 300 < 1 / rows["zero-one-adam"]["wire_vs_baseline"] < 400  # 2 syncs in 32 timed steps
    results = record["networks"]["nvlink"]["results"]
    assert len(results["zero-one-adam"]["step_times_s"]) == 32 and len(results["ddp-baseline"]["step_times_s"]) == 3


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_cpu_sweep_measures_every_config_and_skips_finished_ones(tiny_recipes, tmp_path):
    out = tmp_path / "e2e"
    first = sweep(tiny_recipes, out, "--configs", "baseline", "qsdp-w8g8")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    finished = {p: p.stat().st_mtime_ns for p in (out / "nvlink").glob("*.log")}
    assert {p.name for p in finished} == {"nccl_probe.log", "baseline.log", "qsdp-w8g8.log"}

    # The configs named again: only the missing ones run.
    second = sweep(tiny_recipes, out, "--configs", "baseline", "qsdp-w8g8", "qsdp-w4g4", "qsdp-auto", "compute-bound")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in finished} == finished
    assert "[nvlink] qsdp-w4g4" in second.stdout and "[nvlink] baseline on" not in second.stdout

    record = json.loads((out / f"bench_e2e-{tiny_recipes.name}-2x.json").read_text())
    rows = {r["config"]: r for r in record["tables"]["nvlink"]}
    assert list(rows) == ["baseline", "qsdp-w8g8", "qsdp-w4g4", "qsdp-auto", "compute-bound"]
    results = record["networks"]["nvlink"]["results"]
    for name in ("baseline", "qsdp-w8g8", "qsdp-w4g4"):
        # tokens/s recomputed from the run's own metrics file: 3 timed steps of 2 x 4 samples x 64 tokens.
        wall = json.loads((out / "nvlink" / f"{name}.metrics.json").read_text())["metrics"]["time/train"]
        seconds = (wall[3][1] - wall[0][1]) * 3600
        assert results[name]["tokens_per_s"] == pytest.approx(3 * 8 * 64 / seconds)
        assert results[name]["memory"] is None  # CPU
        # Start-up: the entrypoint's phases from the same metrics file, listed under the table.
        logged = json.loads((out / "nvlink" / f"{name}.metrics.json").read_text())["hyperparameters"]
        assert results[name]["startup_s"]["total"] == logged["startup/total_s"] > 0
        assert list(results[name]["startup_s"]) == ["recipe", "imports", "process_group", "data", "model",
                                                    "trainer", "total"]
    bound = record["compute_bounds"]["compute-bound"]
    assert bound["nproc"] == 1 and bound["global_batch"] == 4 and bound["tokens_per_step"] == 4 * 64
    assert rows["compute-bound"]["tokens_per_s"] == pytest.approx(2 * bound["tokens_per_s"])
    # Bytes: the same collectives in every FSDP run, whose counted unquantized bytes equal plain FSDP2's as the
    # benchmark computes them from the model; fp32 on CPU, so 8-bit codes (+64 bits per 1024-element bucket) are
    # 32 / 8.06 = 3.97x fewer bytes, 4-bit codes 32 / 4.06 = 7.9x.
    native = {n: results[n]["wire_per_step"]["total"]["native"] for n in ("qsdp-w8g8", "qsdp-w4g4")}
    assert native["qsdp-w8g8"] == native["qsdp-w4g4"] == rows["baseline"]["wire_gb_per_step"] * 1e9
    assert 3.9 < 1 / rows["qsdp-w8g8"]["wire_vs_baseline"] < 4.0
    assert 7.5 < 1 / rows["qsdp-w4g4"]["wire_vs_baseline"] < 8.0
    probe = record["networks"]["nvlink"]["probe"]
    assert [r["op"] for r in probe["rows"]] == ["all_reduce", "all_gather"] and all(
        r["busbw_gbps"] > 0 for r in probe["rows"])
    assert rows["qsdp-w8g8"]["step_time_median_s"] == pytest.approx(
        statistics.median(results["qsdp-w8g8"]["step_times_s"]))
    md = (out / f"bench_e2e-{tiny_recipes.name}-2x.md").read_text()
    assert "| compute-bound | 1 (x2) |" in md and "- git: `" in md and "- command: `" in md
    table = [line for line in md.splitlines() if line.startswith("| ") and "tokens/s" not in line
             and line.split("|")[1].strip() in rows]
    assert len(table) == len(rows) and all(line.count("|") == 13 for line in table)  # 12 cells, median included
    median_ms = round(rows["qsdp-w8g8"]["step_time_median_s"] * 1e3)
    assert next(line for line in table if line.startswith("| qsdp-w8g8 ")).split("|")[7].strip() == str(median_ms)
    assert "status: complete" in md
    assert re.search(r"Start-up before the first batch .*: baseline \d+ \(\d+( \+ \d+){5}\); qsdp-w8g8 ", md)


def test_ranks_sharing_a_gpu_get_no_throughput(monkeypatch, tmp_path, tiny_recipes):
    monkeypatch.setattr(bench_e2e.torch.cuda, "device_count", lambda: 1)
    with pytest.raises(SystemExit, match=r"--nproc 2 needs a GPU per process, 1 visible: .* not a network measurement"):
        bench_e2e_sweep.make_plan(bench_e2e.parse_args(["--recipe-dir", str(tiny_recipes), "--nproc", "2",
                                                        "--out-dir", str(tmp_path)]))


def test_every_launch_refuses_shared_gpus(tmp_path, tiny_recipes):
    plan = bench_e2e_sweep.make_plan(bench_e2e.parse_args(["--recipe-dir", str(tiny_recipes), "--nproc", "2",
                                                           "--out-dir", str(tmp_path), "-o", "shared_gpu=true"]))
    overrides = plan.overrides(bench_e2e_configs.CONFIGS["baseline"], 2, tmp_path / "m.json")
    assert overrides[-1] == "shared_gpu=false"  # after the user's overrides: the last value wins


def test_every_preset_has_a_configuration_on_the_baseline_recipe():
    from composer_qsdp.config import QSDPConfig

    for preset in QSDPConfig.preset_names():
        config = bench_e2e_configs.CONFIGS[f"qsdp-{preset}"]
        assert config.recipe == "baseline.yaml" and f"algorithms.qsdp.preset={preset}" in config.overrides
        assert f"qsdp-{preset}" in bench_e2e_configs.DEFAULT_CONFIGS


def test_plain_fsdp2_bytes_pad_each_parameter_to_the_ranks():
    import torch.nn as nn

    model = nn.Sequential(nn.Linear(5, 7), nn.LayerNorm(6))  # weights [7, 5] and [6]; biases [7] and [6]
    # Padded to 4 ranks: 8 x 5 + 8 + 8 + 8 = 64 elements; per micro-batch 3/4 of two bf16 gathers and one fp32
    # reduce-scatter of them.
    assert bench_e2e_measure.plain_fsdp2_bytes(model, 4, gather_bytes=2) == 3 * 64 * (2 + 2 + 4) // 4
    assert bench_e2e_measure.plain_fsdp2_bytes(model, 1, gather_bytes=2) == 0


def test_profile_table_names_the_host_ranges_that_hold_the_idle_time():
    def batch(n, idle, optimizer):
        return {"batch": n, "wall_ms": 600.0, "by_category": {"matmul": 200.0}, "communication_busy": 300.0,
                "compute_busy": 300.0, "exposed_communication": 100.0, "overlapped_communication": 200.0,
                "gpu_idle": idle, "idle_by_range": {"Optimizer.step#AdamW.step": optimizer, "(no range)": 10.0},
                "host_syncs": {"cudaMemcpy": [3, 1.5]}, "top": []}

    record = {"per_batch": [batch(3, 150.0, 120.0), batch(4, 170.0, 140.0)],
              "scheme_memory_bytes": {"weights": 0, "grads": 0}}
    summary = bench_e2e_measure.profile_summary(record)
    assert summary["gpu_idle"] == pytest.approx(160.0)
    assert summary["idle_by_range_ms"] == pytest.approx({"Optimizer.step#AdamW.step": 130.0, "(no range)": 10.0})
    line = bench_e2e_report.profile_lines([{"config": "baseline", "profile": summary}])[-1]
    assert "| 160 | Optimizer.step#AdamW.step 130, (no range) 10 | 3 |" in line


def test_auto_is_timed_and_profiled_only_after_it_settles():
    """policy=auto may re-decide at the end of step 2 x warmup_steps: the next step is a keyframe and the one after
    it compiles the new difference kernels, so neither is timed, nor profiled."""
    auto = bench_e2e_configs.CONFIGS["qsdp-auto"]
    settled = 2 * AutoOptions().warmup_steps + 2
    assert bench_e2e_configs.window(auto, bench_e2e.parse_args(["--steps", "4"])) == (settled, 4)
    profiled = bench_e2e.parse_args(["--steps", "4", "--profile"])  # --warmup defaults to 4 with --profile
    assert profiled.warmup == 4
    warmup, _ = bench_e2e_configs.window(auto, profiled)
    assert warmup - 1 == settled + 1  # the profiled batch: the first one after settling
    assert bench_e2e_configs.window(bench_e2e_configs.CONFIGS["qsdp-w8g8"], profiled) == (4, 4)


def test_gc_lines_name_the_timed_steps_that_held_full_collections():
    table = [{"config": "baseline", "gc_gen2_ms": [0.0, 0.0]}, {"config": "qsdp-auto", "gc_gen2_ms": [0.0, 412.4]},
             {"config": "compute-bound", "gc_gen2_ms": None}]
    assert bench_e2e_report.gc_lines(table)[1].endswith("timed step: ms): qsdp-auto 2: 412")
    assert bench_e2e_report.gc_lines(table[:1])[1].endswith("none")
    assert bench_e2e_report.gc_lines(table[2:]) == []


def test_startup_lines_list_each_launch_by_phase():
    phases = {"recipe": 13.2, "imports": 0.1, "process_group": 1.4, "total": 14.7}
    table = [{"config": "baseline", "startup_s": phases}, {"config": "compute-bound", "startup_s": None}]
    assert bench_e2e_report.startup_lines(table) == [
        "", "Start-up before the first batch (s, process 0; the recipe entrypoint's phases: recipe, imports, "
            "process_group): baseline 15 (13 + 0 + 1)"]
    assert bench_e2e_report.startup_lines(table[1:]) == []


def test_the_memory_layouts_are_configurations_of_both_benchmarks(tmp_path):
    """qsdp-<preset>-lean / -host / -lean-host exist for the presets with weight differences only, run only when
    named, are the same configurations in bench_memory (whose peaks they then pair with a step time), and install
    the layout they name."""
    import bench_memory

    from composer_qsdp.recipes.loader import build_algorithm
    from composer_qsdp.recipes.train import load_recipe

    layouts = bench_e2e_configs.LAYOUT_CONFIGS
    assert {"qsdp-qwd-w3g3-loco-lean", "qsdp-qwd-w3g3-loco-lean-host", "qsdp-sdp4bit-host", "qsdp-w8g4-host"} <= set(
        layouts)
    assert not any(name.startswith(("qsdp-w8g8", "qsdp-zeropp", "qsdp-tlq-hs", "qsdp-w4g4", "qsdp-w8g4-paper"))
                   for name in layouts)
    assert not set(layouts) & set(bench_e2e_configs.DEFAULT_CONFIGS)
    assert all(bench_memory.CONFIGS[name] == bench_e2e_configs.CONFIGS[name] for name in layouts)
    names = ["qsdp-qwd-w3g3-loco-lean", "qsdp-qwd-w3g3-loco-lean-host", "qsdp-sdp4bit-host", "qsdp-w8g4-lean-host"]
    plan = bench_e2e_sweep.make_plan(bench_e2e.parse_args(["--model", "1.3b", "--nproc", "4", "--out-dir",
                                                           str(tmp_path), "--ranks-per-node", "2", "--configs",
                                                           *names]))
    for name in names:
        config = bench_e2e_configs.CONFIGS[name]
        recipe = load_recipe(plan.recipe_dir / config.recipe, plan.overrides(config, 4, tmp_path / "m.json"),
                             world_size=4)
        qsdp = build_algorithm("qsdp", recipe.algorithm_kwargs["qsdp"]).config
        weights, loco = qsdp.weights.scheme_options, qsdp.grads.scheme in ("loco", "two_level_loco")
        differences = qsdp.weights.scheme == "difference"
        assert qsdp.ranks_per_node == 2 and differences == (not name.startswith("qsdp-w8g4"))
        if differences:
            assert weights.sharded_reference == ("-lean" in name)
            assert weights.reference_on_host == name.endswith("-host")
        assert (qsdp.grads.scheme == "two_level_loco") == (loco and "-lean" in name)
        if loco:
            assert qsdp.grads.scheme_options.residual_on_host == name.endswith("-host")
