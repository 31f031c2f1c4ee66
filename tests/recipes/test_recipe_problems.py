"""Issue 52 point 9, a newcomer's launches: ``base:`` errors that name the line and the file, and ``@FILE``
overrides."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from composer_qsdp.recipes.loader import RecipeError, load_recipe

ROOT = Path(__file__).resolve().parents[2]
BASELINE = ROOT / "yamls" / "cpu" / "gpt-tiny-baseline.yaml"


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
