"""torch's process-group internals that the comm layer reads, in one place: a torch upgrade that moves them breaks
only this module (and ``tests/comm/test_node_groups_timeout.py`` says so)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["completed_work", "group_timeout"]


def completed_work(result: Any) -> dist.Work:
    """A finished ``Work`` whose future holds ``result``: what a process group written in Python returns from a
    collective it has already run (torch has no public constructor for one)."""
    from torch._C._distributed_c10d import _create_work_from_future

    future: torch.futures.Future = torch.futures.Future()
    future.set_result(result)
    return _create_work_from_future(future)


def group_timeout(group: dist.ProcessGroup) -> timedelta | None:
    """How long ``group``'s collectives wait for a peer (the ``timeout`` it was created with, or set since), or None
    where this torch does not say.

    torch has no public getter, and a group made by ``new_group`` without a timeout takes torch's default (30 min
    for gloo, 10 for NCCL), not its parent's: subgroups pass this on so that a stalled peer ends the run after the
    run's own timeout (Composer's ``dist_timeout``), as the default group's collectives do.
    """
    device = torch.device("cuda" if dist.get_backend(group) == "nccl" else "cpu")
    try:
        return group._get_backend(device).options._timeout
    except (AttributeError, RuntimeError):
        return None
