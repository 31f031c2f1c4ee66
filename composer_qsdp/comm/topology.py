"""Where ranks sit: ``Topology`` groups consecutive global ranks into nodes.

Launchers number ranks node by node (Composer's and torchrun's ``RANK = node_rank * LOCAL_WORLD_SIZE +
LOCAL_RANK``), so node ``k`` holds global ranks ``k * R .. (k + 1) * R - 1`` for ``R`` ranks per node. ``R`` comes
from an explicit setting or from ``LOCAL_WORLD_SIZE``. A smaller explicit ``R`` splits one host into "virtual
nodes" (e.g. 4 ranks as 2 nodes x 2), so one machine and CPU tests exercise every multi-node path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch.distributed as dist

__all__ = ["Topology"]


@dataclass(frozen=True)
class Topology:
    """Ranks per node of the run.

    Attributes:
        ranks_per_node: consecutive global ranks that share a node (its fast links).
    """

    ranks_per_node: int

    def __post_init__(self) -> None:
        value = self.ranks_per_node
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"ranks_per_node={value!r} is invalid; it must be an integer >= 1 (ranks sharing a node)")

    @classmethod
    def detect(cls, ranks_per_node: int | None = None, world_size: int | None = None) -> Topology:
        """The run's topology: ``ranks_per_node`` if given, else ``LOCAL_WORLD_SIZE`` from the launcher, else one
        node holding the whole world.

        Args:
            ranks_per_node: explicit ranks per node (virtual nodes when smaller than the host's ranks).
            world_size: ranks in the run; default: the default process group's size.

        Raises:
            ValueError: ranks per node that is not a positive integer dividing the world size, naming both.
        """
        world = dist.get_world_size() if world_size is None else world_size
        if ranks_per_node is None:
            local = os.environ.get("LOCAL_WORLD_SIZE")
            ranks_per_node = int(local) if local and local.isdigit() and int(local) > 0 else world
        topology = cls(ranks_per_node)
        if world % topology.ranks_per_node:
            raise ValueError(
                f"ranks_per_node={topology.ranks_per_node} does not divide the world size {world}; nodes must hold "
                f"equally many ranks (allowed: a divisor of {world})"
            )
        return topology

    def node_of(self, global_rank: int) -> int:
        """The node of ``global_rank``."""
        return global_rank // self.ranks_per_node

    def off_node_peers(self, group: dist.ProcessGroup) -> int:
        """How many of this rank's peers in ``group`` sit on other nodes (0 when the group is within one node)."""
        me = self.node_of(dist.get_rank())
        return sum(self.node_of(r) != me for r in dist.get_process_group_ranks(group))
