"""Ending a distributed process cleanly: destroy its process groups and let gloo's workers finish.

A gloo worker thread releases a finished collective after the caller waiting on it has returned, and with the
collective the tensors it holds; a tensor that Python code made needs the GIL to be released. A process whose last
collective completes just before it exits (Composer's ``Trainer.close`` ends with a barrier, whose work also holds
the collectives before it) can reach interpreter finalization before the worker takes the GIL: the worker is then
ended mid-release and the process aborts (SIGABRT, "terminate called without an active exception") after a run
that ended well, so the launcher reports the job failed. ``destroy_process_group`` does not stop gloo's workers.
"""

from __future__ import annotations

import time

import torch.distributed as dist

__all__ = ["GLOO_RELEASE_S", "destroy_process_groups"]

#: How long the main thread gives up the GIL after destroying the groups (seconds): gloo's workers release a
#: finished collective within microseconds of being scheduled, so this covers a loaded host's scheduling delays. A
#: pause, not a handshake: torch offers no way to wait for gloo's workers to go idle.
GLOO_RELEASE_S = 0.2


def destroy_process_groups() -> None:
    """Destroy every process group of this process (``torch.distributed.destroy_process_group``), then release the
    GIL for :data:`GLOO_RELEASE_S` so that gloo's worker threads drop the collectives they finished (module
    docstring). Call it last, after the process's final collective; a no-op where no group exists."""
    if not dist.is_initialized():
        return
    dist.destroy_process_group()
    time.sleep(GLOO_RELEASE_S)
