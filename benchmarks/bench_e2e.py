"""End-to-end training throughput: plain Composer FSDP2 against every QSDP preset and policy=auto, from the
project's recipes, on the GPUs of one host, on NVLink and on an emulated slow network, with a compute-only bound.

One command runs, for one recipe family (``--model 1.3b`` reads ``yamls/gpt-1.3b/``), every configuration
through ``torchrun`` (``torchrun --standalone --nproc-per-node=N -m composer_qsdp.recipes.train RECIPE key=value
...``, the ranks a ``composer -n N`` launch would start, without its own import of Composer:
``e2e_common.torchrun``):

=======================  ===================================================================================
``baseline``             ``baseline.yaml``: plain Composer FSDP2 (full sharding; the recipes' DEFAULT mixed
                         precision all-gathers bf16 weights and reduce-scatters fp32 gradients)
``qsdp-<preset>``        ``baseline.yaml`` with ``algorithms.qsdp.preset=<preset>``, one configuration for each
                         name of ``QSDPConfig.preset_names()`` (``qsdp-w8g8``, ``qsdp-qwd-w4g3-loco``, ...);
                         ``--ranks-per-node K`` splits the host into virtual nodes for them
                         (``algorithms.qsdp.ranks_per_node=K``); ``qsdp-tlq-hs-hpz`` / ``qsdp-zeropp-hpz`` (only
                         when named) also set ``fsdp.reshard_after_forward=K`` (ZeRO++'s hpZ; K below the GPUs);
                         ``qsdp-<preset>-twin`` (only when named) also sets ``algorithms.qsdp.separate_grad_group=
                         true``: the gradient collectives on a second NCCL communicator, beside the weight gathers;
                         ``qsdp-<preset>-ahead`` (only when named; the presets with weight differences) also sets
                         ``algorithms.qsdp.speculative_update=true``: each unit's next update sent in the backward;
                         ``qsdp-<preset>-lean``, ``-host``, ``-lean-host`` (only when named; the presets with weight
                         differences or LoCo gradients) keep the qWD reference sharded within the node and the LoCo
                         residual on the inter-node hop only, or both in pinned host memory, or both, each where
                         the preset has it (``bench_memory.py`` measures their memory with the same overrides)
``qsdp-auto``            ``baseline.yaml`` with ``algorithms.qsdp.policy=auto``: QSDP's bandwidth-aware policy
                         picks off or 8 bits (its default candidates, ``w8g8``'s sides) per unit and side from
                         what it measures; it decides and
                         re-checks within its first ``2 x warmup_steps`` (8) steps, and a re-decision there costs a
                         keyframe step and a compiling one, so its untimed warm-up is at least 10 (12 with
                         ``--profile``)
``qsdp-auto-3bit``       ``qsdp-auto`` with ``algorithms.qsdp.auto_options.weight_candidates=[off,w8,qwd3]`` and
                         ``...grad_candidates=[off,g8,g3loco]``: the opt-in 3-bit weight differences and 3-bit
                         LoCo gradients offered too; the same untimed warm-up
``qsdp-auto-4bit``       (only when named) ``qsdp-auto`` with ``...weight_candidates=[off,w8,qwd4]`` and
                         ``...grad_candidates=[off,g8,g4]``: the opt-in 4-bit weight differences and 4-bit
                         stochastic gradients offered too; the same untimed warm-up
``compute-bound``        ``baseline.yaml`` on ONE GPU with the same micro-batch and per-GPU batch: FSDP2 over a
                         single rank sends nothing between GPUs, so this is the per-GPU compute (and optimizer,
                         here over all parameters instead of 1/N) without communication; N x its tokens/s bounds
                         the N-GPU runs. Measured once, it serves every network.
``compute-bound-layer``  (only when named; for models whose weights and optimizer state do not fit one GPU, GPT-6.7B
                         on 80 GB) one transformer block's forward + backward timed on one GPU at the run's
                         micro-batch (with activation checkpointing, as the recipe sets it: the recomputed forward
                         included) times the layers, plus the embedding, final norm, head and loss (timed as a
                         one-block model less one block), plus the recipe's optimizer step over 1/N of the
                         parameters; N x the tokens/s of that step. It leaves out the memory traffic of FSDP's
                         unsharded copies, so it is a slightly optimistic bound.
``baseline-pure``        (only when named) ``baseline.yaml`` with ``fsdp.mixed_precision=PURE``: bf16 gradient
                         reduce-scatters too
=======================  ===================================================================================

Plain data parallelism (only when named in ``--configs``; the families with ``ddp-baseline.yaml`` and
``zero-one-adam.yaml``, e.g. ``--model 125m`` and ``350m``), each compared with ``ddp-baseline`` and its own bound:

======================  ====================================================================================
``ddp-baseline``        ``ddp-baseline.yaml``: Composer DDP, the recipe's AdamW, an fp32 all-reduce every step
``zero-one-adam``       ``zero-one-adam.yaml`` in its steady state: variance frozen after step 16, local steps
                        with the interval at its cap, one 1-bit synchronization every 16 steps; timed over 32
                        steps (two synchronizations) after 33
``zero-one-adam-1bit``  ``zero-one-adam.yaml`` between variance updates: a 1-bit synchronization every step;
                        timed over steps 32-62, between the variance updates of steps 31 and 63
``ddp-compute-bound``   ``ddp-baseline.yaml`` on ONE GPU: the model and optimizer alone; N x its tokens/s
======================  ====================================================================================

0/1 Adam's configurations time their own windows (the schedule must have reached the regime they measure) instead
of ``--warmup``/``--steps``.

Each launch trains ``--warmup`` + ``--steps`` batches of ``N x micro-batch x grad-accum`` samples (the recipe's
sequence length, bf16, FSDP2 full sharding) with evaluation and checkpoints off and QSDP's sampled error
measurement off (``error_sample_interval=0``: a host sync that is instrumentation, not the method). Step times
are the recipe's ``SpeedMonitor`` wall clock per batch (``time/train`` in the metrics file; Composer syncs the
host on the loss every batch) for the batches after the warm-up; tokens/s = tokens per step / mean step time.
Peak GPU memory is rank 0's ``torch.cuda.max_memory_allocated``. Each launch's start-up before its first batch is
listed under its network's table, by the recipe entrypoint's phases (recipe, imports, process group, data, model,
trainer; :mod:`composer_qsdp.recipes.startup`), and, where the recipe has the ``gc_monitor`` callback (the paper
recipes do), the full Python garbage collections of process 0 in each timed step (a full collection pauses the
process, and the other ranks wait for it). Bytes on the wire per step and rank are QSDP's byte accounting (NCCL's
convention, (W-1)/W of each collective's volume) over the timed steps: a qWD launch's first, full-precision keyframe
step is in the warm-up, as a training run pays it once. The baseline's are one definition, whatever else shares the
table: plain FSDP2's, computed from the model, ``(W-1)/W x P x (2 b + 4) x k``, where ``P`` counts the parameters with
each one's first dimension padded to a multiple of ``W`` (as FSDP2 shards them), ``b`` the bytes of the recipe's
all-gather dtype (a forward and a backward all-gather of every unit: the recipes reshard after forward), 4 the fp32
reduce-scatter, and ``k`` the micro-batches per optimizer step. "wire vs baseline" is a configuration's bytes over
that. 0/1 Adam's are those of its timed window (they change with its schedule),
against DDP's fp32 all-reduce (the ``native`` bytes of the 0/1 Adam run: ``ddp-baseline``'s).

Profile (``--profile``, which needs ``--warmup`` 4 or more): each recipe launch also records its second-to-last
warm-up batch (the last warm-up batch absorbs the profiler's shutdown, so the timing is unaffected) with ``torch.profiler`` through the recipes' ``step_profile`` callback
(:mod:`composer_qsdp.recipes.step_profile`), and the table gets, per configuration, rank 0's GPU time per step by
kernel category (matrix products, attention, QSDP's encode / decode / Hadamard kernels, copies, the rest), the
time NCCL kernels run (busy), the part of it no other kernel overlaps (exposed), the time no kernel runs (GPU idle)
with the host ranges it falls in and the host's blocking syncs, and the device memory of QSDP's weight replicas and
error-feedback residuals. The one-GPU bound is profiled the same way.

Networks (``--network``, both by default), applied to every launch and to a quick NCCL bandwidth probe
(all-reduce and all-gather bus bandwidth, nccl-tests' formulas) run first under the same environment:

* ``nvlink``: NCCL's own transport choice (NVLink/NVSwitch inside a node); the four variables below are unset.
* ``socket``: ``NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo``: every byte goes
  through TCP over loopback, an emulated slow inter-node network.

Resumable: each configuration's result is a JSON file under ``--out-dir``; a rerun skips finished ones (and
failed ones unless ``--retry-failed``), so ``--time-budget`` can cut a long sweep into several commands. The
table (markdown) and all results (JSON) go to ``--out-dir`` as ``bench_e2e-<family>-<N>x.md`` / ``.json``.

Data: random-token MDS shards of the recipe's sequence length are generated under ``--out-dir`` (speed does not
depend on the token values); ``--data DIR`` uses real shards (``python -m composer_qsdp.recipes.data.build``) instead.

Usage::

    python benchmarks/bench_e2e.py --model 1.3b                        # all GPUs, both networks, every config
    python benchmarks/bench_e2e.py --model 350m --network socket --micro-batch 16 --time-budget 500
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e_common as common  # noqa: E402
from bench_e2e_configs import CONFIGS, DEFAULT_CONFIGS, NETWORKS  # noqa: E402
from bench_e2e_report import collect, render  # noqa: E402
from bench_e2e_sweep import make_plan, sweep  # noqa: E402
from bench_e2e_workers import layer_bound_worker, probe_worker  # noqa: E402


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="See the module docstring and benchmarks/README.md.")
    parser.add_argument("--model", default="1.3b", help="recipe family: reads yamls/gpt-<model>/ (default 1.3b)")
    parser.add_argument("--recipe-dir", help="directory with baseline.yaml, qsdp-w8g8.yaml, qsdp-w4g4.yaml "
                                             "(instead of --model)")
    parser.add_argument("--network", nargs="+", choices=list(NETWORKS), default=list(NETWORKS))
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(DEFAULT_CONFIGS))
    parser.add_argument("--nproc", type=int, default=torch.cuda.device_count(),
                        help="processes (GPUs) of the FSDP runs (default: every visible GPU)")
    parser.add_argument("--micro-batch", type=int, help="samples per forward/backward per GPU (default: the "
                                                        "recipe's device_train_microbatch_size)")
    parser.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step (default 1)")
    parser.add_argument("--ranks-per-node", type=int, help="ranks per virtual node of the QSDP configurations, and "
                        "the hpZ group of the -hpz ones (default: one node of all GPUs)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed first steps (default 3; 4 with --profile)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps after the warm-up (default 10)")
    common.add_sweep_arguments(parser, "bench_e2e")
    parser.add_argument("--probe-mb", type=int, nargs="+", default=[64, 256],
                        help="NCCL probe message sizes in MB (default 64 256)")
    parser.add_argument("--profile", action="store_true", help="profile the second-to-last warm-up batch of each "
                        "recipe launch (torch.profiler) and add where the step goes to the table")
    parser.add_argument("--probe-worker", help=argparse.SUPPRESS)  # one rank of the probe (internal)
    parser.add_argument("--layer-bound-worker", help=argparse.SUPPRESS)  # compute-bound-layer's process (internal)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with ``--warmup``'s default resolved: 3, or 4 with ``--profile``."""
    args = _parser().parse_args(argv)
    if args.warmup is None:
        args.warmup = 4 if args.profile else 3
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the sweep (or one probe rank); 0 complete, 1 some launch failed, 3 incomplete (rerun to continue)."""
    args = parse_args(argv)
    if args.probe_worker:
        probe_worker(Path(args.probe_worker), args.probe_mb, warmup=2, iters=5)
        return 0
    if args.layer_bound_worker:
        layer_bound_worker(Path(args.layer_bound_worker), common.recipe_dir(args.model, args.recipe_dir) /
                           "baseline.yaml", args.micro_batch, args.nproc, warmup=3, iters=10)
        return 0
    for name in ("nproc", "grad_accum", "steps"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} {getattr(args, name)} is invalid; it must be >= 1"
                             + (" (no GPU is visible: pass --nproc for a CPU recipe)" if name == "nproc" else ""))
    if args.warmup < 1:
        raise SystemExit(f"--warmup {args.warmup} is invalid; it must be >= 1 (the first step compiles kernels "
                         "and sets up NCCL)")
    if args.profile and args.warmup < 4:
        raise SystemExit(f"--profile needs --warmup 4 or more (got {args.warmup}): it records the second-to-last "
                         "warm-up batch, after batch 1 (which compiles) and batch 2 (a weight-difference preset's first "
                         "difference, which compiles its kernels), and the last one absorbs the profiler's shutdown")
    if args.micro_batch is not None and args.micro_batch < 1:
        raise SystemExit(f"--micro-batch {args.micro_batch} is invalid; it must be >= 1")
    args.configs = list(dict.fromkeys(args.configs))
    args.network = list(dict.fromkeys(args.network))
    budget = common.Budget(args.time_budget)
    plan = make_plan(args)
    common.check_settings(plan.out_dir, plan.settings)
    with common.stop_on_signals():
        synthetic = (None if plan.synthetic_samples is None else
                     (plan.data, plan.synthetic_samples, plan.seq_len, plan.vocab_size))
        status = common.sweep_or_stop(lambda: sweep(plan, budget), synthetic)
        # The header only now: querying the device earlier could leave a CUDA context of this process on GPU 0
        # during the measurements.
        md, record = render(plan, common.header(args.nproc), collect(plan), status)
        stem = f"bench_e2e-{plan.name}-{args.nproc}x"
        common.write_outputs(stem, plan.out_dir, {".md": md, ".json": json.dumps(record, indent=1)})
    print(md)
    return {"complete": 0, "failed": 1, "incomplete": 3}[status]


if __name__ == "__main__":
    sys.exit(main())
