"""``twin_group``: a second group over a group's ranks, one per group. Four spawned gloo ranks in two shard groups
(HSDP's layout: each rank passes its own group), against the groups' own collectives."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from dist_spawn import RankInfo, run_ranks

from composer_qsdp.comm import twin_group
from composer_qsdp.comm.compat import group_timeout


def _twins(info: RankInfo) -> dict:
    dist.group.WORLD._get_backend(torch.device("cpu"))._set_default_timeout(timedelta(seconds=90))
    shards = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates both, as new_group requires
    mine = shards[info.rank // 2]
    twin = twin_group(mine)
    x = torch.arange(4, dtype=torch.float32) * (info.rank + 1)
    on_group, on_twin = torch.empty(2), torch.empty(2)
    dist.reduce_scatter_tensor(on_group, x.clone(), group=mine)
    dist.reduce_scatter_tensor(on_twin, x.clone(), group=twin)
    return {"distinct": twin is not mine, "ranks": dist.get_process_group_ranks(twin),
            "rank_in_twin": dist.get_rank(twin), "backend": dist.get_backend(twin), "cached": twin_group(mine) is twin,
            "timeout": group_timeout(twin), "same_sum": torch.equal(on_group, on_twin), "sum": on_twin.tolist()}


def test_each_rank_gets_a_twin_of_its_own_group_that_sums_as_the_group_does():
    results = run_ranks(_twins, 4, timeout_s=120)
    for rank, r in enumerate(results):
        pair = [0, 1] if rank < 2 else [2, 3]
        assert r["distinct"] and r["cached"] and r["same_sum"], r
        assert (r["ranks"], r["rank_in_twin"], r["backend"]) == (pair, rank % 2, "gloo")
        assert r["timeout"] == timedelta(seconds=90)  # the default group's, not torch's 30 min for a new gloo group
        factor = sum(p + 1 for p in pair)  # x * (rank + 1) summed over the pair; this rank's half of arange(4)
        assert r["sum"] == [factor * v for v in ((0.0, 1.0) if rank % 2 == 0 else (2.0, 3.0))]
