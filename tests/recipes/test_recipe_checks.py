"""Recipe checks of issue 27: switching inherited components off, and settings that used to fail late (at Trainer
init, at the first checkpoint, at the first batch) or with a bare traceback are refused by ``load_recipe``, before
any process group starts, naming the key."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

import composer_qsdp.recipes.train
from composer_qsdp.recipes.loader import check_machine
from composer_qsdp.recipes.train import RecipeError, load_recipe, main
from test_train import BASELINE, HF_RECIPE, QSDP_RECIPE

ROOT = Path(__file__).resolve().parents[2]
ZERO_ONE_ADAM = ROOT / "yamls" / "gpt-125m" / "zero-one-adam.yaml"
GPT_1_3B = ROOT / "yamls" / "gpt-1.3b" / "baseline.yaml"
PAPER_DATA = ["data.remote=s3://bucket/c4-gpt2-t2048"]
# Shards downloaded at start-up: the machine's checks look for no local ones (data/ exists only after make demo).
REMOTE_DATA = "data.remote=s3://bucket/wiki-gpt2-t64"


# ------------------------------------------------------------------ removing what a base recipe enabled
def test_an_empty_section_in_a_recipe_replaces_the_bases(tmp_path):
    """'algorithms: {}' in a recipe whose base enables 0/1 Adam: a DDP baseline, without 0/1 Adam."""
    (tmp_path / "ddp.yaml").write_text(f"base: {ZERO_ONE_ADAM}\nalgorithms: {{}}\ncallbacks: {{}}\n")
    recipe = load_recipe(tmp_path / "ddp.yaml", PAPER_DATA)
    assert recipe.algorithm_kwargs == {} and recipe.callback_kwargs == {}
    assert recipe.cfg.fsdp is None  # the rest of the base is kept


@pytest.mark.parametrize("override", ["algorithms={}", "algorithms=null"])
def test_an_empty_section_on_the_command_line_replaces_the_recipes(override):
    assert load_recipe(ZERO_ONE_ADAM, [*PAPER_DATA, override]).algorithm_kwargs == {}
    assert load_recipe(QSDP_RECIPE, [override]).algorithm_kwargs == {}


@pytest.mark.parametrize("value", ["null", "false"])
def test_null_or_false_switches_one_inherited_component_off(value):
    assert load_recipe(QSDP_RECIPE, [f"algorithms.qsdp={value}"]).algorithm_kwargs == {}
    recipe = load_recipe(QSDP_RECIPE, [f"callbacks.speed_monitor={value}", "callbacks.lr_monitor={}"])
    assert recipe.callback_kwargs == {"lr_monitor": {}}


def test_a_mapping_merges_into_the_inherited_one(tmp_path):
    """A non-empty section adds to the base's entries and changes the keys it names; '{}' enables with the class's
    defaults."""
    recipe = load_recipe(QSDP_RECIPE, ["algorithms.qsdp.grad_bits=4"])
    assert recipe.algorithm_kwargs["qsdp"] == {"weight_bits": 8, "grad_bits": 4, "weight_codec": "minmax",
                                              "grad_codec": "minmax", "bucket_size": 1024}
    (tmp_path / "more.yaml").write_text(f"base: {QSDP_RECIPE}\ncallbacks: {{lr_monitor: {{}}}}\n")
    assert load_recipe(tmp_path / "more.yaml").callback_kwargs == {"speed_monitor": {"window_size": 10},
                                                                   "lr_monitor": {}}


@pytest.mark.parametrize("value", ["3", "w8g8", "[1]"])
def test_an_entry_that_is_neither_a_mapping_nor_off_is_refused(value):
    with pytest.raises(RecipeError, match=re.escape("recipe key 'algorithms.qsdp' = ") + ".*give its keyword "
                                          "arguments as a mapping"):
        load_recipe(QSDP_RECIPE, [f"algorithms.qsdp={value}"])


# ------------------------------------------------------------------------- errors that came late
@pytest.fixture
def unwritable_dir(tmp_path) -> Path:
    """A directory this process cannot create files in (root ignores permission bits: /proc then)."""
    if os.geteuid() == 0:
        return Path("/proc")
    path = tmp_path / "read-only"
    path.mkdir(mode=0o555)
    return path


def test_a_save_folder_that_cannot_be_written_is_refused(tmp_path, unwritable_dir):
    for folder in (unwritable_dir, unwritable_dir / "ckpt" / "run"):
        with pytest.raises(RecipeError, match=re.escape(f"recipe key 'save_folder' = '{folder}' is invalid; ")
                           + f".*{re.escape(str(unwritable_dir))}' cannot be written"):
            check_machine(load_recipe(BASELINE, [f"save_folder={folder}"]))
    (tmp_path / "file").write_text("")
    with pytest.raises(RecipeError, match=re.escape(f"'{tmp_path / 'file'}' is a file, not a folder")):
        check_machine(load_recipe(BASELINE, [f"save_folder={tmp_path / 'file' / 'ckpt'}"]))


def test_a_save_folder_that_can_be_created_is_accepted_and_not_created(tmp_path):
    folder = tmp_path / "runs" / "{run_name}" / "ckpt"  # Composer formats the name itself
    check_machine(load_recipe(BASELINE, [f"save_folder={folder}", REMOTE_DATA]))
    assert list(tmp_path.iterdir()) == []
    check_machine(load_recipe(BASELINE, ["save_folder=s3://bucket/ckpt", REMOTE_DATA]))


def test_machine_errors_stop_the_entrypoint_before_any_process_group(monkeypatch, capsys, unwritable_dir):
    """main() reports them as recipe errors (status 2) before distributed set-up, where Composer used to fail."""
    monkeypatch.setattr(composer_qsdp.recipes.train, "train", lambda *a: pytest.fail("training started"))
    assert main([str(BASELINE), f"save_folder={unwritable_dir / 'ckpt'}", REMOTE_DATA]) == 2
    assert "recipe error: recipe key 'save_folder'" in capsys.readouterr().err


def test_zero_one_adam_with_fsdp_names_the_recipe_key():
    with pytest.raises(RecipeError, match=re.escape("recipe key 'algorithms.zero_one_adam'") + ".*fsdp: null"):
        load_recipe(BASELINE, ["algorithms.zero_one_adam.var_freeze_step=4"])
    assert "zero_one_adam" in load_recipe(BASELINE, ["fsdp=null", "algorithms.zero_one_adam.var_freeze_step=4"]) \
        .algorithm_kwargs


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where no GPU is visible")
def test_gpu_device_without_cuda_is_refused():
    recipe = load_recipe(BASELINE, ["device=gpu"])  # the recipe itself is valid: on a GPU machine it runs
    with pytest.raises(RecipeError, match=re.escape("recipe key 'device' = 'gpu' is invalid; no CUDA device")):
        check_machine(recipe)


def test_the_sign_codec_says_it_takes_one_bit():
    with pytest.raises(RecipeError) as err:
        load_recipe(QSDP_RECIPE, ["algorithms.qsdp.weight_codec=sign"])
    assert "algorithms.qsdp" in str(err.value) and "(1,)" not in str(err.value)
    assert "bits=8 is not supported: the sign codec sends one bit per element; allowed: 1" in str(err.value)


def test_local_shards_of_another_sample_length_are_refused_when_the_recipe_loads(tmp_path):
    from composer_qsdp.recipes.data import write_token_shards

    shards = tmp_path / "shards"
    docs = [("train", "the quick brown fox jumps over the lazy dog " * 40), ("val", "a lazy dog " * 40)]
    write_token_shards(docs, shards, seq_len=32)
    with pytest.raises(RecipeError, match=r"model.max_seq_len.*samples of 32 tokens, but model.max_seq_len=64"):
        load_recipe(BASELINE, ["data.remote=null", f"data.local={shards}"])
    load_recipe(BASELINE, ["data.remote=null", f"data.local={shards}", "model.max_seq_len=32"])


# ------------------------------------------------------------------------------------------ model.init_device
META_REFUSED = "recipe key 'model.init_device' = 'meta' is invalid; "


@pytest.mark.parametrize("recipe, overrides, message", [
    (BASELINE, ["model.init_device=mata"],
     "recipe key 'model.init_device' = 'mata' is invalid; did you mean 'meta'?; allowed: cpu, meta"),
    (BASELINE, ["model.init_device=cuda"], "recipe key 'model.init_device' = 'cuda' is invalid; allowed: cpu, meta "
     "(meta initialises each process's shard on its GPU)"),
    (BASELINE, ["model.init_device=meta"], META_REFUSED + "it needs device: gpu"),
    (HF_RECIPE, ["model.init_device=meta"], META_REFUSED + "only model.name: gpt initialises on the meta device"),
    # A recipe that sets meta, moved to the CPU or to DDP on the command line: the error names the override to add.
    (GPT_1_3B, [*PAPER_DATA, "device=cpu", "precision=fp32"],
     META_REFUSED + "it needs device: gpu .*; use model.init_device=cpu on the CPU"),
    (GPT_1_3B, [*PAPER_DATA, "fsdp=null"],
     META_REFUSED + "it needs an 'fsdp' section .*; use model.init_device=cpu with fsdp: null"),
])
def test_init_device_that_cannot_work_is_refused(recipe, overrides, message):
    with pytest.raises(RecipeError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        load_recipe(recipe, overrides)


def test_init_device_cpu_moves_a_meta_recipe_to_the_cpu():
    recipe = load_recipe(GPT_1_3B, [*PAPER_DATA, "device=cpu", "precision=fp32", "model.init_device=cpu"])
    assert recipe.init_device == "cpu" and recipe.model_config.d_model == 2048
    assert load_recipe(BASELINE).init_device == "cpu"  # the default
