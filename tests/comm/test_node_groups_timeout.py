"""The intra- and inter-node subgroups wait for a peer as long as the default group does (a run's ``dist_timeout``),
not torch's default for a new group (30 min for gloo): a stalled rank in a two-level reduce-scatter ends the run
after the run's timeout, as in any other collective. Four spawned gloo ranks as 2 nodes of 2."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from dist_spawn import RankInfo, run_ranks

from composer_qsdp.comm import Topology, node_groups
from composer_qsdp.comm.compat import group_timeout

TIMEOUT_S = 2.0


def _stall_in_the_intra_node_hop(info: RankInfo) -> dict:
    # What init_process_group(timeout=...) sets (the harness's group has torch's default); torch 2.7's process group
    # has no public setter.
    dist.group.WORLD._get_backend(torch.device("cpu"))._set_default_timeout(timedelta(seconds=TIMEOUT_S))
    groups = node_groups(Topology(ranks_per_node=2), dist.group.WORLD)
    out = {"intra": group_timeout(groups.intra), "inter": group_timeout(groups.inter)}
    if info.rank == 1:  # rank 0's node peer stays silent, alive
        time.sleep(TIMEOUT_S + 6)
    elif info.rank == 0:
        start = time.monotonic()
        with pytest.raises(RuntimeError):
            dist.all_reduce(torch.ones(1), group=groups.intra)
        out["waited_s"] = time.monotonic() - start
    return out


def test_subgroups_time_out_after_the_default_groups_timeout():
    results = run_ranks(_stall_in_the_intra_node_hop, 4, timeout_s=120)
    for result in results:
        assert result["intra"] == result["inter"] == timedelta(seconds=TIMEOUT_S)
    assert TIMEOUT_S * 0.5 <= results[0]["waited_s"] < TIMEOUT_S + 5, results[0]
