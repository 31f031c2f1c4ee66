"""A second process group over a group's ranks (its twin), created once and cached.

NCCL runs the collectives of one communicator one after another, whatever CUDA streams they are issued from: a
gradient reduce-scatter queued on FSDP's group holds back every weight all-gather queued after it on that group.
Collectives on a twin run on a communicator of their own, so the two kinds can overlap on the link. The twin has the
group's ranks, order and backend: a collective gives the same result on either.
"""

from __future__ import annotations

import weakref

import torch.distributed as dist

from composer_qsdp.comm.node_groups import create_groups

__all__ = ["twin_group"]

_TWINS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def twin_group(group: dist.ProcessGroup) -> dist.ProcessGroup:
    """A process group with ``group``'s ranks and backend, distinct from it; one per group, reused.

    The first call for a group is collective over the **default** process group: every rank calls it for its own
    group (HSDP gives ranks different shard groups), in the same order. The ranks exchange their groups' members and
    every rank creates the twin of every distinct group (``new_group`` must be called by all ranks, in one order),
    with the default group's timeout. Later calls are local.
    """
    default = dist.group.WORLD
    members = tuple(dist.get_process_group_ranks(group))
    twins = _TWINS.setdefault(default, {})
    if members not in twins:
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, members)
        create_groups(sorted(set(gathered)), twins, dist.get_backend(group))  # the same order on every rank
    return twins[members]
