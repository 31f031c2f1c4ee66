"""The recipe schema takes FSDP2's integer ``reshard_after_forward`` (ZeRO++'s hpZ) and refuses bad values by key."""

from __future__ import annotations

from pathlib import Path

import pytest

import composer_qsdp.train as train_module
from composer_qsdp.train import RecipeError, load_recipe

RECIPE = Path(__file__).resolve().parents[1] / "yamls" / "cpu" / "gpt-tiny-qsdp.yaml"


@pytest.fixture
def eight_ranks(monkeypatch):
    """Validate as if launched on 8 processes (validation only asks the world size)."""
    monkeypatch.setattr(train_module.dist, "get_world_size", lambda: 8)


@pytest.mark.parametrize("value,expected", [("4", 4), ("2", 2), ("true", True), ("false", False)])
def test_reshard_after_forward_takes_a_bool_or_a_group_size(eight_ranks, value, expected):
    recipe = load_recipe(RECIPE, [f"fsdp.reshard_after_forward={value}", "global_train_batch_size=8"])
    reshard = recipe.cfg.fsdp.reshard_after_forward
    assert reshard == expected and type(reshard) is type(expected)  # an int stays an int for FSDP2Config


@pytest.mark.parametrize("value,shown", [("3", "3"), ("1", "1"), ("0", "0"), ("half", "'half'"), ("2.0", "2.0")])
def test_bad_reshard_after_forward_names_the_key(eight_ranks, value, shown):
    with pytest.raises(RecipeError) as err:
        load_recipe(RECIPE, [f"fsdp.reshard_after_forward={value}", "global_train_batch_size=8"])
    assert (f"recipe key 'fsdp.reshard_after_forward' = {shown} is invalid; allowed: true, false, or an integer "
            ">= 2 dividing the world size 8") in str(err.value)
