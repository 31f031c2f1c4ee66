"""Peak device memory per rank: plain FSDP2 and QSDP configurations against docs/presets.md's memory model.

``docs/presets.md`` ("What each preset costs in memory") gives the bytes per GPU that a preset's schemes keep beyond
plain FSDP2's own state, as a formula in ``P``, ``g`` and ``W`` (:mod:`memory_model`). This driver checks it on
launches of the project's recipes: for one recipe family (``--model 1.3b`` reads ``yamls/gpt-1.3b/``) it trains each
configuration ``--steps`` optimizer steps of ``--grad-accum`` micro-batches on ``--nproc`` ranks through ``torchrun``
(the launches of ``bench_e2e.py``, one configuration after the other), and every rank writes, through the recipes'
``rank_memory`` callback (:mod:`composer_qsdp.recipes.rank_memory`), its peak allocated device memory
(``torch.cuda.max_memory_allocated()``: the process's own caching allocator, so ranks sharing one GPU each read their
own), its QSDP handle's ``memory_bytes()`` and the parameters ``P`` of the units each side runs on.

=============================  =====================================================================================
``baseline``                   ``baseline.yaml``: plain Composer FSDP2, always measured first (every prediction
                               starts from it)
``qsdp-<preset>``              ``baseline.yaml`` with ``algorithms.qsdp.preset=<preset>``, every preset
``qsdp-<preset>-lean``         the presets with weight differences (``sdp4bit``, ``qwd-*``) or LoCo gradients
                               (``w8g4``, ``qwd-*-loco``): the reference sharded within the node
                               (``weight_scheme_options.sharded_reference=true``) and the residual on the inter-node
                               hop only (``grad_scheme=two_level_loco``), each where the preset has it:
                               ``yamls/gpt-13b/qwd-w3g3-loco-lean.yaml``'s layout
``qsdp-<preset>-host``,        the same presets with the reference (replicated, or in the lean layout sharded) and
``qsdp-<preset>-lean-host``    the residual in pinned host memory (``weight_scheme_options.reference_on_host=true``,
                               ``grad_scheme_options.residual_on_host=true``)
=============================  =====================================================================================

The QSDP configurations run at ``algorithms.qsdp.ranks_per_node=--ranks-per-node`` (``g``; without it, one node of all
ranks) with QSDP's sampled error measurement off. Per configuration and rank the report gives the measured peak,
plain FSDP2's measured peak on the same rank, the formula's extra bytes, the predicted peak (plain FSDP2's plus the
extra), measured / predicted and whether it lies within ``--tolerance`` (10%); then the measured extra (the peak less
plain FSDP2's) over the formula's, and the formula's extra over the handle's ``memory_bytes()``. A launch that runs out
of device memory is recorded as ``oom`` and the next configuration runs.

Placement: ``--shared-gpu`` is the recipes' ``shared_gpu`` key: ``auto`` (default) runs the ranks over gloo, several
per GPU, where there are fewer GPUs than ranks; ``true`` always. The launches get
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` unless the environment sets the variable: ranks sharing a GPU
cannot use each other's cached blocks, and expandable segments keep what each reserves close to what it allocates
(the allocated bytes this driver compares do not depend on it).

Optimizer: ``--optimizer recipe`` (default) trains with the recipe's own (the paper recipes' AdamW); ``--optimizer
sgd`` with plain torch SGD (momentum 0, weight decay 0: torch's is coupled, not the recipe's decoupled one; not fused,
as DTensor has no fused SGD), which keeps no state per parameter. The formula's extra bytes are the QSDP schemes' state
beyond plain FSDP2's peak and do not depend on the optimizer, so the comparison (the QSDP peak less plain FSDP2's
against the formula) holds with either; SGD shrinks plain FSDP2's own state from ``16 P / W`` bytes per rank (fp32
weights, gradients and Adam's two moments) to ``8 P / W`` (fp32 weights and gradients), which lets GPT-6.7B's 2 ranks
share one H200 (139 GiB) with a qWD preset's extra (3.02 P per rank for ``qwd-w3g3-loco``).

Resumable: each configuration's result is ``<out-dir>/<config>.json`` (the ranks' records under ``<config>.memory/``,
the launch's log and metrics file beside it); a rerun skips recorded ones (out-of-memory and failed ones too, unless
``--retry-failed``), so ``--time-budget`` can split a run into several commands. Outputs in ``--out-dir``:
``bench_memory-<family>-<N>x.md`` (header and table), ``.csv`` (one row per configuration and rank, bytes) and
``.json`` (compact: header, settings, rows).

Usage::

    python3 benchmarks/bench_memory.py --model 1.3b --nproc 4 --ranks-per-node 2 --micro-batch 2 \\
        --configs baseline qsdp-w8g8 qsdp-qwd-w3g3-loco qsdp-qwd-w3g3-loco-lean --time-budget 540 --out-dir DIR
    python3 benchmarks/bench_memory.py --model 6.7b --nproc 2 --micro-batch 1 --grad-accum 2 --steps 2 \
        --optimizer sgd --configs baseline qsdp-qwd-w3g3-loco --time-budget 400 --out-dir DIR
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import shutil
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from composer_qsdp._names import did_you_mean
from composer_qsdp.config import QSDPConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e_common as common  # noqa: E402
from bench_e2e_configs import CONFIGS as E2E_CONFIGS  # noqa: E402
from bench_e2e_configs import LAYOUT_CONFIGS, Config  # noqa: E402
from e2e_common import GIB  # noqa: E402
from memory_model import SIDES, extra_bytes, side_costs  # noqa: E402


CONFIGS: dict[str, Config] = {
    "baseline": E2E_CONFIGS["baseline"],
    **{f"qsdp-{p}": E2E_CONFIGS[f"qsdp-{p}"] for p in QSDPConfig.preset_names()},
    **{name: E2E_CONFIGS[name] for name in LAYOUT_CONFIGS},
}
DEFAULT_CONFIGS = ("baseline", "qsdp-w8g8", "qsdp-qwd-w3g3-loco", "qsdp-qwd-w3g3-loco-lean")
#: The placement the recipe entrypoint logs as hyperparameters (composer_qsdp.shared_gpu.GPUPlacement).
_PLACEMENT = ("shared_gpu", "ranks_per_gpu", "dist_backend", "visible_gpus")
#: Recipe overrides of each ``--optimizer``: ``recipe`` keeps the recipe's; ``sgd`` is torch's SGD without state
#: (momentum 0; weight decay 0, as torch's is coupled; fused off, which DTensor parameters do not support).
OPTIMIZER_OVERRIDES: dict[str, tuple[str, ...]] = {
    "recipe": (),
    "sgd": ("optimizer.name=sgd", "optimizer.momentum=0", "optimizer.weight_decay=0", "optimizer.fused=false"),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="See the module docstring and benchmarks/README.md.")
    parser.add_argument("--model", default="1.3b", help="recipe family: reads yamls/gpt-<model>/ (default 1.3b)")
    parser.add_argument("--recipe-dir", help="directory with baseline.yaml (instead of --model)")
    parser.add_argument("--configs", nargs="+", default=list(DEFAULT_CONFIGS), metavar="CONFIG",
                        help=f"configurations, in order after baseline (default: {' '.join(DEFAULT_CONFIGS)}); "
                             f"known: {', '.join(CONFIGS)}")
    parser.add_argument("--nproc", type=int, default=4, help="ranks W of every launch (default 4)")
    parser.add_argument("--ranks-per-node", type=int, help="ranks g per virtual node of the QSDP configurations, "
                                                           "dividing --nproc (default: one node of all ranks)")
    parser.add_argument("--shared-gpu", choices=("auto", "true", "false"), default="auto",
                        help="the recipes' shared_gpu key (default auto: ranks share the GPUs over gloo when there "
                             "are fewer GPUs than ranks)")
    parser.add_argument("--micro-batch", type=int, help="samples per forward/backward per rank (default: the "
                                                        "recipe's device_train_microbatch_size)")
    parser.add_argument("--grad-accum", type=int, default=2, help="micro-batches per optimizer step (default 2)")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps of each launch (default 3)")
    parser.add_argument("--optimizer", choices=tuple(OPTIMIZER_OVERRIDES), default="recipe",
                        help="recipe (default): the recipe's optimizer; sgd: torch SGD keeping no state, plain "
                             "FSDP2's own state 8 P / W bytes per rank instead of AdamW's 16 P / W (the formula's "
                             "extra does not depend on it)")
    parser.add_argument("--tolerance", type=float, default=0.10,
                        help="largest |measured / predicted - 1| reported as a match (default 0.10)")
    common.add_sweep_arguments(parser, "bench_memory", failed="failed or out of memory")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked, with ``baseline`` first in ``configs``.

    Raises:
        SystemExit: an invalid value, naming it (an unknown configuration with the closest known one).
    """
    args = _parser().parse_args(argv)
    for name in ("nproc", "grad_accum", "steps"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} {getattr(args, name)} is invalid; it must be >= 1")
    if args.micro_batch is not None and args.micro_batch < 1:
        raise SystemExit(f"--micro-batch {args.micro_batch} is invalid; it must be >= 1")
    g = args.ranks_per_node
    if g is not None and (g < 1 or args.nproc % g):
        raise SystemExit(f"--ranks-per-node {g} is invalid for --nproc {args.nproc}; it must divide it")
    if not 0 < args.tolerance < 1:
        raise SystemExit(f"--tolerance {args.tolerance} is invalid; it must lie in (0, 1) (0.10: within 10%)")
    if args.time_budget is not None and args.time_budget <= 0:
        raise SystemExit(f"--time-budget {args.time_budget} is invalid; it must be > 0 seconds")
    for name in args.configs:
        if name not in CONFIGS:
            raise SystemExit(f"unknown configuration {name!r}{did_you_mean(name, CONFIGS)}; known: "
                             f"{', '.join(CONFIGS)}")
    args.configs = list(dict.fromkeys(["baseline", *args.configs]))
    return args


@dataclass
class Plan(common.DriverPlan):
    """Everything the launches of one invocation share."""

    family: common.Family
    data: Path
    synthetic_samples: int | None  #: samples of the random-token shards to generate at ``data``; None: real data
    qsdp: dict[str, QSDPConfig]  #: each QSDP configuration as its launch's recipe builds it: the formula's input
    settings: dict[str, Any]

    @property
    def global_batch(self) -> int:
        return self.args.nproc * self.family.micro * self.args.grad_accum

    def result_path(self, config: str) -> Path:
        return self.out_dir / f"{config}.json"

    def memory_dir(self, config: str) -> Path:
        """Where the launch of ``config``'s ranks write their ``rank_memory`` records."""
        return self.out_dir / f"{config}.memory"

    def overrides(self, config: Config) -> list[str]:
        a = self.args
        topology = ([f"algorithms.qsdp.ranks_per_node={a.ranks_per_node}"]
                    if a.ranks_per_node is not None and config.name.startswith("qsdp-") else [])
        return [*common.short_run_overrides(a.steps, self.global_batch, self.family.micro, self.data,
                                            self.out_dir / f"{config.name}.metrics.json"),
                *config.overrides, *topology, f"callbacks.rank_memory.out_dir={self.memory_dir(config.name)}",
                *OPTIMIZER_OVERRIDES[a.optimizer], *a.override,
                # Last, so that no override changes the placement the settings record.
                f"shared_gpu={a.shared_gpu}"]


def make_plan(args: argparse.Namespace) -> Plan:
    """The plan of ``args``; every launch's recipe is loaded with its overrides, and each QSDP configuration is built
    and priced by the memory model, before anything runs.

    Raises:
        SystemExit: a recipe refuses its overrides, or the memory model does not cover a configuration.
    """
    from composer_qsdp.recipes.loader import build_algorithm
    from composer_qsdp.recipes.train import RecipeError

    recipe_dir = common.recipe_dir(args.model, args.recipe_dir)
    name = recipe_dir.name
    out_dir = Path(args.out_dir or common.ROOT / "runs" / "bench_memory" / f"{name}-{args.nproc}x").resolve()
    family = common.load_family(recipe_dir, args.micro_batch)
    # One spare step: running out of samples would restart the data loader in the last step.
    data, samples = common.train_data(args.data, out_dir,
                                      (args.steps + 1) * args.nproc * family.micro * args.grad_accum, family.seq_len)
    settings = {"recipe_dir": str(recipe_dir), "nproc": args.nproc, "ranks_per_node": args.ranks_per_node,
                "shared_gpu": args.shared_gpu, "micro_batch": family.micro, "grad_accum": args.grad_accum,
                "steps": args.steps, "seq_len": family.seq_len, "data": str(data), "optimizer": args.optimizer,
                "overrides": list(args.override)}
    plan = Plan(args, recipe_dir, name, out_dir, family, data, samples, {}, settings)
    for config in map(CONFIGS.__getitem__, args.configs):
        recipe = common.check_launch(config.name, recipe_dir / config.recipe, plan.overrides(config), args.nproc)
        if "qsdp" not in recipe.algorithm_kwargs:
            continue
        try:
            qsdp = build_algorithm("qsdp", recipe.algorithm_kwargs["qsdp"]).config
            side_costs(qsdp, args.nproc, qsdp.ranks_per_node or args.nproc, family.gather_bytes)
        except (RecipeError, ValueError) as err:
            raise SystemExit(f"{config.name}: {err}") from None
        plan.qsdp[config.name] = qsdp
    return plan


def launch(plan: Plan, config: Config, budget: common.Budget) -> str | None:
    """Train ``config`` and record it: its status (``ok``, ``oom``, ``failed``), or None when the budget ran out
    (the launch killed, nothing recorded) before every rank recorded every batch. A launch killed after that (in
    its exit: 4 ranks of GPT-6.7B over gloo take a while to tear down) is recorded ``ok``: the peaks are whole."""
    nproc = plan.args.nproc
    path, memory_dir = plan.result_path(config.name), plan.memory_dir(config.name)
    metrics_file, log = path.with_suffix(".metrics.json"), path.with_suffix(".log")
    shutil.rmtree(memory_dir, ignore_errors=True)  # records of an earlier attempt are not this launch's
    metrics_file.unlink(missing_ok=True)
    command = common.train_command(nproc, plan.recipe_dir / config.recipe, plan.overrides(config),
                                   launch=common.torchrun)
    env = common.launch_env()
    print(f"{config.name} on {nproc} ranks", flush=True)
    t0 = time.monotonic()
    rc = common.run(command, log, env, budget)
    record: dict[str, Any] = {"config": config.name, "nproc": nproc, "command": command,
                              "env": common.recorded_env(env), "wall_s": time.monotonic() - t0,
                              "settings": plan.settings}
    try:
        if rc not in (0, None):
            raise ValueError(f"the launch exited with status {rc}")
        files = [memory_dir / f"rank_memory-rank{r}.json" for r in range(nproc)]
        missing = [r for r, f in enumerate(files) if not f.is_file()]
        if missing:
            raise ValueError(f"rank(s) {missing} wrote no rank_memory record")
        ranks = [common.read_json(f) for f in files]
        short = [r["rank"] for r in ranks if r["batches"] < plan.args.steps]
        if short:
            raise ValueError(f"rank(s) {short} recorded fewer than {plan.args.steps} batches")
        hyper = common.read_json(metrics_file).get("hyperparameters", {})
        record.update(status="ok", ranks=ranks, placement={k: hyper.get(k) for k in _PLACEMENT})
        if rc is None:
            record["note"] = "the time budget stopped the launch after its last batch"
    except (OSError, ValueError, KeyError) as err:
        if rc is None:
            return None
        oom = rc != 0 and common.out_of_memory(log)
        record.update(status="oom" if oom else "failed", error="out of device memory" if oom else str(err),
                      log_tail=common.log_tail(log))
        print(f"  {record['error']}; log: {log}", flush=True)
    common.write_json(path, record)
    return record["status"]


def sweep(plan: Plan, budget: common.Budget) -> str:
    """Run what is not recorded; ``"complete"``, ``"incomplete"`` (budget or signal) or ``"failed"`` (a launch
    failed other than out of memory)."""
    failed = False
    try:
        for name in plan.args.configs:
            if not common.pending(plan.result_path(name), plan.args.retry_failed):
                continue
            if not budget.allows(plan.args.min_launch_s):
                print(f"time budget nearly spent ({budget.remaining():.0f} s left): rerun to continue")
                return "incomplete"
            status = launch(plan, CONFIGS[name], budget)
            if status is None:
                print("time budget spent during a launch (killed, not recorded): rerun to continue")
                return "incomplete"
            failed |= status == "failed"
    except common.Interrupted as sig:
        print(f"stopped by {sig}: finished results are kept; rerun to continue")
        return "incomplete"
    return "failed" if failed else "complete"


def collect(plan: Plan) -> dict[str, dict[str, Any]]:
    """The recorded result of each configuration of the plan, in its order (missing ones absent)."""
    return {c: common.read_json(plan.result_path(c)) for c in plan.args.configs if plan.result_path(c).is_file()}


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def rows(results: Mapping[str, dict[str, Any]], qsdp: Mapping[str, QSDPConfig], gather_bytes: int,
         tolerance: float) -> list[dict[str, Any]]:
    """One row per configuration and rank (bytes; one row per configuration without a result): the measured peak,
    plain FSDP2's on the same rank (``baseline`` of ``results``), the formula's extra bytes by side
    (:func:`memory_model.extra_bytes` of the configuration ``qsdp[name]``, 0 without QSDP), the predicted peak and
    measured / predicted with ``within`` (``|ratio - 1| <= tolerance``; None without a GPU peak or a baseline), the
    measured extra over the formula's, and the formula's extra over the handle's ``memory_bytes()`` (1 when both
    are 0)."""
    base = results.get("baseline", {})
    base_peaks = ({r["rank"]: r["peak_allocated_bytes"] for r in base["ranks"]} if base.get("status") == "ok"
                  else {})
    table = []
    for name, result in results.items():
        if result["status"] != "ok":
            table.append({"config": name, "status": result["status"], "error": result.get("error")})
            continue
        config = qsdp.get(name)
        for r in result["ranks"]:
            world = r["world_size"]
            extra = ({s: 0.0 for s in SIDES} if config is None else
                     extra_bytes(config, r["quantized_params"], world, config.ranks_per_node or world, gather_bytes))
            formula = sum(extra.values())
            peak, plain = r["peak_allocated_bytes"], base_peaks.get(r["rank"])
            predicted = None if peak is None or plain is None or name == "baseline" else plain + formula
            ratio = _ratio(peak, predicted)
            handle = r["scheme_memory_bytes"]
            measured_extra = None if predicted is None else peak - plain
            table.append({
                "config": name, "status": "ok", "rank": r["rank"], "params": r["params"],
                "peak_bytes": peak, "peak_reserved_bytes": r["peak_reserved_bytes"], "baseline_peak_bytes": plain,
                "formula_weights_bytes": extra["weights"], "formula_grads_bytes": extra["grads"],
                "formula_extra_bytes": formula, "predicted_peak_bytes": predicted, "ratio": ratio,
                "within": None if ratio is None else abs(ratio - 1) <= tolerance,
                "measured_extra_bytes": measured_extra, "extra_ratio": _ratio(measured_extra, formula),
                "handle_bytes": handle,
                "formula_vs_handle": 1.0 if formula == handle == 0 else _ratio(formula, handle),
            })
    return table


def _gib(value: float | None) -> str:
    return common.fmt(None if value is None else value / GIB, ".3f")


def _verdict(within: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "n/a"}[within]


def summary(table: list[dict[str, Any]], tolerance: float) -> list[str]:
    """One line per configuration: whether every rank's peak lies within ``tolerance`` of its prediction."""
    lines = []
    for name in dict.fromkeys(r["config"] for r in table):
        mine = [r for r in table if r["config"] == name]
        if mine[0]["status"] != "ok":
            lines.append(f"- `{name}`: {mine[0]['status']} ({mine[0]['error']})")
        elif name == "baseline":
            lines.append(f"- `{name}`: the reference of every prediction")
        elif any(r["within"] is None for r in mine):
            lines.append(f"- `{name}`: not compared (no device peak or no baseline measured)")
        else:
            worst = max(mine, key=lambda r: abs(r["ratio"] - 1))
            outside = [r["rank"] for r in mine if not r["within"]]
            verdict = (f"every rank within {tolerance:.0%}" if not outside else
                       f"rank(s) {', '.join(map(str, outside))} outside {tolerance:.0%}")
            lines.append(f"- `{name}`: {verdict}; largest deviation rank {worst['rank']}, measured / predicted "
                         f"{worst['ratio']:.3f}")
    return lines


_CSV_FIELDS = ("config", "status", "rank", "params", "peak_bytes", "peak_reserved_bytes", "baseline_peak_bytes",
               "formula_weights_bytes", "formula_grads_bytes", "formula_extra_bytes", "predicted_peak_bytes", "ratio",
               "within", "measured_extra_bytes", "extra_ratio", "handle_bytes", "formula_vs_handle", "error")


def _optimizer_text(optimizer: str) -> str:
    """The report's words for ``--optimizer``."""
    if optimizer == "recipe":
        return "the recipe's (--optimizer recipe)"
    return f"`{optimizer}` without state (--optimizer {optimizer}: {' '.join(OPTIMIZER_OVERRIDES[optimizer])})"


def render(plan: Plan, head: dict[str, str], results: dict[str, dict[str, Any]],
           status: str) -> tuple[str, str, dict[str, Any]]:
    """The markdown report, the CSV rows and the compact JSON record."""
    a, s = plan.args, plan.settings
    tol = a.tolerance
    table = rows(results, plan.qsdp, plan.family.gather_bytes, tol)
    base = results.get("baseline", {})
    # The entrypoint logs the placement of GPU launches only.
    placement = ", ".join(f"{k} {v}" for k, v in base.get("placement", {}).items() if v is not None) or "not logged"
    lines = [f"### bench_memory: {plan.name}, {a.nproc} ranks on {head['device']}", "", *common.header_lines(head),
             f"- settings: sequence {s['seq_len']}, micro-batch {s['micro_batch']}, grad accumulation "
             f"{s['grad_accum']}, {s['steps']} steps, global batch {plan.global_batch}, data `{s['data']}`, weight "
             f"gathers in {plan.family.gather_bytes}-byte elements, optimizer {_optimizer_text(s['optimizer'])}",
             f"- placement (the baseline launch's): {placement}; QSDP's ranks per node "
             f"{a.ranks_per_node or a.nproc} (--ranks-per-node)",
             f"- status: {status}", "",
             "Peaks are `torch.cuda.max_memory_allocated()` of each rank's process over its whole launch; predicted = "
             "plain FSDP2's peak on the same rank + the formula's extra (docs/presets.md). GiB = 2^30 bytes.", "",
             f"| config | rank | peak (GiB) | plain FSDP2 peak (GiB) | formula extra (GiB) | predicted (GiB) "
             f"| measured / predicted | within {tol:.0%} | measured extra (GiB) | measured / formula extra "
             "| memory_bytes() (GiB) | formula / memory_bytes() |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    fmt = common.fmt
    for r in table:
        if r["status"] != "ok":
            lines.append(f"| {r['config']} | {r['status']}: {r['error']} | | | | | | | | | | |")
            continue
        lines.append(f"| {r['config']} | {r['rank']} | {_gib(r['peak_bytes'])} | {_gib(r['baseline_peak_bytes'])} "
                     f"| {_gib(r['formula_extra_bytes'])} | {_gib(r['predicted_peak_bytes'])} "
                     f"| {fmt(r['ratio'], '.3f')} | {_verdict(r['within'])} | {_gib(r['measured_extra_bytes'])} "
                     f"| {fmt(r['extra_ratio'], '.3f')} | {_gib(r['handle_bytes'])} "
                     f"| {fmt(r['formula_vs_handle'], '.3f')} |")
    lines += ["", f"Against the tolerance ({tol:.0%}):", "", *summary(table, tol), "", "Configurations:", ""]
    configs = {}
    for name in a.configs:
        config, qsdp = CONFIGS[name], plan.qsdp.get(name)
        formula = "plain FSDP2 (the reference)"
        if qsdp is not None:
            g = qsdp.ranks_per_node or a.nproc
            costs = side_costs(qsdp, a.nproc, g, plan.family.gather_bytes)
            formula = (f"weights {costs['weights'].formula}, gradients {costs['grads'].formula} (g = {g}, W = "
                       f"{a.nproc}; P: the parameters of the units each side runs on)")
        result = results.get(name, {})
        configs[name] = {"status": result.get("status", "not run"), "formula": formula,
                         "wall_s": result.get("wall_s"), "note": result.get("note")}
        note = f" ({result['note']})" if result.get("note") else ""
        lines.append(f"- `{name}`: {config.description}; extra: {formula}{note}")
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=_CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(table)
    record = {"header": head, "settings": s, "tolerance": tol, "status": status, "configs": configs, "rows": table}
    return "\n".join(lines) + "\n", buffer.getvalue(), record


def main(argv: list[str] | None = None) -> int:
    """Measure what is missing and write the report; 0 complete (every configuration measured or out of memory), 1
    some launch failed, 3 incomplete (rerun to continue)."""
    args = parse_args(argv)
    budget = common.Budget(args.time_budget)
    plan = make_plan(args)
    common.check_settings(plan.out_dir, plan.settings)
    with common.stop_on_signals():
        synthetic = (None if plan.synthetic_samples is None else
                     (plan.data, plan.synthetic_samples, plan.family.seq_len, plan.family.vocab_size))
        status = common.sweep_or_stop(lambda: sweep(plan, budget), synthetic)
        # The header only now: querying the device earlier could leave a CUDA context of this process on the GPU
        # the ranks measure.
        head = common.header(min(args.nproc, torch.cuda.device_count()) or args.nproc)
        md, table, record = render(plan, head, collect(plan), status)
        common.write_outputs(f"bench_memory-{plan.name}-{args.nproc}x", plan.out_dir,
                             {".md": md, ".csv": table, ".json": json.dumps(record, separators=(",", ":"))})
    print(md)
    return {"complete": 0, "failed": 1, "incomplete": 3}[status]


if __name__ == "__main__":
    sys.exit(main())
