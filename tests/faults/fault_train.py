"""The recipe entrypoint (``composer_qsdp.recipes.train``) with one injected fault, for ``composer -n N`` (driven by the fault
tests)::

    QSDP_FAULT=stop:1:3 QSDP_FAULT_DIR=DIR composer -n 2 tests/faults/fault_train.py RECIPE.yaml [key=value ...]

``QSDP_FAULT`` is ``KIND:RANK:BATCH``; the process of global rank ``RANK``, after batch ``BATCH``:

* ``stop``: writes the time to ``QSDP_FAULT_DIR/stopped`` and stops itself with SIGSTOP (a stalled rank: alive,
  holding its sockets, answering nothing);
* ``kill-in-save``: writes its part of the (sharded) checkpoint of that batch, or half of the file of a DDP or full
  checkpoint (written by rank 0 alone), then writes the time to ``QSDP_FAULT_DIR/killed`` and kills itself with
  SIGKILL before the checkpoint is complete (no metadata, no ``latest`` link);
* ``raise``: writes the time to ``QSDP_FAULT_DIR/raised`` and raises a ``RuntimeError`` (an ordinary exception,
  e.g. a bug in a callback) while the other ranks go on into the next step's collectives; every process also holds
  a thread-pool task that never ends, as mosaicml-streaming's ``_ready_thread`` waiting for a shard that a dead
  peer was preparing, which interpreter exit would wait for forever;
* ``sigterm``: writes the time to ``QSDP_FAULT_DIR/signalled`` and sends SIGTERM to the launcher (its parent
  process), as a cluster scheduler preempting the job does; the launcher forwards it to every process;
* ``sigterm-all``: the same, and SIGTERM to every process of the job too (Slurm's ``scancel`` signals them all), so
  that each process receives it twice within milliseconds;
* ``sigterm-tree``: the same as ``sigterm-all``, and to every process the ranks started too (their ``DataLoader``
  workers), as a kill of the job's process group or cgroup does;
* ``slow-check``: (the third field is seconds, not a batch) takes that much longer over the recipe check, so that
  the other ranks reach a recipe error first.

Every process writes its pid to ``QSDP_FAULT_DIR/rank{RANK}.pid`` first, so the test can resume or kill it whatever
happens. Without ``QSDP_FAULT`` it is the plain entrypoint.
"""

from __future__ import annotations

import io
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any


def _die() -> None:
    """SIGKILL this process, first writing the time to ``QSDP_FAULT_DIR/killed``."""
    Path(os.environ["QSDP_FAULT_DIR"], "killed").write_text(str(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)


def _arm(kind: str, rank: int, batch: int) -> None:
    """Install the fault on this process (its rank's only)."""
    if int(os.environ["RANK"]) != rank:
        return
    if kind == "slow-check":
        # Nothing heavy is imported before the entrypoint's own recipe check, as in a plain run.
        import composer_qsdp.recipes.train

        check = composer_qsdp.recipes.train.load_recipe

        def slow_check(*args: Any, **kwargs: Any) -> Any:
            time.sleep(batch)
            return check(*args, **kwargs)

        composer_qsdp.recipes.train.load_recipe = slow_check
        return
    import composer
    import torch
    import torch.distributed.checkpoint as dist_cp
    from composer.core import Callback
    from composer.utils import checkpoint

    if kind == "kill-in-save":
        # Composer's sharded save writes through dist_cp.FileSystemWriter; this rank's data is on disk once its
        # write_data future completes, before the coordinator writes .metadata and Composer links 'latest'.
        original = dist_cp.FileSystemWriter.write_data

        def write_then_die(self: Any, plan: Any, planner: Any) -> Any:
            result = original(self, plan, planner)
            if f"ba{batch}" in os.fspath(self.path):
                result.wait()
                _die()
            return result

        dist_cp.FileSystemWriter.write_data = write_then_die

        # DDP (and full state dicts): rank 0 alone writes one file; die with half of it written.
        def half_then_die(state_dict: dict, filename: str) -> None:
            if f"ba{batch}" not in filename:
                return write_file(state_dict, filename)
            buffer = io.BytesIO()
            torch.save(state_dict, buffer)
            with open(filename, "wb") as f:
                f.write(buffer.getvalue()[: buffer.tell() // 2])
            _die()

        write_file = checkpoint._write_checkpoint_file
        checkpoint._write_checkpoint_file = half_then_die
        return
    if kind not in ("stop", "raise", "sigterm", "sigterm-all", "sigterm-tree"):
        raise ValueError(f"QSDP_FAULT kind {kind!r} is unknown; allowed: stop, kill-in-save, raise, sigterm, "
                         "sigterm-all, sigterm-tree, slow-check")

    class Fault(Callback):
        def batch_end(self, state: Any, logger: Any) -> None:
            if int(state.timestamp.batch) != batch:
                return
            if kind.startswith("sigterm"):
                fault_dir = Path(os.environ["QSDP_FAULT_DIR"])
                fault_dir.joinpath("signalled").write_text(str(time.time()))
                pids = [os.getppid()]
                if kind != "sigterm":
                    ranks = [int(path.read_text()) for path in sorted(fault_dir.glob("rank*.pid"))]
                    pids += ranks
                    if kind == "sigterm-tree":
                        import psutil

                        workers = [child.pid for pid in ranks for child in psutil.Process(pid).children(recursive=True)]
                        assert workers, "sigterm-tree: the ranks have no child processes (data.num_workers=0?)"
                        pids += workers
                for pid in pids:
                    os.kill(pid, signal.SIGTERM)
                return
            if kind == "raise":
                Path(os.environ["QSDP_FAULT_DIR"], "raised").write_text(str(time.time()))
                raise RuntimeError(f"injected fault: rank {rank} raises after batch {batch}")
            Path(os.environ["QSDP_FAULT_DIR"], "stopped").write_text(str(time.time()))
            os.kill(os.getpid(), signal.SIGSTOP)

    # The recipe builds the Trainer itself: add the callback to its arguments.
    init = composer.Trainer.__init__

    def with_fault(self: Any, *args: Any, callbacks: Any = None, **kwargs: Any) -> None:
        init(self, *args, callbacks=[*(callbacks or []), Fault()], **kwargs)

    composer.Trainer.__init__ = with_fault


def _hold_a_pool_thread() -> None:
    """Start a non-daemon thread-pool task that never ends (see ``raise`` in the module docstring)."""
    from concurrent.futures import ThreadPoolExecutor

    ThreadPoolExecutor(1, thread_name_prefix="never-ends").submit(threading.Event().wait)


def main() -> int:
    from composer_qsdp.recipes.train import main as train_main

    fault_dir = os.environ.get("QSDP_FAULT_DIR")
    if fault_dir:
        Path(fault_dir, f"rank{os.environ['RANK']}.pid").write_text(str(os.getpid()))
    fault = os.environ.get("QSDP_FAULT")
    if fault:
        kind, rank, batch = fault.split(":")
        if kind == "raise":
            _hold_a_pool_thread()
        _arm(kind, int(rank), int(batch))
    return train_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
