"""Issue 52 point 9, a newcomer's launches: ``base:`` errors that name the line and the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from composer_qsdp.recipes.loader import RecipeError, load_recipe


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
