"""Autoresume after a process died while a checkpoint was written (fast: the folder logic; the real kill is in
test_launcher_faults.py): what is newer than the checkpoint ``latest`` names is set aside, nothing is deleted."""

from __future__ import annotations

import os
from pathlib import Path

from composer_qsdp.recipes.train import set_aside_incomplete_checkpoints


def _folder(tmp_path: Path, latest: str | None) -> Path:
    folder = tmp_path / "ckpt"
    for name in ("ep0-ba3", "ep0-ba6", "ep1-ba12"):  # sharded checkpoints: folders
        (folder / name).mkdir(parents=True)
        (folder / name / "__0_0.distcp").write_bytes(b"x")
    for name in ("ep0-ba3-rank0.pt", "ep0-ba6-rank0.pt", "notes.txt", "ep0-ba9.yaml"):  # DDP files, others
        (folder / name).write_bytes(b"y")
    if latest is not None:
        os.symlink(latest, folder / "latest-rank0.pt")
    return folder


def test_checkpoints_newer_than_latest_are_set_aside(tmp_path):
    folder = _folder(tmp_path, "ep0-ba3")
    moved = set_aside_incomplete_checkpoints(folder)
    assert sorted(p.name for p in moved) == ["ep0-ba6-rank0.pt.incomplete", "ep0-ba6.incomplete", "ep1-ba12.incomplete"]
    assert sorted(p.name for p in folder.iterdir()) == [
        "ep0-ba3", "ep0-ba3-rank0.pt", "ep0-ba6-rank0.pt.incomplete", "ep0-ba6.incomplete", "ep0-ba9.yaml",
        "ep1-ba12.incomplete", "latest-rank0.pt", "notes.txt"]
    assert (folder / "ep0-ba6.incomplete" / "__0_0.distcp").read_bytes() == b"x"  # moved, not deleted
    # Set aside again after another interruption: the earlier remains keep their names.
    (folder / "ep0-ba6").mkdir()
    assert [p.name for p in set_aside_incomplete_checkpoints(folder)] == ["ep0-ba6.incomplete1"]


def test_nothing_moves_when_latest_is_the_newest(tmp_path):
    folder = _folder(tmp_path, "ep1-ba12")
    assert set_aside_incomplete_checkpoints(folder) == []


def test_without_latest_every_checkpoint_is_incomplete(tmp_path):
    # The process died during the run's first save: Composer never linked 'latest'.
    folder = _folder(tmp_path, None)
    assert len(set_aside_incomplete_checkpoints(folder)) == 5
    assert set_aside_incomplete_checkpoints(tmp_path / "absent") == []


def test_a_latest_link_of_another_naming_leaves_the_folder_alone(tmp_path):
    folder = _folder(tmp_path, "custom-name")
    assert set_aside_incomplete_checkpoints(folder) == []
