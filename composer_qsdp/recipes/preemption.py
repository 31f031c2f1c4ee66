"""Preemption keeps the work: on SIGTERM a recipe run saves a checkpoint at the end of the batch it is in, then
stops (recipe key ``save_on_sigterm``, on by default).

A signal handler runs between two Python bytecodes, in the middle of a forward pass or a collective, where nothing
can be saved. The handler only sets a flag; at the next ``Event.BATCH_END`` every process contributes its flag to
one all-reduce (MAX), so all of them agree on the batch to stop at although the signal reaches them at different
moments (Composer's launcher, itself SIGTERMed, forwards SIGTERM to each process in turn; a cluster scheduler
signals each process on its own). At that batch's ``Event.BATCH_CHECKPOINT`` Composer's own ``CheckpointSaver``
saves as at any scheduled checkpoint (its ``latest`` link, then the manifest and the owner record of the callbacks
after it), and :class:`Preempted` ends ``fit``. The flags travel as a CPU tensor over a gloo group of their own, so
the agreement adds no host-device synchronization to a GPU run's batch (an NCCL all-reduce read back on the host
would wait for the batch's kernels); its all-reduce waits ``dist_timeout`` for a silent peer, as the run's other
collectives do. Composer's launcher SIGKILLs its processes 30 s after it forwarded the signal, so the save must fit in
that time.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any, Callable

import torch
import torch.distributed as torch_dist
from composer.core import Callback, Event, State
from composer.loggers import Logger
from composer.utils import dist

from composer_qsdp.recipes.failures import PREEMPTED_MARK, Preempted

__all__ = ["SigtermCheckpoint"]

#: Seconds after a process's first SIGTERM within which another is the same request, not a second one.
_REPEAT_WINDOW_S = 5.0


class SigtermCheckpoint(Callback):
    """Stops the run at the end of the batch in which any process received SIGTERM, after Composer's
    ``CheckpointSaver`` ``saver`` (None: the run saves none) saved that batch; must run after the saver and the
    callbacks that act on its saves (append it last to ``state.callbacks`` once the Trainer is built). The handler is
    live inside :meth:`handling` only. ``dist_timeout`` (seconds) bounds the flags' all-reduce, as the run's process
    group bounds its collectives."""

    def __init__(self, saver: Any | None, dist_timeout: float) -> None:
        self.saver = saver
        self.dist_timeout = dist_timeout
        self.stopping = False  # every process's agreement, from BATCH_END's all-reduce
        self._group: Any | None = None  # the gloo group of that all-reduce
        self._first_signal: float | None = None  # when the handler first ran (time.monotonic(), seconds)
        if saver is not None:
            # The saver's schedule is a public attribute (a callable of state and event): wrapping it makes the
            # agreed batch one more scheduled checkpoint, saved by Composer's own code.
            scheduled: Callable[[State, Event], bool] = saver.save_interval
            saver.save_interval = lambda state, event: self.stopping or scheduled(state, event)

    @property
    def received(self) -> bool:
        """This process's flag: whether the handler has run."""
        return self._first_signal is not None

    @contextlib.contextmanager
    def handling(self) -> Iterator[None]:
        """Install the SIGTERM handler for the block (``trainer.fit``); the previous one (Composer's: ``sys.exit``)
        is restored after it. A SIGTERM more than ``_REPEAT_WINDOW_S`` after the first goes to the previous one,
        so that a second request still ends a run whose save hangs; those within it are the same request arriving
        twice (a scheduler that signals every process of the job and the launcher, which forwards its own). The gloo
        group of the flags' all-reduce ends with the block too."""
        previous = signal.getsignal(signal.SIGTERM)

        def handler(signum: int, frame: FrameType | None) -> None:
            now = time.monotonic()
            if self._first_signal is None:
                self._first_signal = now
            elif now - self._first_signal > _REPEAT_WINDOW_S and callable(previous):
                previous(signum, frame)

        signal.signal(signal.SIGTERM, handler)
        try:
            yield
        except Preempted:
            self._end_group()  # every process stopped after the same batch
            raise
        except BaseException:
            # A failed process ends now, and its group with it; tearing the group down could wait on a peer that
            # stalled or died, which is what failed.
            self._group = None
            raise
        else:
            self._end_group()
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _end_group(self) -> None:
        """Destroy the flags' gloo group, whose sockets and threads would otherwise outlive the run (one more group
        for each run of a process)."""
        if self._group is not None:
            torch_dist.destroy_process_group(self._group)
            self._group = None

    def run_event(self, event: Event, state: State, logger: Logger) -> None:
        if event == Event.BATCH_END:
            self.stopping = self._anyone_received()
        elif event == Event.BATCH_CHECKPOINT and self.stopping:
            batch = int(state.timestamp.batch)
            saved = self._saved(state)
            raise Preempted(f"rank {dist.get_global_rank()}: {PREEMPTED_MARK} {batch}; "
                            + (f"checkpoint saved at {saved}: autoresume (or load_path) continues from it"
                               if saved else "no checkpoint saved (no save_folder): the batches trained are lost"),
                            signal.SIGTERM)

    def _anyone_received(self) -> bool:
        """Whether any process received SIGTERM: this process's flag, MAX-reduced over a gloo group on the CPU (made
        at the first batch end of :meth:`handling`'s block, when every process reaches it in the same order; none for
        one process)."""
        if not torch_dist.is_available() or not torch_dist.is_initialized() or torch_dist.get_world_size() == 1:
            # One process's flag is the maximum; a gloo group of one would only be one more to tear down, and
            # torch 2.7's gloo shutdown has hung there.
            return self.received
        if self._group is None:
            # A new group does not inherit the default group's timeout: it would wait torch's default (30 min) here
            # for a peer stopped after its step, the first wait of a stalled run, instead of timing out after
            # dist_timeout into the report that names the silent rank.
            self._group = torch_dist.new_group(backend="gloo", timeout=timedelta(seconds=self.dist_timeout))
        flag = torch.tensor([int(self.received)], dtype=torch.int32)
        torch_dist.all_reduce(flag, op=torch_dist.ReduceOp.MAX, group=self._group)
        return bool(flag.item())

    def _saved(self, state: State) -> Path | None:
        """Where the checkpoint of this batch lies (a sharded one's folder), as process 0's saver recorded it; None
        when none was saved."""
        if self.saver is None or self.saver.last_checkpoint_batch != state.timestamp.batch:
            return None
        path: list[Any] = [None]
        if dist.get_global_rank() == 0 and self.saver.saved_checkpoints:
            path[0] = str(self.saver.saved_checkpoints[-1])
        dist.broadcast_object_list(path, src=0)
        if path[0] is None:
            return None
        return Path(path[0]).parent if state.fsdp_sharded_state_dict_enabled else Path(path[0])
