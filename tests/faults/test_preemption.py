"""Preemption keeps the work (issue 51): SIGTERM to Composer's launcher in the middle of a 2-process recipe run
(``composer -n 2`` on CPU/gloo through tests/faults/fault_train.py). The launcher forwards it to each process; they
agree on one batch, save its checkpoint, and exit naming SIGTERM; autoresume continues from that checkpoint to the
losses of the uninterrupted run.

Five launches (about 25 s each on 2 CPU cores): ``slow``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from test_launcher_faults import BATCHES, SAVE_EVERY, _launch, _log, _overrides
from test_train import QSDP_RECIPE, train_losses, corpus_shards  # noqa: F401 (fixture)

pytestmark = [pytest.mark.slow, pytest.mark.requires_custom_comm]

#: The batch after which rank 1 signals the launcher: before the first scheduled checkpoint (batch 3).
SIGNAL_AT = 1


def test_sigterm_saves_the_batch_and_autoresume_continues_exactly(corpus_shards, tmp_path):
    ckpt = tmp_path / "ckpt"
    saving = [f"save_interval={SAVE_EVERY}ba", "run_name=preempted", "autoresume=true"]
    full = _launch(2, QSDP_RECIPE, _overrides(corpus_shards, tmp_path / "full", f"save_folder={tmp_path / 'f'}",
                                              *saving), tmp_path / "pids")
    assert full.returncode == 0, _log(full)

    batch = _stopped_and_saved(corpus_shards, tmp_path, ckpt, saving, "sigterm")
    assert sorted(train_losses(tmp_path / "stopped")) == list(range(batch))

    resumed = _launch(2, QSDP_RECIPE, _overrides(corpus_shards, tmp_path / "resumed", f"save_folder={ckpt}",
                                                 *saving), tmp_path / "pids")
    assert resumed.returncode == 0, _log(resumed)
    expected = train_losses(tmp_path / "full")
    assert train_losses(tmp_path / "resumed") == {b: expected[b] for b in range(batch, BATCHES)}


def test_sigterm_to_the_launcher_and_every_process_still_saves(corpus_shards, tmp_path):
    """A scheduler that signals every process of the job as well as the launcher (Slurm's ``scancel``): each process
    receives SIGTERM twice within milliseconds, its own and the launcher's, and must take them as one request."""
    _stopped_and_saved(corpus_shards, tmp_path, tmp_path / "ckpt", [f"save_interval={SAVE_EVERY}ba",
                                                                    "run_name=preempted"], "sigterm-all")


def test_sigterm_to_the_dataloader_workers_too_still_saves(corpus_shards, tmp_path):
    """A kill of the job's process group (or cgroup) signals the ranks' DataLoader workers as well: a worker ended
    by it would make its rank raise before the save, so the workers leave SIGTERM to their rank."""
    _stopped_and_saved(corpus_shards, tmp_path, tmp_path / "ckpt", [f"save_interval={SAVE_EVERY}ba",
                                                                    "run_name=preempted", "data.num_workers=2"],
                       "sigterm-tree")


def _stopped_and_saved(shards: Path, tmp_path: Path, ckpt: Path, saving: list[str], fault: str) -> int:
    """Launch the recipe with the SIGTERM ``fault`` sent by rank 1 after batch SIGNAL_AT; check that both processes
    name the signal and one batch, the job exits 143, and ``latest`` names that batch's complete checkpoint. Returns
    the batch."""
    stopped = _launch(2, QSDP_RECIPE, _overrides(shards, tmp_path / "stopped", f"save_folder={ckpt}", *saving),
                      tmp_path / "pids", f"{fault}:1:{SIGNAL_AT}")
    log = _log(stopped)
    assert (tmp_path / "pids" / "signalled").exists(), log
    assert stopped.returncode == 143, log
    # Both processes name the signal and the same batch; neither says that another process ended.
    reports = re.findall(r"rank (\d): stopped by SIGTERM after batch (\d+); checkpoint saved at (\S+): autoresume",
                         log)
    assert sorted(rank for rank, _, _ in reports) == ["0", "1"], log
    assert len({(batch, path) for _, batch, path in reports}) == 1, reports
    batch = int(reports[0][1])
    assert SIGNAL_AT <= batch < BATCHES, log  # mid-run: at the end of the batch the signal arrived in, or later
    assert "another process of the job ended" not in log
    assert reports[0][2] == str(ckpt / f"ep0-ba{batch}")
    assert os.readlink(ckpt / "latest-rank0.pt").startswith(f"ep0-ba{batch}")
    assert (ckpt / f"ep0-ba{batch}" / "checksums.json").is_file()
    return batch
