"""Issue 52 point 9, a newcomer's launches: every independent problem of a recipe in one error, a missing-shards
error whose build command runs as printed, ``base:`` errors that name the line and the file, and ``@FILE``
overrides."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import composer_qsdp.recipes.train
from composer_qsdp.recipes.data.build import _parser as build_parser
from composer_qsdp.recipes.loader import RecipeError, load_recipe
from composer_qsdp.recipes.train import main

ROOT = Path(__file__).resolve().parents[2]
BASELINE = ROOT / "yamls" / "cpu" / "gpt-tiny-baseline.yaml"
GPT_125M = ROOT / "yamls" / "gpt-125m" / "qsdp-w8g8.yaml"
ON_THE_CPU = ["device=cpu", "precision=fp32"]


# ------------------------------------------------------------------ every independent problem in one error
def three_problem_recipe(tmp_path: Path) -> Path:
    """A recipe with three independent problems: an unknown key, a precision the CPU cannot run, no shards."""
    path = tmp_path / "three.yaml"
    path.write_text(f"base: {BASELINE}\nmax_steps: 10\nprecision: amp_bf16\ndata: {{local: {tmp_path / 'none'}}}\n")
    return path


def test_three_independent_problems_come_in_one_numbered_error(tmp_path):
    with pytest.raises(RecipeError) as err:
        load_recipe(three_problem_recipe(tmp_path), machine=True)
    message = str(err.value)
    assert message.startswith("3 problems in the recipe")
    assert len(err.value.problems) == 3
    for number, expected in enumerate(["unknown recipe key 'max_steps'",
                                       "recipe key 'precision' = 'amp_bf16' is invalid; Composer trains on CPU in fp32",
                                       f"recipe key 'data.local' = '{tmp_path / 'none'}': no MDS token shards"], 1):
        assert re.search(rf"^  {number}\. {re.escape(expected)}", message, re.MULTILINE), message


def test_the_entrypoint_reports_them_in_one_launch(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(composer_qsdp.recipes.train, "train", lambda *a: pytest.fail("training started"))
    assert main([str(three_problem_recipe(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert err.startswith("recipe error: 3 problems in the recipe") and "  3. recipe key 'data.local'" in err


def test_one_problem_reads_as_before():
    with pytest.raises(RecipeError) as err:
        load_recipe(BASELINE, ["seed=-1"])
    assert str(err.value).startswith("recipe key 'seed' = -1 is invalid") and err.value.problems == (str(err.value),)


def test_a_check_that_depends_on_a_failed_one_is_skipped():
    """A wrong type is reported once: not again as a missing key, nor as the checks that read the value."""
    with pytest.raises(RecipeError) as err:
        load_recipe(BASELINE, ["global_train_batch_size=abc", "model.preset=huge"])
    assert len(err.value.problems) == 2, err.value
    assert "'global_train_batch_size' has the wrong type" in err.value.problems[0]
    assert "unknown GPT preset 'huge'" in err.value.problems[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without a GPU")
def test_the_newcomers_first_launch_names_every_problem_and_the_try_out():
    """The paper recipe on a CPU machine: the shards' location and the device, with what a CPU run needs."""
    with pytest.raises(RecipeError) as err:
        load_recipe(GPT_125M, machine=True)
    first, second = err.value.problems
    assert first.startswith("recipe is missing required key(s): data.remote (") and \
        f"make try RECIPE={GPT_125M}" in first
    assert "recipe key 'device' = 'gpu' is invalid" in second and "use device=cpu precision=fp32 " in second


# ------------------------------------------------------------------ the build command of missing shards
def printed_command(err: RecipeError) -> str:
    return re.search(r"build them with: (python -m composer_qsdp\.recipes\.data\.build [^;]*)", str(err)).group(1)


def test_missing_shards_print_the_build_command_of_the_recipe(tmp_path):
    """The paper recipe's corpus (c4), folder, sequence length and the tokens it trains on."""
    out = tmp_path / "c4 shards"  # a space: the command quotes it
    with pytest.raises(RecipeError) as err:
        load_recipe(GPT_125M, ["data.remote=null", f"data.local={out}", *ON_THE_CPU], machine=True)
    command = printed_command(err.value)
    assert command == (f"python -m composer_qsdp.recipes.data.build c4 '{out}' --seq-len 2048 "
                       f"--max-train-tokens {4800 * 256 * 2048}")
    args = build_parser().parse_args(shlex.split(command)[3:])  # the build's own command line takes it
    assert (args.source, args.out_dir, args.seq_len, args.max_train_tokens) == ("c4", str(out), 2048,
                                                                                4800 * 256 * 2048)


def test_the_printed_build_command_builds_what_the_recipe_reads(tmp_path):
    """Copied as printed, the command builds the shards, and the recipe then passes the machine's checks."""
    text = tmp_path / "text"
    text.mkdir()
    for i in range(40):
        (text / f"doc{i}.txt").write_text(f"Document {i} of a small corpus. " * 40)
    overrides = [f"data.source=textdir --input {text}", f"data.local={tmp_path / 'shards'}"]
    with pytest.raises(RecipeError) as err:
        load_recipe(BASELINE, overrides, machine=True)
    command = shlex.split(printed_command(err.value))
    assert command[3:7] == ["textdir", str(tmp_path / "shards"), "--seq-len", "64"]
    subprocess.run([sys.executable, *command[1:]], check=True, capture_output=True, timeout=300)
    load_recipe(BASELINE, overrides, machine=True)


def test_without_a_source_the_command_names_the_placeholder(tmp_path):
    with pytest.raises(RecipeError) as err:
        load_recipe(BASELINE, ["data.source=null", f"data.local={tmp_path}"], machine=True)
    assert printed_command(err.value).startswith(f"python -m composer_qsdp.recipes.data.build SOURCE {tmp_path} "
                                                 "--seq-len 64")
    assert "SOURCE: the text, e.g. wikipedia or c4, which the recipe key data.source names" in str(err.value)


# ------------------------------------------------------------------ base:
def test_a_missing_base_names_the_key_the_path_and_the_referring_file(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "top.yaml").write_text("base: sub/middle.yaml\n")
    (tmp_path / "sub" / "middle.yaml").write_text("base: ../base/gone.yaml\nseed: 1\n")
    with pytest.raises(RecipeError) as err:
        load_recipe(tmp_path / "top.yaml")
    assert str(err.value) == (f"recipe '{tmp_path / 'sub' / 'middle.yaml'}': its 'base: ../base/gone.yaml' names "
                              f"'{tmp_path / 'base' / 'gone.yaml'}', which does not exist (a base path is relative "
                              "to the recipe that names it); fix that line")


# ------------------------------------------------------------------ @FILE overrides
def test_an_overrides_file_adds_its_lines_in_place(tmp_path):
    (tmp_path / "o.overrides").write_text("# a comment\n\nseed=3\n  max_duration=7ba  \n")
    cfg = load_recipe(BASELINE, ["seed=1", f"@{tmp_path / 'o.overrides'}", "max_duration=9ba"]).cfg
    assert (cfg.seed, cfg.max_duration) == (3, "9ba")  # the file wins over what comes before, not after
    with pytest.raises(RecipeError, match=re.escape(f"command-line overrides file '@{tmp_path / 'no'}' cannot be "
                                                    "read: No such file or directory")):
        load_recipe(BASELINE, [f"@{tmp_path / 'no'}"])
    (tmp_path / "bad.overrides").write_text("seed 3\n")
    with pytest.raises(RecipeError, match=re.escape("'seed 3' must have the form key=value")):
        load_recipe(BASELINE, [f"@{tmp_path / 'bad.overrides'}"])
