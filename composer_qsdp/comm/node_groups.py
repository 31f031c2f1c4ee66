"""A process group's ranks by node, and its intra-node / inter-node subgroups (created once, cached).

The two-level reduce-scatter of ZeRO++ (qgZ) and SDP4Bit (TLq-HS) runs over two subgroups of the group a unit
communicates over: the group's ranks on this rank's node (the intra-node hop, over NVLink) and the group's ranks
that have this rank's local index on every node (the inter-node hop, over the network). :func:`node_groups`
splits a group into the nodes of a :class:`~composer_qsdp.comm.topology.Topology`, checks that every rank sees the same
topology, creates the subgroups once per distinct split and caches them, so every unit on the same group reuses
them.

Indices: the group's nodes are numbered ``a = 0..M-1`` in node order and the group's ranks on one node
``l = 0..L-1`` in global-rank order; ``chunk[a][l]`` is the group rank (the index of the chunk a flat
reduce-scatter gives it) of the rank at ``(a, l)``.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from composer_qsdp.comm.compat import group_timeout
from composer_qsdp.comm.topology import Topology

__all__ = ["NodeGroups", "chunk_table", "create_groups", "node_groups"]


@dataclass(frozen=True, eq=False)
class NodeGroups:
    """How one process group spans nodes, from one rank's point of view.

    Attributes:
        nodes: nodes holding ranks of the group (``M``).
        ranks_per_node: ranks of the group on each node (``L``); ``M * L`` is the group size.
        node: this rank's node index ``a`` among the group's nodes.
        local: this rank's index ``l`` among the group's ranks on its node.
        chunks: ``chunks[a][l]``: the group rank of the rank at ``(a, l)``.
        intra: the group's ranks on this node, in local order (``None`` unless both hops exist).
        inter: the group's ranks with local index ``l``, in node order (``None`` unless both hops exist).
    """

    nodes: int
    ranks_per_node: int
    node: int
    local: int
    chunks: tuple[tuple[int, ...], ...]
    intra: dist.ProcessGroup | None
    inter: dist.ProcessGroup | None
    _send_index: dict[torch.device, torch.Tensor] = field(default_factory=dict, init=False, repr=False)

    @property
    def two_level(self) -> bool:
        """True when the group spans several nodes with several ranks on each: both hops carry traffic."""
        return self.nodes > 1 and self.ranks_per_node > 1

    @property
    def send_order(self) -> tuple[int, ...]:
        """Chunk indices in the order the intra-node hop sends them: destination local index major, node minor.

        Local peer ``l`` receives the chunks of ``(0, l), (1, l), ..., (M-1, l)``: the ones it forwards to each
        node in the inter-node hop (ZeRO++'s tensor slice reordering; 2 nodes x 4 ranks: 0 4 1 5 2 6 3 7).
        """
        return tuple(self.chunks[a][l] for l in range(self.ranks_per_node) for a in range(self.nodes))

    def send_index(self, device: torch.device) -> torch.Tensor:
        """:attr:`send_order` as an index tensor on ``device``, copied there once (later calls never sync)."""
        if device not in self._send_index:
            self._send_index[device] = torch.tensor(self.send_order, dtype=torch.long, device=device)
        return self._send_index[device]


def chunk_table(members: Sequence[int], topology: Topology) -> tuple[tuple[int, ...], ...]:
    """``table[a][l]``: the group rank of the ``l``-th rank (by global rank) of the group's ``a``-th node.

    Args:
        members: the group's global ranks in group-rank order (``dist.get_process_group_ranks``).
        topology: where ranks sit.

    Raises:
        ValueError: the group's nodes hold different numbers of its ranks, naming the counts.
    """
    by_node: dict[int, list[int]] = {}
    for global_rank in sorted(members):
        by_node.setdefault(topology.node_of(global_rank), []).append(global_rank)
    counts = {node: len(ranks) for node, ranks in sorted(by_node.items())}
    if len(set(counts.values())) != 1:
        raise ValueError(
            f"the process group of global ranks {list(members)} holds {counts} ranks per node (node: count) with "
            f"ranks_per_node={topology.ranks_per_node}; a two-level collective needs every node to hold equally "
            "many ranks of the group"
        )
    position = {global_rank: group_rank for group_rank, global_rank in enumerate(members)}
    return tuple(tuple(position[r] for r in ranks) for _, ranks in sorted(by_node.items()))


# Per default process group (a new one after destroy/init starts empty): (members, ranks_per_node) -> split, and
# subgroup ranks -> the subgroup (shared by splits that need the same subgroup).
_SPLITS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_SUBGROUPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def node_groups(topology: Topology, group: dist.ProcessGroup) -> NodeGroups:
    """``group`` split into the nodes of ``topology``, with its subgroups; built once per group and reused.

    The first call for a group is collective over the **default** process group: every rank calls it for its
    own group (HSDP gives ranks different shard groups), in the same order. The ranks exchange their topology
    and group, check them, and every rank creates the subgroups of every distinct group (``new_group`` must be
    called by all ranks, in one order, for NCCL's communicator split), with the default group's timeout. Later calls
    are local.

    Args:
        topology: this rank's topology.
        group: the process group to split.

    Raises:
        ValueError: ranks disagree on ``ranks_per_node``, it does not divide the world size, or the group's nodes
            hold different numbers of its ranks; raised on every rank, so none waits on the others.
    """
    default = dist.group.WORLD
    members = tuple(dist.get_process_group_ranks(group))
    splits = _SPLITS.setdefault(default, {})
    key = (members, topology.ranks_per_node)
    if key not in splits:
        world = dist.get_world_size()
        gathered: list = [None] * world
        dist.all_gather_object(gathered, (topology.ranks_per_node, members))
        settings = [rpn for rpn, _ in gathered]
        if len(set(settings)) != 1:
            raise ValueError(
                f"ranks_per_node differs between ranks ({dict(enumerate(settings))}, rank: value); every rank must "
                "use the same topology: set ranks_per_node explicitly, or launch every node with the same "
                "LOCAL_WORLD_SIZE"
            )
        if world % topology.ranks_per_node:
            raise ValueError(
                f"ranks_per_node={topology.ranks_per_node} does not divide the world size {world}; nodes must hold "
                f"equally many ranks (allowed: a divisor of {world})"
            )
        tables = {m: chunk_table(m, topology) for m in sorted({m for _, m in gathered})}
        subgroups = _SUBGROUPS.setdefault(default, {})
        create_groups((ranks for m, table in tables.items() for ranks in _subgroup_ranks(m, table)), subgroups)
        splits[key] = _split(members, tables[members], topology, subgroups)
    return splits[key]


def create_groups(rank_sets: Iterable[tuple[int, ...]], cache: dict[tuple[int, ...], dist.ProcessGroup],
                  backend: str | None = None) -> None:
    """Create each group of ``rank_sets`` not yet in ``cache`` (keyed by its ranks), in the order given, with the
    default group's timeout and ``backend`` (``None``: the default group's). ``new_group`` is collective over the
    default group: every rank calls this with the same sets in the same order."""
    timeout = group_timeout(dist.group.WORLD)
    for ranks in rank_sets:
        if ranks not in cache:
            cache[ranks] = dist.new_group(list(ranks), timeout=timeout, backend=backend)


def _subgroup_ranks(members: Sequence[int], table: tuple[tuple[int, ...], ...]) -> list[tuple[int, ...]]:
    """Global ranks of the intra-node groups (one per node) and inter-node groups (one per local index)."""
    if len(table) < 2 or len(table[0]) < 2:
        return []  # one hop: the group itself carries it
    intra = [tuple(members[g] for g in node) for node in table]
    inter = [tuple(members[node[l]] for node in table) for l in range(len(table[0]))]
    return intra + inter


def _split(members: tuple[int, ...], table: tuple[tuple[int, ...], ...], topology: Topology,
            subgroups: dict[tuple[int, ...], dist.ProcessGroup]) -> NodeGroups:  # fmt: skip
    me = members.index(dist.get_rank())
    node, local = next((a, row.index(me)) for a, row in enumerate(table) if me in row)
    intra = inter = None
    if len(table) > 1 and len(table[0]) > 1:
        intra = subgroups[tuple(members[g] for g in table[node])]
        inter = subgroups[tuple(members[row[local]] for row in table)]
    return NodeGroups(len(table), len(table[0]), node, local, table, intra, inter)
