"""``destroy_process_groups``: every group of a spawned 2-rank gloo run (the default group, a twin) is gone after
it, the ranks' last collectives having completed."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from dist_spawn import RankInfo, run_ranks

from composer_qsdp.comm import destroy_process_groups, twin_group
from composer_qsdp.comm.teardown import GLOO_RELEASE_S


def _end(info: RankInfo) -> dict:
    twin = twin_group(dist.group.WORLD)
    out = torch.empty(2 * 1024)
    dist.all_gather_into_tensor(out, torch.full((1024,), float(info.rank)), group=twin)
    dist.barrier()  # as Composer's Trainer.close ends: a barrier after collectives on Python tensors
    start = time.perf_counter()
    destroy_process_groups()
    return {"initialized": dist.is_initialized(), "seconds": time.perf_counter() - start,
            "gathered": out[::1024].tolist()}


def test_every_group_is_destroyed_after_the_last_collectives():
    for result in run_ranks(_end, 2):
        assert result["gathered"] == [0.0, 1.0]
        assert not result["initialized"]
        assert result["seconds"] >= GLOO_RELEASE_S  # the workers' time to release the finished collectives
