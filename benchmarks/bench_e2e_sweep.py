"""The end-to-end benchmark's sweep: the plan of one invocation (:class:`Plan`: the recipe family, batch, data and
every configuration's recipe overrides, checked by loading each recipe before any GPU time is spent) and the
launches: the bandwidth probe and each configuration per network, each recorded as one JSON file under the results
directory. A rerun skips what is recorded (failed launches too, unless ``--retry-failed``), so a time budget can cut
a sweep into several commands.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import e2e_common as common
from bench_e2e_configs import CONFIGS, DEFAULT_CONFIGS, Config, network_env, window
from bench_e2e_measure import measure, plain_fsdp2_bytes, profile_summary

#: The command line the sweep starts its worker processes through (its internal ``--probe-worker`` and
#: ``--layer-bound-worker`` options).
ENTRY_POINT = Path(__file__).resolve().with_name("bench_e2e.py")


@dataclass
class Plan(common.DriverPlan):
    """Everything the launches of one invocation share."""

    seq_len: int
    vocab_size: int
    micro: int
    data: Path
    synthetic_samples: int | None  #: samples of the random-token shards to generate at ``data``; None: real data
    settings: dict[str, Any]
    plain_bytes_per_step: int  #: plain FSDP2's bytes per optimizer step and rank (:func:`plain_fsdp2_bytes`)

    def global_batch(self, nproc: int) -> int:
        return nproc * self.micro * self.args.grad_accum

    def window(self, config: Config) -> tuple[int, int]:
        """(warm-up, timed) steps of ``config``."""
        return window(config, self.args)

    def overrides(self, config: Config, nproc: int, metrics_file: Path) -> list[str]:
        return [*common.short_run_overrides(sum(self.window(config)), self.global_batch(nproc), self.micro,
                                            self.data, metrics_file),
                *config.overrides, *self._topology(config), *self._profile(config, metrics_file),
                *self.args.override,
                # Last, so no override turns it off: ranks sharing a GPU over gloo measure no network.
                "shared_gpu=false"]

    def _profile(self, config: Config, metrics_file: Path) -> list[str]:
        """The ``step_profile`` callback on the second-to-last warm-up batch (``--profile``, recipe launches): past
        the first batch's compilation, and followed by an untimed batch, whose wall clock then holds the profiler's
        shutdown and summary (they took 0.6-1 s at GPT-1.3B, which a profiled last warm-up batch put into the first
        timed step)."""
        warmup = self.window(config)[0]
        if not self.args.profile or config.name == "compute-bound-layer":  # no recipe launch: a timing worker
            return []
        return [f"callbacks.step_profile.out_dir={profile_dir(metrics_file)}",
                f"callbacks.step_profile.start={warmup - 1}", "callbacks.step_profile.batches=1"]

    def _topology(self, config: Config) -> list[str]:
        """Virtual nodes for the QSDP configurations, and hpZ's reshard group."""
        k = self.args.ranks_per_node
        qsdp = [f"algorithms.qsdp.ranks_per_node={k}"] if k is not None and config.name.startswith("qsdp-") else []
        return qsdp + ([f"fsdp.reshard_after_forward={k}"] if config.hpz else [])


def profile_dir(metrics_file: Path) -> Path:
    """Where a launch's ``step_profile`` summaries go: beside its metrics file."""
    return metrics_file.with_name(metrics_file.name.removesuffix(".metrics.json") + ".profile")


def make_plan(args: argparse.Namespace) -> Plan:
    if args.ranks_per_node is None and any(CONFIGS[c].hpz for c in args.configs):
        raise SystemExit("the -hpz configurations reshard to the node: pass --ranks-per-node (below --nproc)")
    gpus = torch.cuda.device_count()
    if 0 < gpus < args.nproc:
        raise SystemExit(f"--nproc {args.nproc} needs a GPU per process, {gpus} visible: ranks sharing a GPU "
                         "(shared_gpu) time-share it and talk through host memory over gloo, so their tokens/s are "
                         "not a network measurement and this benchmark does not report them")
    recipe_dir = common.recipe_dir(args.model, args.recipe_dir)
    name = recipe_dir.name
    out_dir = Path(args.out_dir or common.ROOT / "runs" / "bench_e2e" / f"{name}-{args.nproc}x").resolve()
    family = common.load_family(recipe_dir, args.micro_batch)
    micro, seq_len, vocab = family.micro, family.seq_len, family.vocab_size
    # One spare step: running out of samples would start a new epoch (a dataloader restart) in a timed step.
    # Sized for the default configurations too, so that a sweep of some of them and a later one of the rest
    # share the data (and the output directory's settings).
    longest = max(sum(window(CONFIGS[c], args)) for c in {*DEFAULT_CONFIGS, *args.configs})
    data, samples = common.train_data(args.data, out_dir, (longest + 1) * args.nproc * micro * args.grad_accum,
                                      seq_len)
    from composer_qsdp.recipes.models import ComposerGPT

    with torch.device("meta"):
        model = ComposerGPT(family.base.model_config)
    plain = plain_fsdp2_bytes(model, args.nproc, family.gather_bytes) * args.grad_accum
    settings = {"recipe_dir": str(recipe_dir), "nproc": args.nproc, "micro_batch": micro,
                "grad_accum": args.grad_accum, "seq_len": seq_len, "warmup": args.warmup, "steps": args.steps,
                "data": str(data), "overrides": list(args.override), "ranks_per_node": args.ranks_per_node}
    plan = Plan(args, recipe_dir, name, out_dir, seq_len, vocab, micro, data, samples, settings, plain)
    # Every launch's recipe must load with its overrides, at its launch's world size, before any GPU time is spent.
    for config in map(CONFIGS.get, args.configs):
        nproc = 1 if config.single_gpu else args.nproc
        common.check_launch(config.name, recipe_dir / config.recipe,
                            plan.overrides(config, nproc, out_dir / "check.json"), nproc)
    return plan


def result_path(plan: Plan, network: str, config: Config) -> Path:
    """The JSON file that records ``config``'s result on ``network``."""
    # A compute-only bound sends nothing between GPUs: one measurement serves every network.
    return plan.out_dir / (f"{config.name}.json" if config.single_gpu else f"{network}/{config.name}.json")


def _run_probe(plan: Plan, network: str, budget: common.Budget) -> bool | None:
    """The bandwidth probe of ``network``; True when measured, False when it failed, None when out of time."""
    path = plan.out_dir / network / "nccl_probe.json"
    raw = path.with_name("nccl_probe.raw.json")
    raw.unlink(missing_ok=True)
    command = [*common.torchrun(plan.args.nproc), str(ENTRY_POINT), "--probe-worker", str(raw),
               "--probe-mb", *map(str, plan.args.probe_mb)]
    env = network_env(network)
    print(f"[{network}] NCCL bandwidth probe", flush=True)
    rc = common.run(command, path.with_suffix(".log"), env, budget)
    if rc is None:
        return None
    ok = rc == 0 and raw.is_file()
    record = {"status": "ok" if ok else "failed", "env": common.recorded_env(env),
              **(common.read_json(raw) if ok else {"log_tail": common.log_tail(path.with_suffix(".log"))})}
    common.write_json(path, record)
    return ok


def _run_config(plan: Plan, network: str, config: Config, budget: common.Budget) -> bool | None:
    """One configuration; True when measured, False when it failed, None when out of time."""
    path = result_path(plan, network, config)
    nproc = 1 if config.single_gpu else plan.args.nproc
    metrics_file = path.with_suffix(".metrics.json")
    metrics_file.unlink(missing_ok=True)
    if config.name == "compute-bound-layer":
        command = [sys.executable, str(ENTRY_POINT), "--layer-bound-worker", str(metrics_file),
                   "--recipe-dir", str(plan.recipe_dir), "--micro-batch", str(plan.micro), "--nproc",
                   str(plan.args.nproc)]
    else:
        command = common.train_command(nproc, plan.recipe_dir / config.recipe,
                                       plan.overrides(config, nproc, metrics_file), launch=common.torchrun)
    env = network_env(network)
    print(f"[{network}] {config.name} on {nproc} process(es)", flush=True)
    t0 = time.monotonic()
    rc = common.run(command, path.with_suffix(".log"), env, budget)
    if rc is None:
        return None
    record: dict[str, Any] = {"config": config.name, "network": None if config.single_gpu else network,
                              "nproc": nproc, "global_batch": plan.global_batch(nproc), "command": command,
                              "env": common.recorded_env(env), "wall_s": time.monotonic() - t0,
                              "settings": plan.settings}
    try:
        if rc != 0:
            raise ValueError(f"the launch exited with status {rc}")
        metrics = common.read_json(metrics_file)
        if config.name == "compute-bound-layer":
            record.update(status="ok", layer_bound=metrics, tokens_per_s=metrics["tokens_per_s"],
                          step_time_s=metrics["step_s"], step_time_min_s=metrics["step_s"],
                          step_time_max_s=metrics["step_s"], step_time_median_s=metrics["step_s"],
                          memory=metrics["memory"], scheme_memory_bytes=None)
        else:
            record.update(status="ok", **measure(metrics, *plan.window(config),
                                                  plan.global_batch(nproc) * plan.seq_len))
            summary = profile_dir(metrics_file) / "step_profile-rank0.json"
            if summary.is_file():
                record["profile"] = profile_summary(common.read_json(summary))
    except (OSError, ValueError, KeyError) as err:
        record.update(status="failed", error=str(err), log_tail=common.log_tail(path.with_suffix(".log")))
        print(f"  failed: {err}; log: {path.with_suffix('.log')}", flush=True)
    common.write_json(path, record)
    return record["status"] == "ok"


def sweep(plan: Plan, budget: common.Budget) -> str:
    """Run what is missing; ``"complete"``, ``"incomplete"`` (budget or signal) or ``"failed"`` (some launch)."""
    failed = False
    try:
        for network in plan.args.network:
            todo = [(plan.out_dir / network / "nccl_probe.json", None)]
            todo += [(result_path(plan, network, CONFIGS[c]), CONFIGS[c]) for c in plan.args.configs]
            for path, config in todo:
                if not common.pending(path, plan.args.retry_failed):
                    continue
                if not budget.allows(plan.args.min_launch_s):
                    print(f"time budget nearly spent ({budget.remaining():.0f} s left): rerun to continue")
                    return "incomplete"
                outcome = (_run_probe(plan, network, budget) if config is None
                           else _run_config(plan, network, config, budget))
                if outcome is None:
                    print("time budget spent during a launch (killed, not recorded): rerun to continue")
                    return "incomplete"
                failed |= not outcome
    except common.Interrupted as sig:
        print(f"stopped by {sig}: finished results are kept; rerun to continue")
        return "incomplete"
    return "failed" if failed else "complete"
