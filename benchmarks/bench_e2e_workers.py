"""The processes of the end-to-end benchmark that are not training launches, each started by the sweep through
``bench_e2e.py``'s internal options: one rank of the NCCL bandwidth probe (``--probe-worker``, under ``torchrun``)
and the ``compute-bound-layer`` measurement on one GPU (``--layer-bound-worker``). Each writes its result as JSON to
the path it is given.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import torch

import e2e_common as common
from e2e_common import GB


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
