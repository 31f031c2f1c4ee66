"""The recipe schema takes FSDP2's integer ``reshard_after_forward`` (ZeRO++'s hpZ) and refuses bad values by key.
(Whether the integer divides the shard mesh is ``fully_shard``'s check when the model is wrapped.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from composer_qsdp.recipes.train import RecipeError, load_recipe

RECIPE = Path(__file__).resolve().parents[1] / "yamls" / "cpu" / "gpt-tiny-qsdp.yaml"


@pytest.mark.parametrize("value,expected", [("8", 8), ("2", 2), ("true", True), ("false", False)])
def test_reshard_after_forward_takes_a_bool_or_a_group_size(value, expected):
    recipe = load_recipe(RECIPE, [f"fsdp.reshard_after_forward={value}"])
    reshard = recipe.cfg.fsdp.reshard_after_forward
    assert reshard == expected and type(reshard) is type(expected)  # an int stays an int for FSDP2Config


@pytest.mark.parametrize("value,shown", [("1", "1"), ("0", "0"), ("-2", "-2"), ("half", "'half'"), ("2.0", "2.0")])
def test_bad_reshard_after_forward_names_the_key(value, shown):
    with pytest.raises(RecipeError) as err:
        load_recipe(RECIPE, [f"fsdp.reshard_after_forward={value}"])
    assert (f"recipe key 'fsdp.reshard_after_forward' = {shown} is invalid; allowed: true, false, or an integer "
            ">= 2") in str(err.value)
