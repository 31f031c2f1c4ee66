"""An in-process run leaves nothing of its data behind, however it ends: the prefetch threads of its streaming
datasets stop and their shared memory is freed when a run stops mid-epoch, is preempted, fails while training or
fails on its data, so that runs in one process (the test suite, a notebook) keep a constant number of open files.
Before, each run left its datasets' threads waiting and their shared memory open, and every later dataset attached
to it too: the suite reached the open-file limit (EMFILE)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from composer.core import Event
from test_train import BASELINE, corpus_shards, tiny_overrides  # noqa: F401 (fixture)

from composer_qsdp.recipes.preemption import SigtermCheckpoint
from composer_qsdp.recipes.train import RECIPE_ERROR_STATUS, main

#: The epoch holds hundreds of batches: every run stops inside it, both datasets' threads still prefetching.
MID_EPOCH = ["max_duration=2ba", "eval_interval=2ba"]
#: Descriptors a run may leave open (none is expected; Python's own, such as a lazily opened file, may come and go).
SLACK = 2


def _open_files(others: set[str]) -> int:
    """This process's open descriptors, less those on the shared memory named ``others`` (in ``/dev/shm``).

    A new streaming dataset attaches to the shared memory of each live dataset on the host whose prefix streaming
    does not see as taken (built, not read yet: in another test or another process) and keeps it open until exit;
    those descriptors are streaming's doing, not a run's.
    """
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:  # the listing's own descriptor, closed since
            continue
        if not (target.startswith("/dev/shm/") and Path(target.removesuffix(" (deleted)")).name in others):
            count += 1
    return count


def _prefetching() -> list[str]:
    """Where threads run streaming's prepare or ready loop (``StreamingDataset.__iter__``'s threads)."""
    found = []
    for frame in sys._current_frames().values():
        while frame is not None:
            if frame.f_code.co_name in ("_prepare_thread", "_ready_thread") and "streaming" in frame.f_code.co_filename:
                found.append(f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
            frame = frame.f_back
    return found


def _run(shards: Path, folder: Path, *extra: str) -> int:
    return main([str(BASELINE), *tiny_overrides(shards, folder, *MID_EPOCH, *extra)])


def _at_first_batch_end(monkeypatch: pytest.MonkeyPatch, act: Callable[[], None]) -> None:
    """Call ``act()`` at the first batch end of the next run, from its SIGTERM callback (every recipe run has one),
    before the callback's own work."""
    run_event = SigtermCheckpoint.run_event

    def acting(self: SigtermCheckpoint, event: Event, state: Any, logger: Any) -> None:
        if event == Event.BATCH_END and int(state.timestamp.batch) == 1:
            act()
        run_event(self, event, state, logger)

    monkeypatch.setattr(SigtermCheckpoint, "run_event", acting)


def _fail() -> None:
    raise RuntimeError("a failure in the middle of training")


def test_a_one_process_run_makes_no_group_for_the_sigterm_flags(corpus_shards, tmp_path, monkeypatch):
    """The flags' MAX over one process is its own flag: no gloo group to make and tear down (a teardown that hung on
    torch 2.7), and a SIGTERM still stops the run after a checkpoint."""
    groups = []
    received = SigtermCheckpoint._anyone_received

    def recording(self: SigtermCheckpoint) -> bool:
        answer = received(self)
        groups.append(self._group)
        return answer

    monkeypatch.setattr(SigtermCheckpoint, "_anyone_received", recording)
    _at_first_batch_end(monkeypatch, lambda: os.kill(os.getpid(), signal.SIGTERM))
    assert _run(corpus_shards, tmp_path / "one", f"save_folder={tmp_path / 'ckpt'}") == 128 + signal.SIGTERM
    assert groups and all(group is None for group in groups)
    assert (tmp_path / "ckpt" / "ep0-ba1").is_dir()


def test_runs_that_stop_mid_epoch_leave_no_threads_and_no_open_files(corpus_shards, tmp_path, monkeypatch):
    others = set(os.listdir("/dev/shm"))
    assert _run(corpus_shards, tmp_path / "warm-up") == 0  # what stays open for good: imports, the process group
    assert not _prefetching()
    assert _run(corpus_shards, tmp_path / "again") == 0
    assert not _prefetching()
    baseline = _open_files(others)

    assert _run(corpus_shards, tmp_path / "third") == 0
    assert not _prefetching()
    assert _open_files(others) <= baseline + SLACK

    with monkeypatch.context() as patch:  # preempted: SIGTERM, a checkpoint, then Preempted out of fit
        _at_first_batch_end(patch, lambda: os.kill(os.getpid(), signal.SIGTERM))
        assert _run(corpus_shards, tmp_path / "preempted", f"save_folder={tmp_path / 'ckpt'}") == 128 + signal.SIGTERM
    assert (tmp_path / "ckpt" / "ep0-ba1").is_dir()  # saved before the datasets were released
    assert not _prefetching()
    assert _open_files(others) <= baseline + SLACK

    with monkeypatch.context() as patch:
        _at_first_batch_end(patch, _fail)
        with pytest.raises(RuntimeError, match="a failure in the middle of training"):
            _run(corpus_shards, tmp_path / "failed")
    assert not _prefetching()
    assert _open_files(others) <= baseline + SLACK

    # Its data fails the model (token ids above its vocabulary) once the first dataset is built: a recipe error.
    assert _run(corpus_shards, tmp_path / "refused", "model.vocab_size=100") == RECIPE_ERROR_STATUS
    assert _open_files(others) <= baseline + SLACK
