"""``benchmarks/bench_memory.py`` and ``benchmarks/memory_model.py``: docs/presets.md's memory formula against what
live QSDP schemes keep (4 gloo ranks as 2 nodes x 2, FSDP2 in bf16 mixed precision), and the driver's plan, launch
records (an out-of-memory launch included) and report on fabricated per-rank records."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from dist_spawn import RankInfo, run_ranks, skip_unless_backend
from sharded_mlp import IN, OUT, _train

import bench_memory
import memory_model
from composer_qsdp import apply_qsdp
from composer_qsdp.config import from_preset

GIB = 2**30
WORLD, PER_NODE = 4, 2
LEAN = {"grad_scheme": "two_level_loco", "weight_scheme_options": {"sharded_reference": True}}
LIVE_CONFIGS = {
    "w8g8": from_preset("w8g8", ranks_per_node=PER_NODE, seed=7),
    "qwd-w3g3-loco": from_preset("qwd-w3g3-loco", ranks_per_node=PER_NODE, seed=7),
    "qwd-w3g3-loco-lean": from_preset("qwd-w3g3-loco", ranks_per_node=PER_NODE, seed=7, **LEAN),
    "qwd-w3g3-loco-lean-host": from_preset(
        "qwd-w3g3-loco", ranks_per_node=PER_NODE, seed=7, grad_scheme="two_level_loco",
        weight_scheme_options={"sharded_reference": True, "reference_on_host": True},
        grad_scheme_options={"beta": 0.5, "residual_dtype": "int8", "residual_on_host": True}),
}


class EvenMLP(nn.Module):
    """Layers whose rows divide 4 ranks and whose per-rank chunks fill whole 256-element gradient buckets, so
    FSDP2 pads nothing and the formula is exact: 32 x 256 + 256 x 64 + 64 x 16 = 25,600 parameters."""

    PARAMS = IN * 256 + 256 * 64 + 64 * OUT

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1234)
        self.l1, self.l2 = nn.Linear(IN, 256, bias=False), nn.Linear(256, 64, bias=False)
        self.l3 = nn.Linear(64, OUT, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l3(torch.relu(self.l2(torch.relu(self.l1(x)))))


def _live_worker(info: RankInfo) -> dict:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    # The recipes' mixed precision: bf16 weight gathers (the qWD reference's dtype), fp32 gradient reductions.
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    out = {}
    for name, config in LIVE_CONFIGS.items():
        model = EvenMLP().to(info.device)
        for module in (model.l1, model.l2, model.l3, model):
            fully_shard(module, mesh=info.mesh(), mp_policy=policy)
        handle = apply_qsdp(model, config)
        # One step: its first gather sets the reference, its first reduce-scatter the residual.
        _train(info, model, 1, grads=False)
        out[name] = {
            "memory": handle.memory_bytes(),
            "by_side": {s: sum(getattr(u, s).memory_bytes() for u in handle.units) for s in memory_model.SIDES},
            "params": {s: sum(u.numel for u in handle.units if getattr(u, s).codec is not None)
                       for s in memory_model.SIDES},
        }
    return out


@pytest.fixture(scope="module")
def live():
    skip_unless_backend("gloo", WORLD)
    return run_ranks(_live_worker, WORLD, backend="gloo")


@pytest.mark.requires_custom_comm
@pytest.mark.parametrize("name,per_param", [("w8g8", 0.0), ("qwd-w3g3-loco", 2 + 1 + 4 / 256),
                                            ("qwd-w3g3-loco-lean", (2 + 1 + 4 / 256) / PER_NODE),
                                            ("qwd-w3g3-loco-lean-host", 0.0)])
def test_the_formula_is_what_the_live_schemes_keep_on_2_nodes_of_2(live, name, per_param):
    for rank in range(WORLD):
        measured = live[rank][name]
        assert measured["params"] == {"weights": EvenMLP.PARAMS, "grads": EvenMLP.PARAMS}
        formula = memory_model.extra_bytes(LIVE_CONFIGS[name], measured["params"], WORLD, PER_NODE, gather_bytes=2)
        assert measured["by_side"] == formula, rank
        assert measured["memory"] == sum(formula.values()) == per_param * EvenMLP.PARAMS, rank


def test_the_model_refuses_what_its_table_does_not_cover():
    with pytest.raises(ValueError, match="ranks_per_node=3 is invalid for 4 ranks"):
        memory_model.side_costs(LIVE_CONFIGS["w8g8"], 4, 3)
    with pytest.raises(ValueError, match="policy='auto' chooses its schemes while it runs"):
        memory_model.side_costs(from_preset(policy="auto"), 4, 2)
    with pytest.raises(ValueError, match="grads scheme_overrides put some units on another scheme"):
        memory_model.side_costs(from_preset("qwd-w3g3-loco", grad_scheme_overrides={"l1": "flat"}), 4, 2)


def test_residual_storage_and_topology_set_the_cost_per_parameter():
    def costs(world, per_node, **options):
        return memory_model.side_costs(from_preset("qwd-w3g3-loco", **options), world, per_node, gather_bytes=2)

    fp32 = costs(4, 2, grad_scheme_options={"residual_dtype": "float32"})["grads"]
    assert (fp32.per_param, fp32.formula) == (4.0, "4 P")
    assert costs(4, 2, grad_scheme_options={"residual_dtype": "bfloat16"})["grads"].per_param == 2.0
    one_node = costs(4, 4, **LEAN)
    assert (one_node["weights"].formula, one_node["grads"].formula) == ("2 P / 4", "0 (one node)")
    one_per_node = costs(4, 1, **LEAN)  # each node of one rank: the replicated reference and loco's residual
    assert (one_per_node["weights"].formula, one_per_node["grads"].formula) == ("2 P", "(1 + 4/256) P")
    assert memory_model.side_costs(from_preset("sdp4bit"), 4, 2, gather_bytes=4)["weights"].formula == "4 P"


# ------------------------------------------------------------------------------------------------ the driver
def test_bad_arguments_are_named():
    with pytest.raises(SystemExit, match="unknown configuration 'qwd-w3g3-loco-lean'; did you mean "
                                         "'qsdp-qwd-w3g3-loco-lean'\\?; known: baseline, qsdp-w8g8"):
        bench_memory.parse_args(["--configs", "qwd-w3g3-loco-lean"])
    with pytest.raises(SystemExit, match="--ranks-per-node 3 is invalid for --nproc 4; it must divide it"):
        bench_memory.parse_args(["--ranks-per-node", "3"])
    with pytest.raises(SystemExit, match="--tolerance 0.0 is invalid"):
        bench_memory.parse_args(["--tolerance", "0"])
    with pytest.raises(SystemExit, match="--steps 0 is invalid"):
        bench_memory.parse_args(["--steps", "0"])
    assert bench_memory.parse_args(["--configs", "qsdp-w8g8", "baseline"]).configs == ["baseline", "qsdp-w8g8"]


def test_the_lean_layout_exists_for_the_presets_with_state_between_calls_only():
    """Weight differences keep a reference and LoCo gradients a residual: a preset with either has the layouts, each
    changing only the sides that keep state."""
    lean = [name for name in bench_memory.CONFIGS if name.endswith("-lean")]
    assert lean == ["qsdp-w8g4-lean", "qsdp-sdp4bit-lean", "qsdp-qwd-w4g4-lean", "qsdp-qwd-w4g2-loco-lean",
                    "qsdp-qwd-w4g3-loco-lean", "qsdp-qwd-w3g3-loco-lean", "qsdp-qwd-w3g2-loco-lean"]
    two_level_loco = "algorithms.qsdp.grad_scheme=two_level_loco"
    assert two_level_loco not in bench_memory.CONFIGS["qsdp-sdp4bit-lean"].overrides
    host = "algorithms.qsdp.weight_scheme_options.reference_on_host=true"
    residual = "algorithms.qsdp.grad_scheme_options.residual_on_host=true"
    assert bench_memory.CONFIGS["qsdp-w8g4-lean"].overrides == (*bench_memory.CONFIGS["qsdp-w8g4"].overrides,
                                                                 two_level_loco)
    for name in lean:  # each layout also with the reference (and a LoCo residual) in host memory
        moved = (residual,) if "w8g4" in name else (host, residual) if "loco" in name else (host,)
        assert bench_memory.CONFIGS[f"{name}-host"].overrides == (*bench_memory.CONFIGS[name].overrides, *moved)
        replicated = bench_memory.CONFIGS[name.removesuffix("-lean") + "-host"]
        assert replicated.overrides == (*bench_memory.CONFIGS[name.removesuffix("-lean")].overrides, *moved)


def test_the_plan_of_the_1_3b_family(tmp_path):
    args = bench_memory.parse_args(["--model", "1.3b", "--nproc", "4", "--ranks-per-node", "2", "--micro-batch", "2",
                                    "--out-dir", str(tmp_path), "-o", "shared_gpu=false", "--shared-gpu", "true"])
    plan = bench_memory.make_plan(args)  # loads every launch's recipe and builds its QSDP configuration
    assert args.configs == list(bench_memory.DEFAULT_CONFIGS) and set(plan.qsdp) == set(args.configs[1:])
    assert plan.synthetic_samples == (3 + 1) * 4 * 2 * 2 and plan.global_batch == 16
    base = plan.overrides(bench_memory.CONFIGS["baseline"])
    assert {"max_duration=3ba", "global_train_batch_size=16", "device_train_microbatch_size=2",
            "data.eval_split=null", "save_folder=null",
            f"callbacks.rank_memory.out_dir={tmp_path / 'baseline.memory'}"} <= set(base)
    assert base[-1] == "shared_gpu=true" and not any(o.startswith("algorithms.") for o in base)
    lean = plan.qsdp["qsdp-qwd-w3g3-loco-lean"]
    assert (lean.weights.scheme, lean.grads.scheme, lean.ranks_per_node) == ("difference", "two_level_loco", 2)
    assert lean.weights.scheme_options.sharded_reference and lean.grads.scheme_options.residual_dtype == "int8"
    assert plan.qsdp["qsdp-qwd-w3g3-loco"].grads.scheme == "loco"
    assert plan.family.gather_bytes == 2  # bf16 mixed precision



def test_sgd_keeps_the_6_7b_launches_stateless_and_the_report_says_so(tmp_path):
    import e2e_common

    args = bench_memory.parse_args(["--model", "6.7b", "--nproc", "2", "--micro-batch", "1", "--steps", "2",
                                    "--optimizer", "sgd", "--configs", "qsdp-qwd-w3g3-loco",
                                    "--out-dir", str(tmp_path)])
    plan = bench_memory.make_plan(args)  # loads both launches' recipes with the SGD overrides
    assert plan.settings["optimizer"] == "sgd" and set(plan.qsdp) == {"qsdp-qwd-w3g3-loco"}
    for name in args.configs:
        config = bench_memory.CONFIGS[name]
        recipe = e2e_common.check_launch(name, plan.recipe_dir / config.recipe, plan.overrides(config), 2)
        assert recipe.cfg.optimizer.name == "sgd"
        assert recipe.optimizer_kwargs == {"lr": 1.2e-4, "momentum": 0.0, "weight_decay": 0.0, "fused": False}
    md, _, record = bench_memory.render(plan, {"device": "1 x GPU", "git": "abc1234", "command": "c"}, {}, "complete")
    assert "optimizer `sgd` without state (--optimizer sgd: optimizer.name=sgd optimizer.momentum=0" in md
    assert record["settings"]["optimizer"] == "sgd"
    recipe_default = bench_memory.parse_args(["--model", "6.7b"])
    assert recipe_default.optimizer == "recipe" and bench_memory.OPTIMIZER_OVERRIDES["recipe"] == ()

def ranks(peaks: list[int | None], params: int, handle: int) -> list[dict]:
    """Fabricated ``rank_memory`` records of one launch."""
    return [{"rank": r, "world_size": len(peaks), "batches": 3, "peak_allocated_bytes": peak,
             "peak_reserved_bytes": None if peak is None else peak + GIB, "params": params,
             "quantized_params": {"weights": params if handle else 0, "grads": params if handle else 0},
             "scheme_memory_bytes": handle, "scheme_memory_by_side": {}} for r, peak in enumerate(peaks)]


def test_rows_compare_each_rank_with_its_plain_fsdp2_peak_plus_the_formula():
    params = 2**28  # qwd-w3g3-loco keeps (3 + 4/256) P = 0.75390625 GiB
    extra = (3 + 4 / 256) * params
    results = {
        "baseline": {"status": "ok", "ranks": ranks([10 * GIB, 12 * GIB], params, 0)},
        "qsdp-qwd-w3g3-loco": {"status": "ok",
                               "ranks": ranks([10 * GIB + int(extra), int(1.2 * (12 * GIB + extra))], params,
                                              int(extra))},
        "qsdp-w8g8": {"status": "oom", "error": "out of device memory"},
    }
    qsdp = {"qsdp-qwd-w3g3-loco": from_preset("qwd-w3g3-loco")}
    table = bench_memory.rows(results, qsdp, gather_bytes=2, tolerance=0.10)
    loco = [r for r in table if r["config"] == "qsdp-qwd-w3g3-loco"]
    assert loco[0]["formula_extra_bytes"] == extra and loco[0]["formula_weights_bytes"] == 2 * params
    assert loco[0]["predicted_peak_bytes"] == 10 * GIB + extra
    assert loco[0]["ratio"] == pytest.approx(1.0) and loco[0]["within"] is True
    assert loco[0]["extra_ratio"] == pytest.approx(1.0) and loco[0]["formula_vs_handle"] == pytest.approx(1.0)
    assert loco[1]["ratio"] == pytest.approx(1.2, abs=1e-9) and loco[1]["within"] is False
    assert loco[1]["baseline_peak_bytes"] == 12 * GIB  # its own rank's baseline
    assert [r["predicted_peak_bytes"] for r in table if r["config"] == "baseline"] == [None, None]
    assert table[-1] == {"config": "qsdp-w8g8", "status": "oom", "error": "out of device memory"}
    lines = bench_memory.summary(table, 0.10)
    assert lines[1] == ("- `qsdp-qwd-w3g3-loco`: rank(s) 1 outside 10%; largest deviation rank 1, measured / "
                        "predicted 1.200")
    assert lines[2] == "- `qsdp-w8g8`: oom (out of device memory)"
    # Off the GPU (no peak) nothing is compared, but the formula still meets the handle's bytes.
    cpu = {"baseline": {"status": "ok", "ranks": ranks([None], params, 0)},
           "qsdp-qwd-w3g3-loco": {"status": "ok", "ranks": ranks([None], params, int(extra))}}
    row = bench_memory.rows(cpu, qsdp, 2, 0.10)[-1]
    assert row["ratio"] is None and row["within"] is None and row["formula_vs_handle"] == pytest.approx(1.0)


def test_the_report_in_gib_csv_in_bytes_and_compact_json(tmp_path, tiny_recipes):
    plan = bench_memory.make_plan(bench_memory.parse_args(
        ["--recipe-dir", str(tiny_recipes), "--nproc", "2", "--configs", "qsdp-qwd-w3g3-loco",
         "--out-dir", str(tmp_path)]))
    params = 2**28
    extra = plan.family.gather_bytes * params + (1 + 4 / 256) * params
    results = {"baseline": {"status": "ok", "ranks": ranks([8 * GIB, 8 * GIB], params, 0),
                            "placement": {"shared_gpu": True, "ranks_per_gpu": 2}},
               "qsdp-qwd-w3g3-loco": {"status": "ok", "ranks": ranks([9 * GIB, 10 * GIB], params, int(extra))}}
    head = {"device": "1 x GPU", "git": "abc1234", "command": "python bench_memory.py"}
    md, table, record = bench_memory.render(plan, head, results, "complete")
    ratio = 9 * GIB / (8 * GIB + extra)  # the tiny CPU recipe gathers fp32: 4 P + 1.016 P = 1.25390625 GiB
    row = next(line for line in md.splitlines() if line.startswith("| qsdp-qwd-w3g3-loco | 0 |"))
    assert row == (f"| qsdp-qwd-w3g3-loco | 0 | 9.000 | 8.000 | 1.254 | 9.254 | {ratio:.3f} | yes | 1.000 | "
                   f"{GIB / extra:.3f} | 1.254 | 1.000 |")
    assert "| qsdp-qwd-w3g3-loco | 1 | 10.000 | 8.000 | 1.254 | 9.254 | 1.081 | yes |" in md
    assert "- placement (the baseline launch's): shared_gpu True, ranks_per_gpu 2;" in md
    assert "extra: weights 4 P, gradients (1 + 4/256) P (g = 2, W = 2;" in md
    assert "- git: `abc1234`" in md and "- command: `python bench_memory.py`" in md
    parsed = list(csv.DictReader(io.StringIO(table)))
    assert [(r["config"], r["rank"]) for r in parsed] == [("baseline", "0"), ("baseline", "1"),
                                                          ("qsdp-qwd-w3g3-loco", "0"), ("qsdp-qwd-w3g3-loco", "1")]
    assert int(parsed[2]["peak_bytes"]) == 9 * GIB and float(parsed[2]["formula_extra_bytes"]) == extra
    assert parsed[3]["within"] == "True"
    again = json.loads(json.dumps(record, separators=(",", ":")))
    assert again["configs"]["qsdp-qwd-w3g3-loco"]["status"] == "ok" and len(again["rows"]) == 4


def test_an_out_of_memory_launch_is_recorded_and_the_next_configuration_runs(tmp_path, tiny_recipes, monkeypatch):
    plan = bench_memory.make_plan(bench_memory.parse_args(
        ["--recipe-dir", str(tiny_recipes), "--nproc", "2", "--steps", "1", "--out-dir", str(tmp_path),
         "--configs", "qsdp-w8g8", "qsdp-qwd-w3g3-loco", "qsdp-qwd-w3g3-loco-lean"]))
    launched = []

    def run(command, log_path, env, budget):
        """A launch: qwd-w3g3-loco runs out of memory, the lean layout fails otherwise, the others finish."""
        words = dict(w.split("=", 1) for w in command if "=" in w)
        name = Path(words["metrics_file"]).name.removesuffix(".metrics.json")
        launched.append(name)
        assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
        if name == "qsdp-qwd-w3g3-loco":
            log_path.write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
            return 1
        if name.endswith("-lean"):
            log_path.write_text("RuntimeError: something else\n")
            return 1
        out = Path(words["callbacks.rank_memory.out_dir"])
        out.mkdir(parents=True)
        for record in ranks([GIB, GIB], 1000, 0):
            (out / f"rank_memory-rank{record['rank']}.json").write_text(json.dumps(record))
        Path(words["metrics_file"]).write_text(json.dumps({"hyperparameters": {"shared_gpu": True}}))
        return 0

    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.setattr(bench_memory.common, "run", run)
    assert bench_memory.sweep(plan, bench_memory.common.Budget(None)) == "failed"  # the lean one, not the oom
    assert launched == ["baseline", "qsdp-w8g8", "qsdp-qwd-w3g3-loco", "qsdp-qwd-w3g3-loco-lean"]
    results = bench_memory.collect(plan)
    assert {n: r["status"] for n, r in results.items()} == {
        "baseline": "ok", "qsdp-w8g8": "ok", "qsdp-qwd-w3g3-loco": "oom", "qsdp-qwd-w3g3-loco-lean": "failed"}
    assert results["qsdp-qwd-w3g3-loco"]["error"] == "out of device memory"
    assert results["qsdp-qwd-w3g3-loco-lean"]["error"] == "the launch exited with status 1"
    assert results["baseline"]["placement"]["shared_gpu"] is True
    md = bench_memory.render(plan, {"device": "cpu"}, results, "failed")[0]
    assert re.search(r"\| qsdp-qwd-w3g3-loco \| oom: out of device memory \|", md)
    launched.clear()
    assert bench_memory.sweep(plan, bench_memory.common.Budget(None)) == "complete" and launched == []  # recorded
    plan.args.retry_failed = True
    bench_memory.sweep(plan, bench_memory.common.Budget(None))
    assert launched == ["qsdp-qwd-w3g3-loco", "qsdp-qwd-w3g3-loco-lean"]


def test_a_launch_the_budget_stops_after_its_last_batch_keeps_its_peaks(tmp_path, tiny_recipes, monkeypatch):
    plan = bench_memory.make_plan(bench_memory.parse_args(
        ["--recipe-dir", str(tiny_recipes), "--nproc", "2", "--steps", "2", "--out-dir", str(tmp_path),
         "--configs", "qsdp-w8g8"]))
    batches = {"baseline": 2, "qsdp-w8g8": 1}  # the budget stops both; only the baseline had trained its 2 batches

    def run(command, log_path, env, budget):
        """A launch the budget kills (None) after its ranks recorded ``batches[name]`` batches."""
        words = dict(w.split("=", 1) for w in command if "=" in w)
        name = Path(words["metrics_file"]).name.removesuffix(".metrics.json")
        out = Path(words["callbacks.rank_memory.out_dir"])
        out.mkdir(parents=True)
        for record in ranks([GIB, GIB], 1000, 0):
            record["batches"] = batches[name]
            (out / f"rank_memory-rank{record['rank']}.json").write_text(json.dumps(record))
        Path(words["metrics_file"]).write_text(json.dumps({"hyperparameters": {"shared_gpu": True}}))
        log_path.write_text("rank 0: stopped by SIGTERM after batch 2\n")
        return None

    monkeypatch.setattr(bench_memory.common, "run", run)
    assert bench_memory.sweep(plan, bench_memory.common.Budget(None)) == "incomplete"
    results = bench_memory.collect(plan)
    assert list(results) == ["baseline"] and results["baseline"]["status"] == "ok"
    assert results["baseline"]["note"] == "the time budget stopped the launch after its last batch"
    md, _, record = bench_memory.render(plan, {"device": "cpu"}, results, "incomplete")
    assert record["configs"]["baseline"]["note"] == results["baseline"]["note"]
    assert record["configs"]["qsdp-w8g8"]["status"] == "not run"
    assert "(the time budget stopped the launch after its last batch)" in md
