"""The ``samedev`` process-group backend (``composer_qsdp.comm.same_device_pg``) against gloo: every collective, and
FSDP2 training with and without QSDP, on real process groups (CPU ranks through shared-memory files; CUDA ranks
sharing one GPU through CUDA IPC, marked gpu)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from dist_spawn import RankInfo, run_ranks, skip_unless_backend
from sharded_mlp import Adapter, _train

from composer_qsdp.config import from_preset

CONFIGS = {"plain": None, "w8g4": from_preset("w8g4", bucket_size=64, seed=7),
           "qwd-w3g3-loco": from_preset("qwd-w3g3-loco", seed=7)}


def _collectives(info: RankInfo) -> dict:
    """Each collective this package or FSDP2 runs, on data that differs by rank, in several dtypes and sizes."""
    gen = torch.Generator().manual_seed(info.rank)
    w, dev = info.world_size, info.device
    out = {}
    x = torch.randn(1000, generator=gen).to(dev)
    out["all_gather_into_tensor"] = torch.empty(1000 * w, device=dev)
    dist.all_gather_into_tensor(out["all_gather_into_tensor"], x)
    big = torch.randn(3_000_000, generator=gen).to(dev)  # grows the staging buffers
    out["all_gather_big"] = torch.empty(3_000_000 * w, device=dev)
    dist.all_gather_into_tensor(out["all_gather_big"], big)
    listed = [torch.empty(4, dtype=torch.int64, device=dev) for _ in range(w)]
    dist.all_gather(listed, torch.full((4,), info.rank, dtype=torch.int64, device=dev))
    out["all_gather"] = torch.cat(listed)
    y = torch.randn(w * 300, generator=gen).to(dev, torch.bfloat16)
    for name, op in (("sum", dist.ReduceOp.SUM), ("avg", dist.ReduceOp.AVG)):
        out[f"reduce_scatter_{name}"] = torch.empty(300, dtype=torch.bfloat16, device=dev)
        dist.reduce_scatter_tensor(out[f"reduce_scatter_{name}"], y, op=op)
    a = (torch.arange(w * 7, dtype=torch.float32) + 100 * info.rank).to(dev)
    out["all_to_all_single"] = torch.empty_like(a)
    dist.all_to_all_single(out["all_to_all_single"], a)
    for name, op in (("sum", dist.ReduceOp.SUM), ("max", dist.ReduceOp.MAX)):
        out[f"all_reduce_{name}"] = torch.randn(5000, generator=gen).to(dev)
        dist.all_reduce(out[f"all_reduce_{name}"], op=op)
    out["broadcast"] = torch.randn(77, generator=gen).to(dev)
    dist.broadcast(out["broadcast"], src=w - 1)
    dist.barrier()
    return out


MOVES = ("all_gather_into_tensor", "all_gather_big", "all_gather", "all_to_all_single", "all_reduce_max",
         "broadcast")


def _check(staged: list[dict], reference: list[dict], exact_sums: bool) -> None:
    for rank, (mine, theirs) in enumerate(zip(staged, reference)):
        assert mine.keys() == theirs.keys()
        for key in mine:
            if key in MOVES or exact_sums:
                assert torch.equal(mine[key], theirs[key]), (rank, key)
            else:  # sums in another order
                torch.testing.assert_close(mine[key], theirs[key], rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("world", [2, 3])
def test_every_collective_computes_what_gloo_computes(world):
    # Two ranks sum in the only order there is; three sum in rank order, gloo in its own.
    _check(run_ranks(_collectives, world, backend="cpu:samedev"), run_ranks(_collectives, world), world == 2)


def _training(info: RankInfo) -> dict:
    out = {}
    for name, config in CONFIGS.items():
        adapter = Adapter("fsdp2")
        model = adapter.shard(info)
        if config is not None:
            adapter.apply(model, config)
        result = _train(info, model, 4, microbatches=2, grads=False)
        out[name] = {"losses": result["losses"], "params": result["params"]}
    return out


def test_fsdp2_and_qsdp_train_bit_for_bit_as_over_gloo():
    staged, reference = run_ranks(_training, 2, backend="cpu:samedev"), run_ranks(_training, 2)
    for rank in range(2):
        for name in CONFIGS:
            assert staged[rank][name]["losses"] == reference[rank][name]["losses"], (rank, name)
            for key, value in reference[rank][name]["params"].items():
                assert torch.equal(staged[rank][name]["params"][key], value), (rank, name, key)


def test_unequal_all_to_all_splits_are_refused_with_the_splits():
    with pytest.raises(RuntimeError, match=r"equal splits, got input \[3, 1\]"):
        run_ranks(_unequal_all_to_all, 2, backend="cpu:samedev")


def _unequal_all_to_all(info: RankInfo) -> None:
    dist.all_to_all_single(torch.empty(4), torch.zeros(4), output_split_sizes=[3, 1], input_split_sizes=[3, 1])


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 3])
def test_cuda_ranks_sharing_a_gpu_compute_what_nccl_or_gloo_computes(world):
    skip_unless_backend("nccl", world)  # the reference: NCCL with a GPU per rank, or gloo's shared-GPU mode
    _check(run_ranks(_collectives, world, backend="samedev"), run_ranks(_collectives, world, backend="nccl"),
           world == 2)


@pytest.mark.gpu
def test_cuda_ranks_sharing_a_gpu_train_bit_for_bit_as_over_nccl_or_gloo():
    skip_unless_backend("nccl", 2)
    staged, reference = run_ranks(_training, 2, backend="samedev"), run_ranks(_training, 2, backend="nccl")
    for rank in range(2):
        for name in CONFIGS:
            assert staged[rank][name]["losses"] == reference[rank][name]["losses"], (rank, name)
