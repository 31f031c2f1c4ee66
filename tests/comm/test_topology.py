"""Topology: ranks per node from the setting or the launcher, node membership, peers off the node."""

from __future__ import annotations

import pytest
import torch.distributed as dist
from dist_spawn import RankInfo, run_ranks

from composer_qsdp.comm import Topology


def test_detect_reads_the_setting_then_the_launcher_then_one_node(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert Topology.detect(world_size=8) == Topology(8)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert Topology.detect(world_size=8) == Topology(4)
    assert Topology.detect(2, world_size=8) == Topology(2)  # virtual nodes: 4 of 2 ranks
    assert [Topology(4).node_of(r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]


@pytest.mark.parametrize("ranks,message", [
    (3, r"ranks_per_node=3 does not divide the world size 8; .*allowed: a divisor of 8"),
    (0, r"ranks_per_node=0 is invalid; it must be an integer >= 1"),
    (True, r"ranks_per_node=True is invalid"),
])
def test_bad_ranks_per_node_is_a_clear_error(ranks, message):
    with pytest.raises(ValueError, match=message):
        Topology.detect(ranks, world_size=8)


def _off_node_peers(info: RankInfo) -> list[int]:
    evens = dist.new_group([0, 2])
    odds = dist.new_group([1, 3])
    mine = evens if info.rank % 2 == 0 else odds
    # Nothing travels on the new groups: without this barrier a rank could tear its group down while its peer was
    # still connecting to it (gloo's connectFullMesh: "Connection closed by peer", seen once in CI).
    dist.barrier()
    return [Topology(2).off_node_peers(dist.group.WORLD), Topology(2).off_node_peers(mine),
            Topology(4).off_node_peers(dist.group.WORLD)]


def test_off_node_peers_counts_group_members_on_other_nodes():
    # 2 nodes x 2 ranks: the world has 2 peers off each rank's node; {0, 2} and {1, 3} span both nodes.
    assert run_ranks(_off_node_peers, 4) == [[2, 1, 0]] * 4
