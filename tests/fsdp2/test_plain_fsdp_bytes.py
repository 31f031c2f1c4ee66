"""The counters' plain-FSDP2 figure against plain FSDP2 itself: a qWD run with gradient accumulation counts in
``native + served_native`` exactly the bytes that plain FSDP2, run on the same model, stack and steps, puts on the
wire, measured independently by recording every all-gather and reduce-scatter plain FSDP2 issues (NCCL's (W-1)/W
convention applied to each); and the ratios of the collectives that ran stay what they were."""

from __future__ import annotations

import inspect
from unittest import mock

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from dist_spawn import RankInfo, run_ranks
from sharded_mlp import LR, STEPS, Adapter, batch

from composer_qsdp.config import from_preset

MICROBATCHES = 2
QWD = from_preset("w8g8", weight_scheme="difference", weight_bits=4, weight_codec="symmetric", bucket_size=64,
                  seed=7)


def _train(info: RankInfo, model: nn.Module) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = (t.to(info.device) for t in batch(info.rank, step))
        for xm, ym in zip(x.chunk(MICROBATCHES), y.chunk(MICROBATCHES)):
            (nn.functional.mse_loss(model(xm).float(), ym) / MICROBATCHES).backward()
        opt.step()
        opt.zero_grad()


def _plain_bytes(info: RankInfo, mixed_precision: bool) -> dict[str, int]:
    """Per-rank bytes plain FSDP2's own collectives put on the wire: (W-1)/W of each collective's full volume."""
    world, counts = info.world_size, {"gathers": 0, "gather_bytes": 0, "scatters": 0, "scatter_bytes": 0}

    def counting(fn, kind: str, tensor: str):
        # Bound by torch's own parameter names: FSDP2 passes them by keyword on some releases, by position on others.
        signature = inspect.signature(fn)

        def counted(*args, **kwargs):
            full = signature.bind(*args, **kwargs).arguments[tensor]
            counts[kind + "s"] += 1
            counts[kind + "_bytes"] += (world - 1) * full.numel() * full.element_size() // world
            return fn(*args, **kwargs)
        return counted

    model = Adapter("fsdp2").shard(info, mixed_precision=mixed_precision)
    with mock.patch.object(dist, "all_gather_into_tensor",
                           counting(dist.all_gather_into_tensor, "gather", "output_tensor")), \
            mock.patch.object(dist, "reduce_scatter_tensor", counting(dist.reduce_scatter_tensor, "scatter", "input")):
        _train(info, model)
    return counts


def _worker(info: RankInfo) -> dict:
    out = {}
    for mixed_precision in (False, True):
        plain = _plain_bytes(info, mixed_precision)
        model = Adapter("fsdp2").shard(info, mixed_precision=mixed_precision)
        handle = Adapter("fsdp2").apply(model, QWD, optimizers=None)
        _train(info, model)
        out[mixed_precision] = {"plain": plain, "traffic": handle.traffic()}
    return out


def test_plain_fsdp_figure_is_what_plain_fsdp2_sends():
    results = run_ranks(_worker, 2, backend="gloo")
    for rank_result in results:
        for mixed_precision, res in rank_result.items():
            plain, traffic = res["plain"], res["traffic"]
            weights, grads = traffic.weights, traffic.grads
            assert plain["gathers"] > 0 and plain["scatters"] == grads.calls, mixed_precision
            # Every call QSDP saw is one plain FSDP2 issued, served locally or not.
            assert weights.calls == plain["gathers"], mixed_precision
            assert weights.plain_fsdp == plain["gather_bytes"], mixed_precision
            assert grads.plain_fsdp == plain["scatter_bytes"] and grads.served_native == 0, mixed_precision
            assert traffic.total.plain_fsdp == plain["gather_bytes"] + plain["scatter_bytes"]
            # The baselines still hold the collectives that ran only: per unit, one gather of the 2 * MICROBATCHES
            # calls of a step issues one (the first forward after a step), the rest are served from the replica.
            assert weights.served_locally == weights.calls * (2 * MICROBATCHES - 1) // (2 * MICROBATCHES)
            assert weights.native * weights.calls == plain["gather_bytes"] * (weights.calls - weights.served_locally)
            assert weights.served_native == plain["gather_bytes"] - weights.native
            assert traffic.total.ratio_vs_native == traffic.total.native / traffic.total.sent
            assert traffic.total.ratio_vs_plain_fsdp == traffic.total.plain_fsdp / traffic.total.sent
            assert traffic.total.ratio_vs_plain_fsdp > traffic.total.ratio_vs_native
