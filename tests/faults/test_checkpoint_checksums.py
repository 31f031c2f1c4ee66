"""Damaged checkpoints of the recipe entrypoint: each checkpoint gets a SHA-256 manifest when it is saved, and a
resume refuses a checkpoint whose files differ from it (flipped bytes inside a shard, a truncated shard), or, for a
checkpoint without a manifest, one whose ``.metadata`` or shards cannot be read in full, naming the file and an
earlier checkpoint to resume from. One process, in-process (``main``): one short run, then resumes that fail
before training."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from composer_qsdp.recipes.checksums import CorruptCheckpointError, manifest_path, verify_checkpoint
from composer_qsdp.recipes.train import RECIPE_ERROR_STATUS, main
from test_train import BASELINE, tiny_overrides, corpus_shards  # noqa: F401 (fixture)

COMMON = ["max_duration=4ba", "eval_interval=4ba"]


@pytest.fixture(scope="module")
def saved(corpus_shards, tmp_path_factory) -> Path:
    """A run's save folder with sharded checkpoints after batches 2 and 4."""
    run = tmp_path_factory.mktemp("saved")
    assert main([str(BASELINE), *tiny_overrides(corpus_shards, run, *COMMON, f"save_folder={run / 'ckpt'}",
                                                "save_interval=2ba")]) == 0
    return run / "ckpt"


def test_each_checkpoint_gets_a_manifest_of_all_its_files(saved):
    for name in ("ep0-ba2", "ep0-ba4"):
        manifest = json.loads(manifest_path(saved / name).read_text())
        files = sorted(p.name for p in (saved / name).iterdir() if p.name != "checksums.json")
        assert sorted(manifest["files"]) == files and ".metadata" in files and "__0_0.distcp" in files
        assert all(entry["bytes"] == (saved / name / file).stat().st_size for file, entry in manifest["files"].items())
    assert verify_checkpoint(saved / "latest-rank0.pt")  # the link: the checkpoint it names


def _damaged(saved: Path, tmp_path: Path, file: str, damage: str, manifest: bool = True) -> Path:
    """A copy of the save folder whose newest checkpoint's ``file`` is damaged: a byte in its middle flipped
    (``flip``) or its second half cut (``truncate``)."""
    folder = tmp_path / "ckpt"
    shutil.copytree(saved, folder, symlinks=True)
    path = folder / "ep0-ba4" / file
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x01
    else:
        del data[len(data) // 2:]
    path.write_bytes(bytes(data))
    if not manifest:
        manifest_path(folder / "ep0-ba4").unlink()
    return folder


@pytest.mark.parametrize("file,damage,manifest,why", [
    ("__0_0.distcp", "flip", True, r"is corrupt \(its SHA-256 differs from the one recorded when it was written"),
    ("__0_0.distcp", "truncate", True, r"is truncated or corrupt \(\d+ bytes; \d+ were written"),
    (".metadata", "truncate", False, r"is truncated or corrupt \(UnpicklingError"),
    ("__0_0.distcp", "truncate", False, r"is truncated or corrupt \(\d+ bytes; .metadata places data up to byte"),
])
def test_a_damaged_checkpoint_is_refused_naming_the_file(corpus_shards, saved, tmp_path, capsys, file, damage,
                                                         manifest, why):
    folder = _damaged(saved, tmp_path, file, damage, manifest)
    run = [f"save_folder={folder}", "autoresume=true"]
    assert main([str(BASELINE), *tiny_overrides(corpus_shards, tmp_path, *COMMON, *run)]) == RECIPE_ERROR_STATUS
    error = capsys.readouterr().err
    assert "recipe key 'autoresume'" in error and f"checkpoint file {folder / 'ep0-ba4' / file} " in error, error
    assert f"load_path={folder / 'ep0-ba2'}" in error, error  # the earlier checkpoint to resume from
    assert re.search(why, error), error


def test_a_save_folder_with_a_placeholder_is_checked_where_composer_resumes_from(corpus_shards, saved, tmp_path,
                                                                                  capsys):
    """``save_folder: DIR/{run_name}/ckpt``: the manifest check looks in the folder the Trainer formats and resumes
    from (issue 51: it looked for the format string, found no checkpoint, and the flipped shard loaded)."""
    run_name = "gpt-tiny-baseline"  # BASELINE's
    folder = _damaged(saved, tmp_path / run_name, "__0_0.distcp", "flip")
    run = [f"save_folder={tmp_path}/{{run_name}}/ckpt", f"run_name={run_name}", "autoresume=true"]
    assert main([str(BASELINE), *tiny_overrides(corpus_shards, tmp_path, *COMMON, *run)]) == RECIPE_ERROR_STATUS
    error = capsys.readouterr().err
    assert f"recipe key 'autoresume' (the checkpoint {folder / 'latest-rank0.pt'} names): checkpoint file " \
           f"{folder / 'ep0-ba4' / '__0_0.distcp'} is corrupt" in error, error


@pytest.mark.parametrize("change, why", [
    (lambda files: {}, "lists no files"),
    (lambda files: {k: v for k, v in files.items() if k != "__0_0.distcp"},
     "does not list __0_0.distcp of the checkpoint, so it cannot vouch for it"),
    (lambda files: {**files, "../ep0-ba2/__0_0.distcp": files["__0_0.distcp"]},
     "names '../ep0-ba2/__0_0.distcp', a path outside the checkpoint's folder"),
    (lambda files: {**files, "/etc/hostname": files["__0_0.distcp"]}, "names '/etc/hostname', a path outside"),
    (lambda files: {**files, "__0_0.distcp": {"bytes": "12"}}, "is unreadable (the entry of '__0_0.distcp' is"),
])
def test_a_manifest_that_cannot_vouch_for_its_checkpoint_is_refused(saved, tmp_path, change, why):
    """A manifest is trusted only where it lists every file of the checkpoint by its name in the checkpoint's
    folder: an empty or partial map would leave files unchecked (issue 51), a path elsewhere check another file."""
    folder = tmp_path / "ckpt"
    shutil.copytree(saved, folder, symlinks=True)
    manifest = manifest_path(folder / "ep0-ba4")
    content = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**content, "files": change(content["files"])}))
    with pytest.raises(CorruptCheckpointError, match=re.escape(f"the checksum manifest {manifest} {why}")):
        verify_checkpoint(folder / "ep0-ba4")
    assert verify_checkpoint(folder / "ep0-ba2")  # the other checkpoint's manifest is whole
