"""The test harness itself: :func:`dist_spawn.run_ranks` fails at once, naming the rank, when a rank's process dies
without reporting, and gives its ranks the caller's environment; :func:`full_dtensor.gather_full` gathers a DTensor
exactly as ``full_tensor()`` does, with c10d collectives only."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
from dist_spawn import RankInfo, run_ranks

#: Shapes of the tensors sharded below: a dimension no world size divides, dimensions smaller than 2 and 4.
SHAPES = ((67, 5), (3, 7), (1,), (5,), (2, 3, 4))


def _die(info: RankInfo, how: str) -> None:
    if info.rank == 1:
        if how == "segv":
            signal.signal(signal.SIGSEGV, signal.SIG_DFL)  # a handler installed by a library would survive the kill
            # To this thread: os.kill may deliver the signal to another of the process's threads while this one
            # runs on to the exit below.
            signal.raise_signal(signal.SIGSEGV)
        os._exit(3)
    time.sleep(60)  # a rank that outlives its dead peer: run_ranks must not wait for it


@pytest.mark.parametrize(("how", "expected"), [("segv", "rank 1 died with signal 11 (SIGSEGV) without reporting"),
                                               ("exit", "rank 1 died with exit code 3 without reporting")])
def test_a_rank_that_dies_without_reporting_fails_at_once(how, expected):
    start = time.monotonic()
    with pytest.raises(RuntimeError) as err:
        run_ranks(_die, 2, how, timeout_s=30)
    assert expected in str(err.value)
    assert time.monotonic() - start < 25, "run_ranks waited for the timeout instead of noticing the dead rank"


def _hang(info: RankInfo) -> None:
    time.sleep(0 if info.rank == 0 else 60)


def test_a_rank_that_hangs_still_times_out():
    # Rank 0 reports at once, unless starting a process takes longer than the timeout on a loaded machine.
    with pytest.raises(RuntimeError, match=r"ranks \[(0, )?1\] did not finish within 3 s"):
        run_ranks(_hang, 2, timeout_s=3)


def _environ(info: RankInfo, names: list[str]) -> dict:
    return {name: os.environ.get(name) for name in names}


def test_ranks_see_the_environment_at_the_call(monkeypatch):
    """CPU ranks fork from a server started at the first call: they still see the test's variables as they are
    at each call (set or removed since), as freshly spawned ranks do."""
    names = ["DIST_SPAWN_TEST_REMOVED", "DIST_SPAWN_TEST_ADDED"]
    monkeypatch.setenv("DIST_SPAWN_TEST_REMOVED", "set at the first call")
    monkeypatch.delenv("DIST_SPAWN_TEST_ADDED", raising=False)
    assert run_ranks(_environ, 2, names) == [{names[0]: "set at the first call", names[1]: None}] * 2
    monkeypatch.delenv("DIST_SPAWN_TEST_REMOVED")
    monkeypatch.setenv("DIST_SPAWN_TEST_ADDED", "set after the first call")
    assert run_ranks(_environ, 2, names) == [{names[0]: None, names[1]: "set after the first call"}] * 2


def _mesh_layouts(world: int) -> list:
    from torch.distributed.tensor import Replicate, Shard

    layouts = [((world,), (Shard(0),))]
    if world == 4:
        layouts += [((2, 2), (Replicate(), Shard(0))), ((2, 2), (Shard(0), Shard(0))), ((2, 2), (Shard(0), Shard(1))),
                    ((2, 2), (Shard(1), Replicate()))]
    return layouts


def _gather(info: RankInfo) -> list:
    from full_dtensor import gather_full
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    out = []
    for mesh_shape, placements in _mesh_layouts(info.world_size):
        mesh = init_device_mesh("cpu", mesh_shape)
        for seed, shape in enumerate(SHAPES):
            if any(isinstance(p, Shard) and p.dim >= len(shape) for p in placements):
                continue
            for dtype in (torch.float32, torch.bfloat16):
                full = torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)
                sharded = distribute_tensor(full, mesh, placements)
                ours = gather_full(sharded)
                out.append({"case": (mesh_shape, str(placements), shape, str(dtype)), "full": full, "ours": ours,
                            "torch": sharded.full_tensor(), "local": tuple(sharded.to_local().shape)})
    return out


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])  # 4 ranks: the same code, 18 s
def test_gather_full_matches_full_tensor_and_the_unsharded_tensor(world):
    results = run_ranks(_gather, world)
    for rank_cases in results:
        for case in rank_cases:
            assert case["ours"].dtype == case["full"].dtype, case["case"]
            assert torch.equal(case["ours"], case["full"]), case["case"]
            assert torch.equal(case["ours"], case["torch"]), case["case"]
    # The layouts really were uneven: some rank held an empty shard.
    assert any(0 in case["local"] for rank_cases in results for case in rank_cases)
