"""A save folder belongs to one run, and a logger writes no file that the run did not create (issue 51): the first
save records the run (run.json: run_name, run id, the files its loggers write); a new run refuses a folder that
another run owns, or that holds checkpoints of an unrecorded one, naming both runs, unless it continues that run
(autoresume under its name, load_path to one of its checkpoints) or takes the folder over (save_overwrite); a
logger's existing file is written only where this run wrote it before. One process, in-process (``main``)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from composer_qsdp.recipes.metrics_file import MetricsFile
from composer_qsdp.recipes.resume import NO_COMPLETE_CHECKPOINT
from composer_qsdp.recipes.run_files import OWNER_FILE
from composer_qsdp.recipes.train import RECIPE_ERROR_STATUS, main
from test_train import BASELINE, corpus_shards, tiny_overrides, train_losses  # noqa: F401 (fixture)

COMMON = ["max_duration=2ba", "eval_interval=2ba", "save_interval=2ba"]


def _run(shards: Path, run_dir: Path, *extra: str) -> int:
    return main([str(BASELINE), *tiny_overrides(shards, run_dir, *COMMON, *extra)])


@pytest.fixture(scope="module")
def owned(corpus_shards, tmp_path_factory) -> Path:
    """The save folder of a run named 'first' after its checkpoint at batch 2, with a FileLogger's log."""
    run = tmp_path_factory.mktemp("owned")
    assert _run(corpus_shards, run, f"save_folder={run / 'ckpt'}", "run_name=first",
                f"loggers.file.filename={run}/log-{{run_name}}-rank{{rank}}.txt", "loggers.file.overwrite=true") == 0
    return run


def _copy(owned: Path, tmp_path: Path) -> Path:
    shutil.copytree(owned, tmp_path / "owned", symlinks=True)
    return tmp_path / "owned" / "ckpt"


def _contents(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}


def test_the_first_save_records_the_run_and_its_files(owned):
    record = json.loads((owned / "ckpt" / OWNER_FILE).read_text())
    assert record["run_name"] == "first" and re.fullmatch(r"[0-9a-f]{32}", record["run_id"])
    # The FileLogger's file (formatted) and the metrics file.
    assert record["files"] == [str(owned / "log-first-rank0.txt"), str(owned / "metrics.json")]


@pytest.mark.parametrize("run, why", [
    (["run_name=second"], "this run 'second' is a new run (not an autoresume)"),
    (["run_name=second", "autoresume=true"], "this run 'second' resumes only the run it is named after"),
    (["run_name=null"], "is a new run (not an autoresume)"),  # Composer's generated name
    (["run_name=first"], "this run 'first' is a new run (not an autoresume)"),
])
def test_a_new_run_refuses_a_folder_that_another_run_owns(corpus_shards, owned, tmp_path, capsys, run, why):
    folder = _copy(owned, tmp_path)
    before = _contents(folder)
    assert _run(corpus_shards, tmp_path, f"save_folder={folder}", *run) == RECIPE_ERROR_STATUS
    error = capsys.readouterr().err
    run_id = json.loads((folder / OWNER_FILE).read_text())["run_id"]
    assert (f"recipe error: recipe key 'save_folder' = '{folder}': the folder belongs to run 'first' (run id "
            f"{run_id}, recorded in {folder / OWNER_FILE}); ") in error, error
    assert why in error and "set save_overwrite: true to take the folder over" in error, error
    assert _contents(folder) == before  # nothing written, nothing set aside


def test_a_placeholder_folder_is_claimed_where_composer_writes(corpus_shards, owned, tmp_path, capsys):
    """save_folder: DIR/{run_name}: a run named 'owned' writes into DIR/owned, which 'first' owns."""
    folder = _copy(owned, tmp_path)
    shutil.move(folder, tmp_path / "owned-ckpt")
    assert _run(corpus_shards, tmp_path, f"save_folder={tmp_path}/{{run_name}}-ckpt", "run_name=owned") == 2
    assert f"'{tmp_path / 'owned-ckpt'}': the folder belongs to run 'first'" in capsys.readouterr().err


def test_the_same_run_continues_and_save_overwrite_takes_the_folder_over(corpus_shards, owned, tmp_path):
    folder = _copy(owned, tmp_path)
    record = json.loads((folder / OWNER_FILE).read_text())
    # Its autoresume: the log that it recorded may be truncated again (and the metrics file, one a metrics file
    # wrote, replaced).
    recorded_log = [f"loggers.file.filename={owned}/log-{{run_name}}-rank{{rank}}.txt", "loggers.file.overwrite=true"]
    assert _run(corpus_shards, tmp_path, f"save_folder={folder}", "run_name=first", "autoresume=true",
                "max_duration=4ba", "save_interval=4ba", *recorded_log) == 0
    assert (folder / "ep0-ba4").is_dir()
    # A run that loads one of its checkpoints continues it too, under any name.
    assert _run(corpus_shards, tmp_path, f"save_folder={folder}", "run_name=other", f"load_path={folder / 'ep0-ba4'}",
                "max_duration=6ba", "save_interval=6ba") == 0
    assert json.loads((folder / OWNER_FILE).read_text())["run_id"] == record["run_id"]  # still that run's folder
    assert _run(corpus_shards, tmp_path, f"save_folder={folder}", "run_name=second", "save_overwrite=true") == 0
    taken = json.loads((folder / OWNER_FILE).read_text())
    assert taken["run_name"] == "second" and taken["run_id"] != record["run_id"]


def test_a_folder_with_checkpoints_of_an_unrecorded_run_takes_continuations_only(corpus_shards, owned, tmp_path,
                                                                                   capsys):
    folder = _copy(owned, tmp_path)
    (folder / OWNER_FILE).unlink()  # a folder written before runs were recorded
    assert _run(corpus_shards, tmp_path, f"save_folder={folder}", "run_name=second") == RECIPE_ERROR_STATUS
    assert (f"recipe key 'save_folder' = '{folder}': the folder holds checkpoints (ep0-ba2) of a run that recorded "
            f"no owner ({OWNER_FILE}); this run 'second' would write its own beside them") in capsys.readouterr().err
    assert _run(corpus_shards, tmp_path, f"save_folder={folder}", "run_name=second", "autoresume=true",
                "max_duration=4ba", "save_interval=4ba") == 0
    assert json.loads((folder / OWNER_FILE).read_text())["run_name"] == "second"


@pytest.mark.parametrize("logger", ["file", "metrics_file"])
def test_a_logger_does_not_truncate_a_file_this_run_did_not_create(corpus_shards, tmp_path, capsys, logger):
    victim = tmp_path / "notes.txt"
    victim.write_text("precious")
    if logger == "file":
        extra = f"loggers.file={{filename: '{victim}', overwrite: true}}"
        expected = (f"recipe key 'loggers.file.filename' = '{victim}': the file exists and this run did not create "
                    "it (without a local save_folder no run records its files); the FileLogger would truncate it")
    else:
        extra = f"metrics_file={victim}"
        expected = (f"recipe key 'metrics_file' = '{victim}': the file exists and is not a metrics file (a JSON "
                    f"object with the keys {', '.join(MetricsFile.KEYS)}); the metrics file would replace it")
    assert _run(corpus_shards, tmp_path, "save_folder=null", extra) == RECIPE_ERROR_STATUS
    assert f"recipe error: {expected}: choose a path that does not exist, or remove the file" in \
        capsys.readouterr().err
    assert victim.read_text() == "precious"


def test_the_machine_check_sees_the_formatted_save_folder(tmp_path, monkeypatch):
    """Before any process group: a save_folder with {run_name} is checked as the folder the Trainer will use (here a
    file, so no folder), not as the format string's nearest existing parent."""
    from composer_qsdp.recipes.loader import check_machine
    from composer_qsdp.recipes.train import RecipeError, load_recipe

    (tmp_path / "named").write_text("a file where the folder would be")
    remote = "data.remote=s3://bucket/wiki-gpt2-t64"  # no local shards to look for (data/ exists after make demo)
    recipe = load_recipe(BASELINE, [f"save_folder={tmp_path}/{{run_name}}", "run_name=named", remote])
    with pytest.raises(RecipeError, match=re.escape(f"recipe key 'save_folder' = '{tmp_path / 'named'}' is invalid; "
                                                    f"it: '{tmp_path / 'named'}' is a file, not a folder")):
        check_machine(recipe)
    monkeypatch.setenv("COMPOSER_RUN_NAME", "other")  # Composer's name for a run without run_name
    check_machine(load_recipe(BASELINE, [f"save_folder={tmp_path}/{{run_name}}", "run_name=null", remote]))
    monkeypatch.setenv("COMPOSER_RUN_NAME", "named")
    with pytest.raises(RecipeError, match="is a file, not a folder"):
        check_machine(load_recipe(BASELINE, [f"save_folder={tmp_path}/{{run_name}}", "run_name=null", remote]))


def test_autoresume_without_latest_link_resumes_from_the_newest_verified_checkpoint(corpus_shards, tmp_path, capsys):
    """A folder whose latest-rank0.pt link is gone (deleted, or a copy that dropped symlinks): autoresume links the
    newest checkpoint that its manifest verifies (batch 2: batch 4's manifest is gone, as after a death between the
    save and the manifest) and continues the run exactly; with no verified checkpoint it refuses, naming the folder,
    instead of starting again from batch 0."""
    folder = tmp_path / "ckpt"
    common = ["max_duration=4ba", "eval_interval=4ba", f"save_folder={folder}", "run_name=linked", "autoresume=true"]
    assert _run(corpus_shards, tmp_path / "full", *common) == 0
    full = train_losses(tmp_path / "full")
    (folder / "latest-rank0.pt").unlink()
    (folder / "ep0-ba4" / "checksums.json").unlink()
    kept = tmp_path / "kept"
    shutil.copytree(folder, kept, symlinks=True)

    with pytest.warns(UserWarning, match="linked it to ep0-ba2, the newest checkpoint that its checksum manifest "
                                         "verifies"):
        assert _run(corpus_shards, tmp_path / "resumed", *common) == 0
    assert train_losses(tmp_path / "resumed") == {b: full[b] for b in (2, 3)}

    (kept / "ep0-ba2" / "checksums.json").unlink()
    before = _contents(kept)
    assert _run(corpus_shards, tmp_path / "refused", *common[:2], f"save_folder={kept}", *common[3:]) == \
        RECIPE_ERROR_STATUS
    err = capsys.readouterr().err
    assert f"save_folder {kept} holds checkpoint(s) ep0-ba4, ep0-ba2 but no latest-rank0.pt link" in err, err
    assert "autoresume would start again from batch 0" in err
    assert NO_COMPLETE_CHECKPOINT in err  # what the convergence driver reads to start such an arm again
    assert _contents(kept) == before  # nothing linked, nothing set aside


def test_rerunning_a_finished_run_trains_nothing_and_changes_nothing(corpus_shards, tmp_path, capsys):
    """A requeued or rerun job whose autoresume checkpoint is at max_duration exits 0 saying so, instead of
    Composer's "no training would occur" traceback, and leaves its checkpoints and metrics as they were; a larger
    max_duration trains on from there."""
    run = tmp_path / "run"
    common = [f"save_folder={run / 'ckpt'}", "run_name=done", "autoresume=true"]
    assert _run(corpus_shards, run, *common) == 0
    before, metrics = _contents(run), (run / "metrics.json").read_text()
    capsys.readouterr()
    assert _run(corpus_shards, run, *common) == 0
    out = capsys.readouterr().out
    assert "run done: already trained 2 batches, at or past max_duration=2ba" in out
    assert "nothing to train (a larger max_duration trains on)" in out
    assert _contents(run) == before and (run / "metrics.json").read_text() == metrics
    assert _run(corpus_shards, run, *common[:2], "run_name=done", "autoresume=true", "max_duration=3ba",
                "save_interval=1ba") == 0
    assert list(train_losses(run)) == [2]  # the one batch past the checkpoint


@pytest.mark.parametrize("target", ["checkpoint", "metrics_file"])
def test_a_full_disk_is_named(corpus_shards, tmp_path, monkeypatch, capsys, target):
    """ENOSPC while a checkpoint shard or the metrics file is written: a recipe error naming the key, the file and
    the bytes free on its disk, not a traceback from inside torch.distributed.checkpoint."""
    import errno
    import os

    import torch.distributed.checkpoint as dist_cp

    def no_space(path: os.PathLike) -> OSError:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(path))

    if target == "checkpoint":
        def write_data(self, plan, planner):  # the sharded writer's data files
            raise no_space(Path(self.path) / "__0_0.distcp")

        monkeypatch.setattr(dist_cp.FileSystemWriter, "write_data", write_data)
        key, path = "save_folder", tmp_path / "ckpt" / "ep0-ba2" / "__0_0.distcp"
    else:
        write_text = Path.write_text

        def full_metrics(self: Path, *args, **kwargs):
            if self.name == "metrics.json.tmp":
                raise no_space(self)
            return write_text(self, *args, **kwargs)

        monkeypatch.setattr(Path, "write_text", full_metrics)
        key, path = "metrics_file", tmp_path / "metrics.json.tmp"
    assert _run(corpus_shards, tmp_path, f"save_folder={tmp_path / 'ckpt'}") == RECIPE_ERROR_STATUS
    err = capsys.readouterr().err
    free = re.search(rf"recipe key '{key}': the disk is full: writing {re.escape(str(path))} failed with ENOSPC "
                     r"\(No space left on device\); (\d+) bytes free of \d+ on the file system of ", err)
    assert free, err
    assert abs(int(free[1]) - shutil.disk_usage(tmp_path).free) < 1 << 30
