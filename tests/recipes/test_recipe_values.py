"""Values that used to pass the recipe check and fail later (issue 51): refused by ``load_recipe``, before any
process group starts, naming the key, the value and what is allowed; and recipe YAML whose aliases would expand for
minutes, or a recipe file too large to be one, refused within a second."""

from __future__ import annotations

import re
import time

import pytest

import composer_qsdp.recipes.train
from composer_qsdp.recipes.loader.sources import MAX_RECIPE_BYTES, MAX_RECIPE_NODES
from composer_qsdp.recipes.train import RECIPE_ERROR_STATUS, RecipeError, load_recipe, main
from test_train import BASELINE


# ------------------------------------------------------------------ checkpoints kept, as Composer defines it
def test_composer_deletes_every_local_checkpoint_with_none_to_keep_and_keeps_all_below_zero(tmp_path):
    """What the recipe check follows: Composer's CheckpointSaver rotates its local checkpoints down to
    num_checkpoints_to_keep when that is >= 0, so 0 deletes the checkpoint it just wrote; any negative value keeps
    all (-1 is the documented spelling)."""
    from composer.callbacks import CheckpointSaver

    for keep, kept in ((0, False), (1, True), (-1, True), (-2, True)):
        saved = tmp_path / f"keep{keep}-ep0-ba1-rank0.pt"
        saved.write_bytes(b"checkpoint")
        saver = CheckpointSaver(folder=str(tmp_path), num_checkpoints_to_keep=keep)
        saver.saved_checkpoints.append(str(saved))
        if keep >= 0:  # what CheckpointSaver._save_checkpoint does after each save
            saver._rotate_checkpoints()
        assert saved.exists() is kept, keep


@pytest.mark.parametrize("keep, folder, allowed", [
    (0, "{tmp}/ckpt", "it must be -1 (keep all) or >= 1 (keep the newest N); 0, which deletes each local checkpoint "
                      "as soon as it is saved, only with a remote save_folder (s3://...)"),
    (-2, "{tmp}/ckpt", "it must be -1 (keep all) or >= 1"),
    (-2, "s3://bucket/ckpt", "it must be -1 (keep all) or >= 1 (keep the newest N), or 0 (keep no local copy of "
                             "the uploads)"),
])
def test_a_count_of_checkpoints_to_keep_that_composer_cannot_save_with_is_refused(tmp_path, keep, folder, allowed):
    folder = folder.format(tmp=tmp_path)
    with pytest.raises(RecipeError, match=re.escape(f"recipe key 'save_num_checkpoints_to_keep' = {keep} is "
                                                    f"invalid; {allowed}")):
        load_recipe(BASELINE, [f"save_folder={folder}", f"save_num_checkpoints_to_keep={keep}"])


@pytest.mark.parametrize("keep, folder", [(-1, "{tmp}/ckpt"), (1, "{tmp}/ckpt"), (3, "{tmp}/ckpt"),
                                          (0, "s3://bucket/ckpt"), (0, None)])
def test_the_counts_composer_defines_are_accepted(tmp_path, keep, folder):
    folder = "null" if folder is None else folder.format(tmp=tmp_path)
    recipe = load_recipe(BASELINE, [f"save_folder={folder}", f"save_num_checkpoints_to_keep={keep}"])
    assert recipe.cfg.save_num_checkpoints_to_keep == keep


@pytest.mark.parametrize("override, key", [
    ("save_num_checkpoints_to_keep=0", "save_num_checkpoints_to_keep"),
    ("run_name=''", "run_name"),
    ("save_folder=''", "save_folder"),
    ("load_path=' '", "load_path"),
    ("metrics_file=''", "metrics_file"),
])
def test_the_entrypoint_refuses_values_that_fail_later_before_training(tmp_path, monkeypatch, capsys, override, key):
    """At the first save (IndexError, or the checkpoint deleted), or at the Trainer (an empty path is the working
    directory; a run named "" logs to /logs-rank0.txt): a recipe error with the recipe status instead."""
    monkeypatch.setattr(composer_qsdp.recipes.train, "train", lambda *a: pytest.fail("training started"))
    assert main([str(BASELINE), f"save_folder={tmp_path / 'ckpt'}", override]) == RECIPE_ERROR_STATUS
    error = capsys.readouterr().err
    assert f"recipe key '{key}' = " in error, error
    assert "use null for none" in error or "it must be -1 (keep all) or >= 1" in error, error


# --------------------------------------------------------------------------------- YAML within bounds
def _alias_bomb(levels: int, width: int = 10) -> str:
    """A flow list in which each anchor holds ``width`` aliases of the previous one: ``width**levels`` scalars."""
    parts = [f"&a0 [{', '.join(['x'] * width)}]"]
    parts += [f"&a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    return f"[{', '.join(parts)}]"


@pytest.mark.parametrize("where", ["file", "command line"])
def test_nested_aliases_in_a_list_valued_key_are_refused_within_a_second(tmp_path, where):
    """Seven levels of ten aliases stand for 10**7 values, which omegaconf copied for minutes; counted without
    expanding them, they are refused at once, naming the source and the limit."""
    bomb = _alias_bomb(7)
    if where == "file":
        (tmp_path / "bomb.yaml").write_text(f"base: {BASELINE}\nallow_imports: {bomb}\n")
        load = (tmp_path / "bomb.yaml", [])
        source = f"recipe '{tmp_path / 'bomb.yaml'}'"
    else:
        load = (BASELINE, [f"allow_imports={bomb}"])
        source = "command-line override 'allow_imports'"
    start = time.monotonic()
    with pytest.raises(RecipeError, match=re.escape(f"{source} holds more than {MAX_RECIPE_NODES} YAML nodes once "
                                                    "its aliases (*name) are expanded")):
        load_recipe(*load)
    assert time.monotonic() - start < 1.0


def test_an_alias_inside_its_own_anchor_is_refused(tmp_path):
    (tmp_path / "loop.yaml").write_text(f"base: {BASELINE}\nallow_imports: &a [x, *a]\n")
    with pytest.raises(RecipeError, match=re.escape(f"recipe '{tmp_path / 'loop.yaml'}' is not valid YAML: an alias "
                                                    "refers to the node that contains it")):
        load_recipe(tmp_path / "loop.yaml")


def test_aliases_within_the_bound_still_work(tmp_path):
    (tmp_path / "anchors.yaml").write_text(f"base: {BASELINE}\n"
                                           "optimizer: {name: sgd, lr: &lr 0.05, weight_decay: *lr}\n")
    assert load_recipe(tmp_path / "anchors.yaml").optimizer_kwargs == {"lr": 0.05, "weight_decay": 0.05}


def test_a_recipe_file_larger_than_the_limit_is_refused_unparsed(tmp_path):
    (tmp_path / "big.yaml").write_text(f"base: {BASELINE}\n" + "# padding\n" * (MAX_RECIPE_BYTES // 10 + 1))
    start = time.monotonic()
    with pytest.raises(RecipeError, match=re.escape(f"recipe '{tmp_path / 'big.yaml'}' is larger than "
                                                    f"{MAX_RECIPE_BYTES // 1024} KiB")):
        load_recipe(tmp_path / "big.yaml")
    assert time.monotonic() - start < 1.0
