"""The ``samedev`` process-group backend (``composer_qsdp.comm.same_device_pg``) against gloo: every collective, and
FSDP2 training with and without QSDP, on real process groups (CPU ranks through shared-memory files; CUDA ranks
sharing one GPU through CUDA IPC, marked gpu)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from dist_spawn import RankInfo, run_ranks, skip_unless_backend
from sharded_mlp import Adapter, _train, load_sharded, save_sharded

from composer_qsdp.config import from_preset

CONFIGS = {"plain": None, "w8g4-paper": from_preset("w8g4-paper", bucket_size=64, seed=7),
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
    mine = torch.full((3,), float(info.rank), device=dev)
    gathered = [torch.empty(3, device=dev) for _ in range(w)] if info.rank == 0 else None
    dist.gather(mine, gathered, dst=0)
    out["gather"] = torch.cat(gathered) if info.rank == 0 else torch.zeros(0, device=dev)
    out["scatter"] = torch.empty(5, device=dev)
    dist.scatter(out["scatter"], [torch.full((5,), 10.0 + r, device=dev) for r in range(w)] if info.rank == w - 1
                 else None, src=w - 1)
    objects = [None] * w
    dist.all_gather_object(objects, {"rank": info.rank, "text": "x" * info.rank})
    gathered_objects = [None] * w if info.rank == 0 else None
    dist.gather_object(("from", info.rank), gathered_objects, dst=0)
    received = [None]
    dist.scatter_object_list(received, [f"to {r}" for r in range(w)] if info.rank == 0 else None, src=0)
    out["objects"] = (objects, gathered_objects, received)
    dist.barrier()
    return out


MOVES = ("all_gather_into_tensor", "all_gather_big", "all_gather", "all_to_all_single", "all_reduce_max",
         "broadcast", "gather", "scatter")


def _check(staged: list[dict], reference: list[dict], exact_sums: bool) -> None:
    for rank, (mine, theirs) in enumerate(zip(staged, reference)):
        assert mine.keys() == theirs.keys()
        assert mine["objects"] == theirs["objects"] == (
            [{"rank": r, "text": "x" * r} for r in range(len(staged))],
            [("from", r) for r in range(len(staged))] if rank == 0 else None, [f"to {rank}"])
        for key in mine.keys() - {"objects"}:
            if key in MOVES or exact_sums:
                assert torch.equal(mine[key], theirs[key]), (rank, key)
            else:  # sums in another order
                torch.testing.assert_close(mine[key], theirs[key], rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("world", [2, 3])
def test_every_collective_computes_what_gloo_computes(world):
    # Two ranks sum in the only order there is; three sum in rank order, gloo in its own.
    _check(run_ranks(_collectives, world, backend="cpu:samedev"), run_ranks(_collectives, world), world == 2)


def _training(info: RankInfo, ckpt_dir: str) -> dict:
    """Each configuration trains 4 steps; ``qwd-w3g3-loco`` then saves a distributed checkpoint (model, optimizer,
    scheme state) and a fresh model loads it and trains 2 steps more."""
    out = {}
    for name, config in CONFIGS.items():
        adapter = Adapter("fsdp2")
        model = adapter.shard(info)
        handle = adapter.apply(model, config) if config is not None else None
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        result = _train(info, model, 4, opt=opt, microbatches=2, grads=False)
        out[name] = {"losses": result["losses"], "params": result["params"]}
    save_sharded(model, opt, handle, ckpt_dir)
    model = adapter.shard(info)
    handle = adapter.apply(model, config)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    _train(info, model, 1, opt=opt, grads=False)  # creates the optimizer state and the scheme's residuals
    load_sharded(model, opt, handle, ckpt_dir)
    resumed = _train(info, model, 2, opt=opt, first_step=4, grads=False)
    out["resumed"] = {"losses": resumed["losses"], "params": resumed["params"]}
    return out


def test_fsdp2_and_qsdp_train_and_resume_bit_for_bit_as_over_gloo(tmp_path):
    staged = run_ranks(_training, 2, str(tmp_path / "samedev"), backend="cpu:samedev")
    reference = run_ranks(_training, 2, str(tmp_path / "gloo"))
    for rank in range(2):
        for name in [*CONFIGS, "resumed"]:
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
def test_cuda_ranks_sharing_a_gpu_train_bit_for_bit_as_over_nccl_or_gloo(tmp_path):
    skip_unless_backend("nccl", 2)
    staged = run_ranks(_training, 2, str(tmp_path / "samedev"), backend="samedev")
    reference = run_ranks(_training, 2, str(tmp_path / "nccl"), backend="nccl")
    for rank in range(2):
        for name in [*CONFIGS, "resumed"]:
            assert staged[rank][name]["losses"] == reference[rank][name]["losses"], (rank, name)
