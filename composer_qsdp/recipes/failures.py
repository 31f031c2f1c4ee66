"""What ended a training run, named for the user: the exceptions of :mod:`composer_qsdp.recipes.train` and the
readers that find the cause inside what a failed step raised (a collective's timeout, a peer's exit, a full disk, an
unreadable or refused checkpoint)."""

from __future__ import annotations

import errno
import pickle
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from composer_qsdp.recipes.loader import RecipeError

if TYPE_CHECKING:
    from composer_qsdp.recipes.run_files import RunPaths

__all__ = ["PREEMPTED_MARK", "CollectiveTimeoutError", "PeerExitedError", "Preempted", "causes", "collective_timeout",
           "disk_full", "is_timeout", "peer_exit", "unreadable", "untrusted"]


class CollectiveTimeoutError(RuntimeError):
    """A collective waited ``dist_timeout`` seconds for the other processes: one stalled or died."""


class PeerExitedError(RuntimeError):
    """Another process of the job ended while this one waited for it in a collective; that process's own error (in
    its output, which the launcher prints) is the cause."""


#: The words of every :class:`Preempted` message after its rank, which each stopped process prints: a launch's log
#: that holds them stopped after saving (or saying why it could not), where the launcher's own traceback of its
#: SIGTERM would otherwise read as a failure.
PREEMPTED_MARK = "stopped by SIGTERM after batch"


class Preempted(Exception):
    """The run stopped on a signal after the batch its processes agreed on; the message names the signal, the batch
    and the checkpoint saved there (or that none was: no ``save_folder``)."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        #: The exit status a process stopped by ``signum`` reports: 128 + the signal's number, the shell's convention.
        self.status = 128 + signum


#: What gloo reports when the other end of a collective's connection is gone (its process ended).
_PEER_EXIT_MESSAGES = ("connection closed by peer", "connection reset by peer", "broken pipe")


def peer_exit(err: BaseException | None) -> str | None:
    """The message of ``err`` (or an exception it was raised from) if it says that a peer process's connection
    closed, else None."""
    while err is not None:
        if isinstance(err, RuntimeError) and any(m in str(err).lower() for m in _PEER_EXIT_MESSAGES):
            return str(err).splitlines()[0]
        err = err.__cause__ or err.__context__
    return None


#: How long a rank whose collective timed out waits for the other ranks' reports of theirs (seconds, at most).
_REPORT_GRACE_S = 10.0


def is_timeout(err: BaseException | None) -> bool:
    """Whether ``err`` (or an exception it was raised from) is a collective's timeout (gloo: "Timed out waiting
    ...ms for recv"; NCCL's watchdog: "... timeout ...")."""
    while err is not None:
        if isinstance(err, RuntimeError) and ("timed out" in str(err).lower() or "timeout" in str(err).lower()):
            return True
        err = err.__cause__ or err.__context__
    return False


def collective_timeout(err: BaseException, timeout_s: float) -> CollectiveTimeoutError | None:
    """A :class:`CollectiveTimeoutError` naming the ranks that did not answer, if ``err`` is a collective's timeout.

    Every rank whose collective timed out reports itself in the process group's rendezvous store and waits briefly
    for the others' reports: the ranks that never report are the stalled (or dead) ones. The store lives in rank 0;
    when rank 0 itself is the stalled one, the message says that it cannot tell.
    """
    if not is_timeout(err):
        return None
    import time
    from datetime import timedelta

    import torch.distributed as torch_dist

    from composer_qsdp.recipes.compat import default_store

    rank, world = torch_dist.get_rank(), torch_dist.get_world_size()
    grace = min(_REPORT_GRACE_S, timeout_s)
    try:
        store = default_store()
        store.set_timeout(timedelta(seconds=grace))
        store.set(f"composer_qsdp/timed_out/{rank}", "1")
        deadline = time.monotonic() + grace
        while True:
            silent = [r for r in range(world) if not store.check([f"composer_qsdp/timed_out/{r}"])]
            if not silent or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        who = (f"rank(s) {', '.join(map(str, silent))} of {world} did not answer: stalled (stopped, deadlocked, "
               "swapped out) or dead" if silent else "every rank reports the same timeout: the processes may wait in "
               "different collectives (a rank took another code path)")
    except Exception:  # noqa: BLE001 - the store itself does not answer: it is served by rank 0
        who = "which rank stalled is unknown: the rendezvous store (served by rank 0) does not answer either, so " \
              "rank 0 may be the stalled one"
    return CollectiveTimeoutError(
        f"rank {rank}: a collective waited dist_timeout={timeout_s:g} s for the other processes and timed out; {who}. "
        "If a step legitimately takes longer (a slow first step, a large checkpoint), raise the recipe key "
        "dist_timeout.")


#: What reading a truncated or corrupt checkpoint raises, by the first line of its message: torch.load's zip reader,
#: pickle, and torch.distributed.checkpoint's reads.
_UNREADABLE_MESSAGES = ("pytorchstreamreader", "unpickling", "ran out of input", "unexpected eof", "truncated",
                        "invalid load key", "corrupt")


def causes(err: BaseException | None) -> Iterator[BaseException]:
    """``err``, then what it was raised from; a ``torch.distributed.checkpoint`` ``CheckpointException``'s per-rank
    failures (and their causes) come before it."""
    while err is not None:
        for failure, _trace in getattr(err, "failures", {}).values():
            yield from causes(failure)
        yield err
        err = err.__cause__ or err.__context__


def unreadable(err: BaseException | None) -> str | None:
    """The first line of ``err`` or one of its :func:`causes` if it says a checkpoint file could not be read, else
    None."""
    for cause in causes(err):
        first = (str(cause).strip().splitlines() or [""])[0]
        if isinstance(cause, (EOFError, pickle.UnpicklingError)) or any(m in first.lower()
                                                                        for m in _UNREADABLE_MESSAGES):
            return f"{type(cause).__name__}: {first}"
    return None


def disk_full(err: BaseException, paths: RunPaths, metrics_file: str | None) -> RecipeError | None:
    """A :class:`RecipeError` naming the file, the recipe key that put it there and the bytes free on its disk, if
    ``err`` or one of its :func:`causes` is an ``ENOSPC`` ``OSError`` (a checkpoint or a metrics file that did not
    fit); else None. Without the error's own file name, the save folder is named."""
    full = next((c for c in causes(err) if isinstance(c, OSError) and c.errno == errno.ENOSPC), None)
    if full is None:
        return None
    path = Path(full.filename) if full.filename else paths.local_save_folder
    if path is None:
        return None  # nothing of the recipe's to name: the error as it is
    path = path.absolute()
    metrics = Path(metrics_file).absolute() if metrics_file is not None else None
    # The metrics file is written through a temporary file beside it (metrics.json.tmp).
    if metrics is not None and path.parent == metrics.parent and path.name.startswith(metrics.name):
        key = "metrics_file"
    elif paths.local_save_folder is not None and path.is_relative_to(paths.local_save_folder.absolute()):
        key = "save_folder"
    else:
        key = None
    existing = next(p for p in (path, *path.parents) if p.exists())
    usage = shutil.disk_usage(existing)
    return RecipeError(f"{f'recipe key {key!r}' if key else 'a file of the run'}: the disk is full: writing {path} "
                       f"failed with ENOSPC ({full.strerror}); {usage.free} bytes free of {usage.total} on the file "
                       f"system of {existing}. Free space there{f' or point {key} at another disk' if key else ''}")


def untrusted(err: BaseException | None) -> BaseException | None:
    """The :class:`~composer_qsdp.recipes.safe_load.UntrustedCheckpointError` among ``err`` and its
    :func:`causes` (a sharded load raises it inside a ``CheckpointException``), else None."""
    from composer_qsdp.recipes.safe_load import UntrustedCheckpointError

    return next((cause for cause in causes(err) if isinstance(cause, UntrustedCheckpointError)), None)
