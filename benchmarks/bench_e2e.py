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
                         when named) also set ``fsdp.reshard_after_forward=K`` (ZeRO++'s hpZ; K below the GPUs)
``qsdp-auto``            ``baseline.yaml`` with ``algorithms.qsdp.policy=auto``: QSDP's bandwidth-aware policy
                         picks off / 8 / 4 bits / qWD per unit and side from what it measures; it decides and
                         re-checks within its first ``2 x warmup_steps`` (8) steps, and a re-decision there costs a
                         keyframe step and a compiling one, so its untimed warm-up is at least 10 (12 with
                         ``--profile``)
``qsdp-auto-loco``       (only when named) ``qsdp-auto`` with ``algorithms.qsdp.auto_options.weight_candidates=
                         [off,w8,qwd4,qwd3]`` and ``...grad_candidates=[off,g8,g4,g3loco]``: the policy may also
                         pick 3-bit weight differences and 3-bit LoCo gradients (opt-in candidates, not measured
                         end to end yet); the same untimed warm-up
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
process, and the other ranks wait for it). Bytes on the wire per step and rank are QSDP's
byte accounting (NCCL's convention, (W-1)/W of each collective's volume). The baseline's are one definition,
whatever else shares the table: plain FSDP2's, computed from the model, ``(W-1)/W x P x (2 b + 4) x k``, where ``P``
counts the parameters with each one's first dimension padded to a multiple of ``W`` (as FSDP2 shards them), ``b``
the bytes of the recipe's all-gather dtype (a forward and a backward all-gather of every unit: the recipes reshard
after forward), 4 the fp32 reduce-scatter, and ``k`` the micro-batches per optimizer step. "wire vs baseline" is a
configuration's bytes over that. 0/1 Adam's are those of its timed window (they change with its schedule),
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
import os
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from composer_qsdp.auto import AutoOptions
from composer_qsdp.config import QSDPConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e_common as common  # noqa: E402

#: NCCL settings of each network; ``nvlink`` unsets the variables ``socket`` sets.
NETWORKS: dict[str, dict[str, str]] = {
    "nvlink": {},
    "socket": {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_NET": "Socket", "NCCL_SOCKET_IFNAME": "lo"},
}
_NETWORK_VARS = frozenset(NETWORKS["socket"])


@dataclass(frozen=True)
class Config:
    """One measured configuration.

    Attributes:
        name: its name in ``--configs`` and the table.
        recipe: file name in the recipe directory.
        overrides: extra ``key=value`` overrides of this configuration.
        single_gpu: runs on one process (the compute-only bound) instead of all.
        description: what it is, for the table's legend.
        baseline: the configuration its tokens/s and wire bytes are compared with.
        bound: its compute-only bound.
        window: ``(warm-up, timed)`` steps of its own instead of ``--warmup``/``--steps``.
    """

    name: str
    recipe: str
    overrides: tuple[str, ...]
    single_gpu: bool
    description: str
    baseline: str = "baseline"
    bound: str = "compute-bound"
    window: tuple[int, int] | None = None
    hpz: bool = False  #: reshard after forward to the (virtual) node: ``fsdp.reshard_after_forward=--ranks-per-node``
    min_warmup: int = 0  #: untimed steps at least (``--warmup`` when larger)


_NO_ERROR_SAMPLING = ("algorithms.qsdp.error_sample_interval=0",)
#: Presets whose gradients take the two-level path, which hpZ (a secondary shard within the node) complements.
_HPZ_PRESETS = ("tlq-hs", "zeropp")
preset_names = QSDPConfig.preset_names
#: Steps after which policy=auto has settled, all untimed: its warm-up, as many steps again to re-check, and, after a
#: re-decision at that boundary, a keyframe step and the first weight-difference step (which compiles its kernels).
AUTO_SETTLED = 2 * AutoOptions().warmup_steps + 2
CONFIGS: dict[str, Config] = {c.name: c for c in (
    Config("baseline", "baseline.yaml", (), False,
           "plain Composer FSDP2 in the recipe's mixed precision (paper recipes: bf16 weight all-gathers, fp32 "
           "gradient reduce-scatters)"),
    # Every preset, on the baseline recipe: the same model, batch and schedule, only the communication differs.
    *(Config(f"qsdp-{preset}{'-hpz' * hpz}", "baseline.yaml", (f"algorithms.qsdp.preset={preset}",
                                                                *_NO_ERROR_SAMPLING), False,
             f"QSDP preset {preset}{' with hpZ (reshard_after_forward = ranks per node)' * hpz}", hpz=hpz)
      for preset in preset_names() for hpz in ((False, True) if preset in _HPZ_PRESETS else (False,))),
    Config("qsdp-auto", "baseline.yaml", ("algorithms.qsdp.policy=auto", *_NO_ERROR_SAMPLING), False,
           "QSDP policy=auto: measures the network and each unit's compute over the untimed steps, then picks "
           "off / 8 / 4 bits / qWD per unit and side", min_warmup=AUTO_SETTLED),
    Config("qsdp-auto-loco", "baseline.yaml", (*common.AUTO_LOCO, *_NO_ERROR_SAMPLING), False,
           "QSDP policy=auto with the opt-in 3-bit candidates too: 3-bit weight differences (qwd3) and 3-bit "
           "LoCo gradients (g3loco)", min_warmup=AUTO_SETTLED),
    Config("compute-bound", "baseline.yaml", (), True,
           "baseline recipe on 1 GPU, same micro-batch and per-GPU batch: no inter-GPU traffic; tokens/s x N"),
    Config("compute-bound-layer", "baseline.yaml", (), True,
           "per-layer bound for models whose optimizer state does not fit one GPU: one transformer block's "
           "forward + backward timed on 1 GPU at the run's micro-batch (recomputed forward included with "
           "activation checkpointing) x layers, plus the embedding, head and loss, plus the optimizer step over "
           "1/N of the parameters; tokens/s x N"),
    Config("baseline-pure", "baseline.yaml", ("fsdp.mixed_precision=PURE",), False,
           "plain Composer FSDP2 with bf16 gradient reduce-scatters (fsdp.mixed_precision=PURE)"),
    *(Config(name, recipe, overrides, single, description, "ddp-baseline", "ddp-compute-bound", window)
      for name, recipe, overrides, single, description, window in (
        ("ddp-baseline", "ddp-baseline.yaml", (), False,
         "plain Composer DDP (the recipe's AdamW): every step all-reduces the fp32 gradients", None),
        ("zero-one-adam", "zero-one-adam.yaml",
         ("algorithms.zero_one_adam.var_freeze_step=16", "algorithms.zero_one_adam.local_step_scaler=1",
          "algorithms.zero_one_adam.local_step_clipper=16"), False,
         "0/1 Adam, local steps at interval 16: one 1-bit sync per 16 steps (steps 34-65)", (33, 32)),
        ("zero-one-adam-1bit", "zero-one-adam.yaml",
         ("algorithms.zero_one_adam.var_freeze_step=100000", "algorithms.zero_one_adam.var_update_scaler=1"),
         False, "0/1 Adam between variance updates: a 1-bit sync every step (steps 32-62)", (31, 31)),
        ("ddp-compute-bound", "ddp-baseline.yaml", (), True,
         "ddp-baseline recipe on 1 GPU, same micro-batch and per-GPU batch: no inter-GPU traffic; tokens/s x N",
         None),
    )),
)}
#: The default sweep: plain FSDP2, every preset (one node: no hpZ), policy=auto and the 1-GPU bound.
DEFAULT_CONFIGS = ("baseline", *(f"qsdp-{preset}" for preset in preset_names()), "qsdp-auto", "compute-bound")
#: The bounds a configuration's "of compute bound" can use, in order of preference.
BOUNDS = ("compute-bound", "compute-bound-layer")

#: The project's throughput targets (stated for GPT-1.3B); reported, never asserted.
SOCKET_TARGETS = {"qsdp-w8g8": 1.8, "qsdp-w4g4": 3.0}  # tokens/s vs baseline
SOCKET_BOUND_TARGET = 0.85  # best QSDP tokens/s vs the compute-only bound
#: Of the compute-only bound on the emulated network: the lossless presets (round 4) and policy=auto.
SOCKET_PRESET_BOUND_TARGETS = {"qsdp-qwd-w4g3-loco": 0.80, "qsdp-qwd-w3g3-loco": 0.80, "qsdp-qwd-w3g2-loco": 0.80,
                               "qsdp-auto": 0.85, "qsdp-auto-loco": 0.85}
NVLINK_TARGET = 0.97  # every preset's tokens/s vs baseline
NVLINK_AUTO_TARGET = 0.99
MEMORY_TARGET = 1.10  # every preset's peak memory vs plain FSDP2's
ZERO_ONE_SOCKET_TARGET = 2.0  # 0/1 Adam tokens/s vs DDP AdamW on the emulated network (issue 13, GPT-125M/350M)

GB = 1e9
GIB = 2**30


# ---------------------------------------------------------------------------------------------- bandwidth probe
def probe_worker(out: Path, sizes_mb: list[int], warmup: int, iters: int) -> None:
    """One rank of the bandwidth probe (run under ``torchrun``): all-reduce and all-gather of each size,
    median wall time per rank, the slowest rank's median; rank 0 writes ``out`` (JSON rows)."""
    import torch.distributed as dist

    gpu = torch.cuda.is_available()
    if gpu:
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    world = dist.get_world_size()
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    rows = []
    try:
        for size_mb in sizes_mb:
            numel = size_mb * 10**6 // 4 // world * world  # fp32 elements, divisible by the world size
            buf = torch.ones(numel, device=device)
            shard = torch.ones(numel // world, device=device)
            cases = {"all_reduce": (lambda: dist.all_reduce(buf), 2 * (world - 1) / world),
                     "all_gather": (lambda: dist.all_gather_into_tensor(buf, shard), (world - 1) / world)}
            for op, (fn, bus_factor) in cases.items():
                for _ in range(warmup):
                    fn()
                times = []
                for _ in range(iters):
                    sync()
                    t0 = time.perf_counter()
                    fn()
                    sync()
                    times.append(time.perf_counter() - t0)
                slowest = torch.tensor([statistics.median(times)], device=device)
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                seconds = float(slowest)
                rows.append({"op": op, "size_mb": numel * 4 / 10**6, "time_ms": seconds * 1e3,
                             "busbw_gbps": numel * 4 / seconds * bus_factor / GB})
        if dist.get_rank() == 0:
            common.write_json(out, {"world": world, "rows": rows})
    finally:
        dist.destroy_process_group()


# ----------------------------------------------------------------------------------------------- measurements
def _timed(metrics: dict[str, Any], name: str, warmup: int, total: int) -> list[float] | None:
    """Metric ``name`` of each timed batch (``warmup + 1 .. total``), or None where the run did not log it."""
    values = {int(b): float(v) for b, v in metrics["metrics"].get(name, [])}  # key b: logged as batch b ends
    return [values.get(b, 0.0) for b in range(warmup + 1, total + 1)] if values else None


def measure(metrics: dict[str, Any], warmup: int, steps: int, tokens_per_step: int) -> dict[str, Any]:
    """Throughput, memory and wire bytes of one finished launch from its metrics file (``train.py``'s JSON).

    Args:
        metrics: the parsed metrics file.
        warmup: batches excluded from the timing (the first ones).
        steps: timed batches after them.
        tokens_per_step: tokens of one optimizer step, all ranks together.

    Raises:
        ValueError: the file lacks the wall clock of some batch (the run did not finish).
    """
    total = warmup + steps
    # time/train: SpeedMonitor's cumulative training wall clock in hours, logged as batch b ends (key b).
    ends = {int(b): float(hours) * 3600.0 for b, hours in metrics["metrics"].get("time/train", [])}
    missing = [b for b in range(1, total + 1) if b not in ends]
    if missing:
        raise ValueError(f"the metrics file has no time/train for batch(es) {missing[:5]}: the run did not finish "
                         f"{total} batches")
    step_times = [ends[b] - (ends[b - 1] if b > 1 else 0.0) for b in range(warmup + 1, total + 1)]
    result: dict[str, Any] = {
        "step_times_s": step_times,
        "step_time_s": statistics.fmean(step_times),
        "step_time_min_s": min(step_times),
        "step_time_max_s": max(step_times),
        # A slow emulated network stalls some steps for a while (a launch's first four steps 23% slower than its
        # last five, nothing changed): the median reads through that where the mean does not.
        "step_time_median_s": statistics.median(step_times),
        "tokens_per_step": tokens_per_step,
        "tokens_per_s": tokens_per_step * steps / sum(step_times),
        "memory": metrics.get("memory"),
        "wire_per_step": None,
        # Device memory QSDP's schemes keep between steps (weight-difference replicas), rank 0, last batch.
        "scheme_memory_bytes": (metrics["metrics"].get("qsdp/scheme_memory_bytes") or [[0, None]])[-1][1],
        # Full garbage collections of process 0 in each timed step (the gc_monitor callback), where logged.
        "gc_gen2_ms": _timed(metrics, "gc/gen2_ms", warmup, total),
        # The recipe entrypoint's phases before the first batch (composer_qsdp.recipes.startup), process 0.
        "startup_s": {k[len("startup/"):-2]: v for k, v in metrics.get("hyperparameters", {}).items()
                      if k.startswith("startup/")} or None,
    }
    reports = list(metrics.get("communication", {}).values())  # QSDP's or ZeroOneAdamDDP's byte counts
    if reports:
        # Evaluation is off, so every counted collective belongs to one of the `total` training batches.
        result["wire_per_step"] = {side: {k: sum(r[side][k] for r in reports) / total
                                          for k in ("sent", "bf16", "native")}
                                   for side in ("weights", "grads", "total")}
        # 0/1 Adam's bytes depend on the phase of its schedule: those of the timed window (it logs them per batch).
        per_batch = dict((int(b), float(v)) for b, v in metrics["metrics"].get("zero_one_adam/bytes_sent", []))
        if per_batch:
            window = statistics.fmean(per_batch[b] for b in range(warmup + 1, total + 1))
            result["wire_per_step"]["grads"]["sent"] = result["wire_per_step"]["total"]["sent"] = window
    return result


def plain_fsdp2_bytes(model: torch.nn.Module, nproc: int, gather_bytes: int, reduce_bytes: int = 4) -> int:
    """Bytes one rank of plain FSDP2 puts on the wire per micro-batch: ``(W-1)/W`` of a forward and a backward
    all-gather of every parameter in ``gather_bytes`` per element and of an fp32 (``reduce_bytes``) reduce-scatter
    of its gradient, each parameter's first dimension padded to a multiple of ``W = nproc`` as FSDP2 shards it."""
    padded = 0
    for p in model.parameters():
        rows = p.shape[0] if p.dim() else 1
        padded += -(-rows // nproc) * nproc * (p.numel() // rows if rows else 0)
    return (nproc - 1) * padded * (2 * gather_bytes + reduce_bytes) // nproc


def layer_bound_worker(out: Path, recipe_path: Path, micro: int, nproc: int, warmup: int, iters: int) -> None:
    """The ``compute-bound-layer`` measurement on this process's GPU (see the module docstring); writes ``out``."""
    import dataclasses

    from composer_qsdp.recipes.loader import build_optimizer
    from composer_qsdp.recipes.models import ComposerGPT
    from composer_qsdp.recipes.train import load_recipe

    recipe = load_recipe(recipe_path, ["data.remote=null", "data.local=unused"])
    config, cfg = recipe.model_config, recipe.cfg
    checkpointing = bool(cfg.fsdp and cfg.fsdp.activation_checkpointing)
    device = torch.device("cuda", 0)
    seq = config.max_seq_len
    one_block = ComposerGPT(dataclasses.replace(config, n_layers=1)).to(device, torch.bfloat16)
    block = one_block.model.blocks[0]
    tokens = torch.randint(0, config.vocab_size, (micro, seq), device=device)

    def timed(fn) -> float:
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / iters

    x = torch.randn(micro, seq, config.d_model, device=device, dtype=torch.bfloat16, requires_grad=True)

    def block_step() -> None:
        with torch.autocast("cuda", torch.bfloat16):
            y = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) if checkpointing else block(x)
        y.backward(torch.ones_like(y))

    def model_step() -> None:
        with torch.autocast("cuda", torch.bfloat16):
            loss = one_block.loss(one_block(tokens), tokens)
        loss.backward()

    block_s, model_s = timed(block_step), timed(model_step)
    # The optimizer step of one rank's shard: fp32 parameters of 1/N of every tensor of the full model.
    with torch.device("meta"):
        full = ComposerGPT(config)
    shard = [torch.zeros(-(-p.numel() // nproc), device=device) for p in full.parameters()]
    for t in shard:
        t.grad = torch.randn_like(t)
    optimizer = build_optimizer(recipe, shard)
    optimizer_s = timed(optimizer.step)
    step_s = model_s + (config.n_layers - 1) * block_s + optimizer_s
    common.write_json(out, {"block_s": block_s, "one_block_model_s": model_s, "optimizer_s": optimizer_s,
                            "layers": config.n_layers, "activation_checkpointing": checkpointing,
                            "step_s": step_s, "tokens_per_s": micro * seq / step_s,
                            "memory": {"peak_allocated_bytes": torch.cuda.max_memory_allocated()}})


# ------------------------------------------------------------------------------------------------------ data
def random_token_shards(out: Path, samples: int, seq_len: int, vocab_size: int) -> Path:
    """MDS shards (a ``train`` split) of ``samples`` uniformly random token sequences, in the files of
    :func:`composer_qsdp.recipes.data.write_token_shards`; reused when ``out`` already exists. Seeded: the same
    arguments give the same tokens."""
    from streaming import MDSWriter

    from composer_qsdp.recipes.data.integrity import SHARD_HASHES
    from composer_qsdp.recipes.data.shards import TOKENS_COLUMN, TRAIN_SPLIT, shards_exist

    if shards_exist(out, (TRAIN_SPLIT,)):
        return out
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    rng = np.random.default_rng(0)
    with MDSWriter(out=str(tmp / "train"), columns={TOKENS_COLUMN: f"ndarray:uint16:{seq_len}"},
                   hashes=list(SHARD_HASHES), size_limit="64mb") as writer:
        for _ in range(samples):
            writer.write({TOKENS_COLUMN: rng.integers(0, vocab_size, seq_len, dtype=np.uint16)})
    tmp.rename(out)
    return out


# --------------------------------------------------------------------------------------------------- the sweep
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
        return [f"max_duration={sum(self.window(config))}ba",
                f"global_train_batch_size={self.global_batch(nproc)}", f"device_train_microbatch_size={self.micro}",
                "data.remote=null", f"data.local={self.data}", "data.eval_split=null", "save_folder=null",
                "load_path=null", "autoresume=false", "progress_bar=false", "log_to_console=false",
                f"metrics_file={metrics_file}",
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


def window(config: Config, args: argparse.Namespace) -> tuple[int, int]:
    """(warm-up, timed) steps of ``config``: its own window, else ``--warmup`` (at least its ``min_warmup``, and with
    ``--profile`` two more: the profiled batch after them and the one that absorbs the profiler's shutdown) and
    ``--steps``."""
    settle = config.min_warmup + (2 if config.min_warmup and args.profile else 0)
    return config.window or (max(args.warmup, settle), args.steps)


def _plan(args: argparse.Namespace) -> Plan:
    from composer_qsdp.recipes.train import RecipeError, load_recipe

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
    try:
        base = load_recipe(recipe_dir / "baseline.yaml", ["data.remote=null", "data.local=unused"])
    except RecipeError as err:
        raise SystemExit(f"recipe error: {err}") from None
    micro = args.micro_batch or base.cfg.device_train_microbatch_size
    if not micro:
        raise SystemExit("the baseline recipe sets no device_train_microbatch_size: pass --micro-batch")
    seq_len, vocab = base.model_config.max_seq_len, base.model_config.vocab_size
    samples = None
    if args.data:
        data = Path(args.data).resolve()
        if not (data / "train" / "index.json").is_file():
            raise SystemExit(f"--data {str(data)!r} holds no train/index.json (build shards with "
                             "python -m composer_qsdp.recipes.data.build)")
    else:
        # One spare step: running out of samples would start a new epoch (a dataloader restart) in a timed step.
        # Sized for the default configurations too, so that a sweep of some of them and a later one of the rest
        # share the data (and the output directory's settings).
        longest = max(sum(window(CONFIGS[c], args)) for c in {*DEFAULT_CONFIGS, *args.configs})
        samples = (longest + 1) * args.nproc * micro * args.grad_accum
        data = out_dir / f"synthetic-t{seq_len}-n{samples}"
    from composer_qsdp.recipes.models import ComposerGPT

    with torch.device("meta"):
        model = ComposerGPT(base.model_config)
    gather_bytes = 4 if base.cfg.precision == "fp32" or base.cfg.fsdp.mixed_precision == "FULL" else 2
    plain = plain_fsdp2_bytes(model, args.nproc, gather_bytes) * args.grad_accum
    settings = {"recipe_dir": str(recipe_dir), "nproc": args.nproc, "micro_batch": micro,
                "grad_accum": args.grad_accum, "seq_len": seq_len, "warmup": args.warmup, "steps": args.steps,
                "data": str(data), "overrides": list(args.override), "ranks_per_node": args.ranks_per_node}
    plan = Plan(args, recipe_dir, name, out_dir, seq_len, vocab, micro, data, samples, settings, plain)
    # Every launch's recipe must load with its overrides, at its launch's world size, before any GPU time is spent.
    for config in map(CONFIGS.get, args.configs):
        nproc = 1 if config.single_gpu else args.nproc
        try:
            load_recipe(recipe_dir / config.recipe, plan.overrides(config, nproc, out_dir / "check.json"),
                        world_size=nproc)
        except RecipeError as err:
            raise SystemExit(f"recipe error in {config.name} ({config.recipe}): {err}") from None
    return plan


def _network_env(network: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _NETWORK_VARS}
    env.update(NETWORKS[network])
    return env


def _result_path(plan: Plan, network: str, config: Config) -> Path:
    # A compute-only bound sends nothing between GPUs: one measurement serves every network.
    return plan.out_dir / (f"{config.name}.json" if config.single_gpu else f"{network}/{config.name}.json")


def _pending(path: Path, retry_failed: bool) -> bool:
    if not path.is_file():
        return True
    return retry_failed and common.read_json(path)["status"] != "ok"


def _run_probe(plan: Plan, network: str, budget: common.Budget) -> bool | None:
    """The bandwidth probe of ``network``; True when measured, False when it failed, None when out of time."""
    path = plan.out_dir / network / "nccl_probe.json"
    raw = path.with_name("nccl_probe.raw.json")
    raw.unlink(missing_ok=True)
    command = [*common.torchrun(plan.args.nproc), str(Path(__file__).resolve()), "--probe-worker", str(raw),
               "--probe-mb", *map(str, plan.args.probe_mb)]
    env = _network_env(network)
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
    path = _result_path(plan, network, config)
    nproc = 1 if config.single_gpu else plan.args.nproc
    metrics_file = path.with_suffix(".metrics.json")
    metrics_file.unlink(missing_ok=True)
    if config.name == "compute-bound-layer":
        command = [sys.executable, str(Path(__file__).resolve()), "--layer-bound-worker", str(metrics_file),
                   "--recipe-dir", str(plan.recipe_dir), "--micro-batch", str(plan.micro), "--nproc",
                   str(plan.args.nproc)]
    else:
        command = common.train_command(nproc, plan.recipe_dir / config.recipe,
                                       plan.overrides(config, nproc, metrics_file), launch=common.torchrun)
    env = _network_env(network)
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
            todo += [(_result_path(plan, network, CONFIGS[c]), CONFIGS[c]) for c in plan.args.configs]
            for path, config in todo:
                if not _pending(path, plan.args.retry_failed):
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


def profile_summary(record: dict[str, Any]) -> dict[str, Any]:
    """Mean per profiled batch (ms) of a ``step_profile`` record's kernel categories and communication overlap,
    with the scheme memory (bytes) it reports."""
    batches = record["per_batch"]
    categories = sorted({c for b in batches for c in b["by_category"]})
    mean = {c: statistics.fmean(b["by_category"].get(c, 0.0) for b in batches) for c in categories}
    keys = ("wall_ms", "communication_busy", "compute_busy", "exposed_communication", "overlapped_communication",
            "gpu_idle")
    ranges = sorted({r for b in batches for r in b["idle_by_range"]})
    idle = {r: statistics.fmean(b["idle_by_range"].get(r, 0.0) for b in batches) for r in ranges}
    return {"batches": [b["batch"] for b in batches], "by_category_ms": mean,
            **{k: statistics.fmean(b[k] for b in batches) for k in keys},
            "idle_by_range_ms": dict(sorted(idle.items(), key=lambda kv: -kv[1])),
            "host_syncs": batches[-1]["host_syncs"],
            "scheme_memory_bytes": record["scheme_memory_bytes"], "top": batches[-1]["top"]}


# ------------------------------------------------------------------------------------------------------ table
def collect(plan: Plan) -> dict[str, Any]:
    """All recorded results of this plan's networks and configurations (missing ones absent)."""
    networks = {}
    bounds = {c.name: common.read_json(plan.out_dir / f"{c.name}.json") for c in CONFIGS.values()
              if c.single_gpu and (plan.out_dir / f"{c.name}.json").is_file()}
    for network in plan.args.network:
        probe_path = plan.out_dir / network / "nccl_probe.json"
        results = {}
        for name in plan.args.configs:
            path = _result_path(plan, network, CONFIGS[name])
            if path.is_file() and not CONFIGS[name].single_gpu:
                results[name] = common.read_json(path)
        networks[network] = {"probe": common.read_json(probe_path) if probe_path.is_file() else None,
                             "results": results}
    return {"networks": networks, "compute_bounds": bounds}


def rows(network_data: dict[str, Any], bounds: dict[str, dict[str, Any]], nproc: int,
         plain_bytes_per_step: float) -> list[dict[str, Any]]:  # fmt: skip
    """Table rows of one network: each result with its ratios to its baseline and to its compute-only bound.

    ``baseline``'s wire bytes are ``plain_bytes_per_step`` (plain FSDP2's, from the model); ``ddp-baseline``'s the
    ``native`` bytes of the same job's 0/1 Adam runs (what DDP sends unquantized for the same steps). A bound's
    tokens/s is ``nproc`` times the one-GPU run's; a configuration whose own bound is missing uses the other bound
    of :data:`BOUNDS` when present.
    """
    results = {k: r for k, r in network_data["results"].items() if r["status"] == "ok"}
    for name, bound in bounds.items():
        if bound["status"] == "ok":
            results[name] = {**bound, "tokens_per_s": bound["tokens_per_s"] * nproc,
                             "wire_per_step": {"total": {"sent": 0.0}}}
    if "baseline" in results:
        results["baseline"] = {**results["baseline"], "wire_per_step": {"total": {"sent": plain_bytes_per_step}}}
    if "ddp-baseline" in results:
        native = [r["wire_per_step"]["total"]["native"] for n, r in results.items()
                  if CONFIGS[n].baseline == "ddp-baseline" and r.get("wire_per_step")
                  and "native" in r["wire_per_step"]["total"]]  # fmt: skip
        if native:
            results["ddp-baseline"] = {**results["ddp-baseline"], "wire_per_step": {"total": {"sent": native[0]}}}
    out = []
    for name, r in results.items():
        base = results.get(CONFIGS[name].baseline)
        bound = results.get(CONFIGS[name].bound)
        if bound is None and CONFIGS[name].bound in BOUNDS:
            bound = next((results[b] for b in BOUNDS if b in results), None)
        sent = r["wire_per_step"]["total"]["sent"] if r.get("wire_per_step") else None
        base_sent = base["wire_per_step"]["total"]["sent"] if base and base.get("wire_per_step") else None
        out.append({
            "config": name,
            "gpus": r["nproc"],
            "tokens_per_s": r["tokens_per_s"],
            "vs_baseline": r["tokens_per_s"] / base["tokens_per_s"] if base else None,
            "of_bound": r["tokens_per_s"] / bound["tokens_per_s"] if bound else None,
            "step_time_s": r["step_time_s"],
            "step_time_min_s": r["step_time_min_s"],
            "step_time_max_s": r["step_time_max_s"],
            "step_time_median_s": r.get("step_time_median_s"),  # None in records written before it was kept
            "peak_allocated_gib": r["memory"]["peak_allocated_bytes"] / GIB if r.get("memory") else None,
            "scheme_memory_gib": r["scheme_memory_bytes"] / GIB if r.get("scheme_memory_bytes") else None,
            "wire_gb_per_step": None if sent is None else sent / GB,
            "wire_vs_baseline": sent / base_sent if sent is not None and base_sent else None,
            "memory_vs_baseline": (r["memory"]["peak_allocated_bytes"] / base["memory"]["peak_allocated_bytes"]
                                   if base and r.get("memory") and base.get("memory") else None),
            "profile": r.get("profile"),
            "startup_s": r.get("startup_s"),
            "gc_gen2_ms": r.get("gc_gen2_ms"),
        })
    failed = {k: r for k, r in network_data["results"].items() if r["status"] != "ok"}
    failed |= {k: r for k, r in bounds.items() if r["status"] != "ok"}
    out += [{"config": k, "failed": r.get("error", "failed")} for k, r in failed.items()]
    return out


def _shown(value: float, goal: float, percent: bool = False) -> str:
    """``value`` as a target line prints it (``0.98x``, ``79%``), with more decimals where the usual rounding would
    reach a goal the value misses (``0.987x`` against 0.99, ``79.8%`` against 80%)."""
    for digits in (0, 1, 2) if percent else (2, 3, 4):
        text = f"{value:.{digits}%}" if percent else f"{value:.{digits}f}x"
        if (float(text[:-1]) / (100 if percent else 1) >= goal) == (value >= goal):
            break
    return text


def targets(network: str, table: list[dict[str, Any]]) -> list[str]:
    """The project's targets for ``network``, each with the measured value (informative: never asserted)."""
    by_name = {r["config"]: r for r in table if "failed" not in r}
    lines = []
    if network == "socket":
        for name, goal in SOCKET_TARGETS.items():
            r = by_name.get(name)
            if r and r["vs_baseline"] is not None:
                lines.append(f"{name} tokens/s = {_shown(r['vs_baseline'], goal)} baseline (target >= {goal}x): "
                             f"{'met' if r['vs_baseline'] >= goal else 'NOT met'}")
        for name in ("zero-one-adam", "zero-one-adam-1bit"):
            r = by_name.get(name)
            if r and r["vs_baseline"] is not None:
                met = "met" if r["vs_baseline"] >= ZERO_ONE_SOCKET_TARGET else "NOT met"
                shown = _shown(r["vs_baseline"], ZERO_ONE_SOCKET_TARGET)
                lines.append(f"{name} tokens/s = {shown} ddp-baseline (target >= "
                             f"{ZERO_ONE_SOCKET_TARGET}x): {met}")
        for name, goal in SOCKET_PRESET_BOUND_TARGETS.items():
            r = by_name.get(name)
            if r and r["of_bound"] is not None:
                lines.append(f"{name} = {_shown(r['of_bound'], goal, percent=True)} of the compute-only bound (target "
                             f">= {goal:.0%}): {'met' if r['of_bound'] >= goal else 'NOT met'}")
        qsdp = [r for n, r in by_name.items() if n.startswith("qsdp") and r["of_bound"] is not None]
        if qsdp:
            best = max(qsdp, key=lambda r: r["of_bound"])
            met = "met" if best["of_bound"] >= SOCKET_BOUND_TARGET else "NOT met"
            shown = _shown(best["of_bound"], SOCKET_BOUND_TARGET, percent=True)
            lines.append(f"best QSDP ({best['config']}) = {shown} of the compute-only bound (target "
                         f">= {SOCKET_BOUND_TARGET:.0%}): {met}")
    elif network == "nvlink":
        for name, r in by_name.items():
            goal = NVLINK_AUTO_TARGET if name.startswith("qsdp-auto") else NVLINK_TARGET
            if name.startswith("qsdp") and r["vs_baseline"] is not None:
                lines.append(f"{name} tokens/s = {_shown(r['vs_baseline'], goal)} baseline (target >= {goal}x): "
                             f"{'met' if r['vs_baseline'] >= goal else 'NOT met'}")
    over = [f"{n} {r['memory_vs_baseline']:.2f}x" for n, r in by_name.items()
            if n.startswith("qsdp") and r.get("memory_vs_baseline") and r["memory_vs_baseline"] > MEMORY_TARGET]
    if any(n.startswith("qsdp") and r.get("memory_vs_baseline") for n, r in by_name.items()):
        lines.append(f"peak memory <= {MEMORY_TARGET:.2f}x plain FSDP2's for every preset: "
                     + ("met" if not over else "NOT met (" + ", ".join(over) + ")"))
    return lines


def startup_lines(table: list[dict[str, Any]]) -> list[str]:
    """Each launch's start-up before its first batch, total (phases), in seconds, or nothing where no launch logged
    it."""
    started = [r for r in table if r.get("startup_s")]
    if not started:
        return []
    phases = [k for k in started[0]["startup_s"] if k != "total"]
    return ["", f"Start-up before the first batch (s, process 0; the recipe entrypoint's phases: {', '.join(phases)}): "
            + "; ".join(f"{r['config']} {r['startup_s']['total']:.0f} ("
                        + " + ".join(f"{r['startup_s'].get(k, 0.0):.0f}" for k in phases) + ")" for r in started)]


def gc_lines(table: list[dict[str, Any]]) -> list[str]:
    """The timed steps that held full garbage collections, per configuration (rows with ``gc_gen2_ms``), or
    nothing where no launch logged them."""
    if all(r.get("gc_gen2_ms") is None for r in table):
        return []
    found = "; ".join(f"{r['config']} " + ", ".join(f"{i}: {ms:.0f}" for i, ms in enumerate(r["gc_gen2_ms"], 1) if ms)
                      for r in table if r.get("gc_gen2_ms") and any(r["gc_gen2_ms"]))
    return ["", "Full garbage collections in the timed steps (process 0, the gc_monitor callback; timed step: ms): "
            + (found or "none")]


_PROFILE_COLUMNS = ("matmul", "attention", "encode", "decode", "hadamard", "copy", "other")


def profile_lines(table: list[dict[str, Any]]) -> list[str]:
    """The profile table of one network (rows with a ``profile``), or nothing."""
    profiled = [r for r in table if r.get("profile")]
    if not profiled:
        return []
    lines = ["", "Where the step goes (rank 0, the second-to-last warm-up batch; GPU time per step in ms by kernel "
             "category, NCCL busy / exposed (no other kernel running) / overlapped, GPU idle (no kernel running) "
             "with the host ranges that hold most of it, QSDP's scheme memory):", "",
             "| config | step (ms) | " + " | ".join(_PROFILE_COLUMNS) + " | NCCL busy | exposed | overlapped "
             "| GPU idle | idle, by host range (ms) | host syncs | replicas (GiB) | residuals (GiB) |",
             "|---" * (len(_PROFILE_COLUMNS) + 10) + "|"]
    for r in profiled:
        p = r["profile"]
        cells = [f"{p['by_category_ms'].get(c, 0.0):.0f}" for c in _PROFILE_COLUMNS]
        memory = p["scheme_memory_bytes"]
        top_idle = ", ".join(f"{name} {ms:.0f}" for name, ms in list(p.get("idle_by_range_ms", {}).items())[:3])
        syncs = sum(n for n, _ in p.get("host_syncs", {}).values())
        lines.append(f"| {r['config']} | {p['wall_ms']:.0f} | " + " | ".join(cells)
                     + f" | {p['communication_busy']:.0f} | {p['exposed_communication']:.0f} "
                       f"| {p['overlapped_communication']:.0f} | {p.get('gpu_idle', 0.0):.0f} | {top_idle} | {syncs} "
                       f"| {memory['weights'] / GIB:.2f} | {memory['grads'] / GIB:.2f} |")
    return lines


def render(plan: Plan, head: dict[str, str], data: dict[str, Any], status: str) -> tuple[str, dict[str, Any]]:
    """The markdown table of every network and the JSON record."""
    s = plan.settings
    tokens = plan.global_batch(plan.args.nproc) * plan.seq_len
    lines = [f"### bench_e2e: {plan.name} on {head['device']}", "", *common.header_lines(head),
             f"- settings: sequence {plan.seq_len}, micro-batch {s['micro_batch']}, grad accumulation "
             f"{s['grad_accum']}, global batch {plan.global_batch(plan.args.nproc)} ({tokens} tokens/step), "
             f"{s['warmup']} warm-up + {s['steps']} timed steps, data `{s['data']}`",
             f"- plain FSDP2's bytes (the baseline's wire, from the model): {plan.plain_bytes_per_step / GB:.3f} GB per "
             f"step and rank ({s['grad_accum']} micro-batch(es) per step)",
             f"- status: {status}", ""]
    tables = {}
    for network, network_data in data["networks"].items():
        table = rows(network_data, data["compute_bounds"], plan.args.nproc, plan.plain_bytes_per_step)
        tables[network] = table
        lines += [f"#### network: {network} (`{common.recorded_env(_network_env(network))}`)", ""]
        probe = network_data["probe"]
        if probe and probe["status"] == "ok":
            lines.append("NCCL probe: " + "; ".join(f"{r['op']} {r['size_mb']:.0f} MB busbw {r['busbw_gbps']:.1f} GB/s"
                                                     for r in probe["rows"]))
        else:
            lines.append("NCCL probe: " + ("failed" if probe else "not run"))
        lines += ["", "| config | GPUs | tokens/s | vs baseline | of compute bound | step time (ms, mean [min-max]) "
                  "| median step (ms) | peak mem (GiB, rank 0) | vs baseline | of it, QSDP state (GiB) "
                  "| wire GB/step/rank | wire vs plain FSDP2 |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in table:
            if "failed" in r:
                lines.append(f"| {r['config']} | failed: {r['failed']} | | | | | | | | | | |")
                continue
            gpus = f"1 (x{plan.args.nproc})" if CONFIGS[r["config"]].single_gpu else str(r["gpus"])
            fmt = common.fmt
            ms = [r[k] * 1e3 for k in ("step_time_s", "step_time_min_s", "step_time_max_s")]
            step_ms = f"{ms[0]:.0f} [{ms[1]:.0f}-{ms[2]:.0f}]"
            median = None if r["step_time_median_s"] is None else r["step_time_median_s"] * 1e3
            lines.append(
                f"| {r['config']} | {gpus} | {r['tokens_per_s']:,.0f} | {fmt(r['vs_baseline'], '.2f', 'x')} "
                f"| {fmt(r['of_bound'], '.0%')} | {step_ms} | {fmt(median, '.0f')} "
                f"| {fmt(r['peak_allocated_gib'], '.1f')} | {fmt(r['memory_vs_baseline'], '.2f', 'x')} "
                f"| {fmt(r['scheme_memory_gib'], '.2f')} | {fmt(r['wire_gb_per_step'], '.3f')} "
                f"| {fmt(r['wire_vs_baseline'], '.3f')} |")
        lines += startup_lines(table)
        lines += gc_lines(table)
        lines += profile_lines(table)
        goal_lines = targets(network, table)
        if goal_lines:
            lines += ["", "Targets (QSDP's stated for GPT-1.3B, 0/1 Adam's for GPT-125M/350M; measured here, never "
                          "asserted):", ""]
            lines += [f"- {line}" for line in goal_lines]
        lines.append("")
    lines += ["Configurations (\"vs baseline\" and \"of compute bound\" compare each with its own):", ""]
    lines += [f"- `{c}`: {CONFIGS[c].description} (baseline `{CONFIGS[c].baseline}`, bound `{CONFIGS[c].bound}`)"
              for c in plan.args.configs]
    record = {"header": head, "settings": plan.settings, "status": status, "tables": tables, **data}
    return "\n".join(lines) + "\n", record


# ------------------------------------------------------------------------------------------------------- main
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
    parser.add_argument("--data", help="real MDS token shards (default: random tokens generated here)")
    parser.add_argument("--out-dir", help="results directory (default runs/bench_e2e/<family>-<nproc>x)")
    parser.add_argument("--time-budget", type=float, help="seconds this command may use; it stops launching, "
                                                          "kills a launch that would overrun, writes the table")
    parser.add_argument("--min-launch-s", type=float, default=120.0,
                        help="start no launch with less budget left than this (default 120 s)")
    parser.add_argument("--retry-failed", action="store_true", help="rerun configurations recorded as failed")
    parser.add_argument("--probe-mb", type=int, nargs="+", default=[64, 256],
                        help="NCCL probe message sizes in MB (default 64 256)")
    parser.add_argument("-o", "--override", action="append", default=[],
                        help="extra recipe override key=value for every launch (repeatable)")
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
    plan = _plan(args)
    common.check_settings(plan.out_dir, plan.settings)
    with common.stop_on_signals():
        try:
            if plan.synthetic_samples is not None:
                random_token_shards(plan.data, plan.synthetic_samples, plan.seq_len, plan.vocab_size)
            status = sweep(plan, budget)
        except common.Interrupted as sig:
            print(f"stopped by {sig}")
            status = "incomplete"
        # The header only now: querying the device earlier could leave a CUDA context of this process on GPU 0
        # during the measurements.
        md, record = render(plan, common.header(args.nproc), collect(plan), status)
        stem = f"bench_e2e-{plan.name}-{args.nproc}x"
        common.write_outputs(stem, plan.out_dir, {".md": md, ".json": json.dumps(record, indent=1)})
    print(md)
    return {"complete": 0, "failed": 1, "incomplete": 3}[status]


if __name__ == "__main__":
    sys.exit(main())
