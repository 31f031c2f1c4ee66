"""Where llm-foundry is installed, a recipe's ``optimizer`` and ``scheduler`` sections also take the names of
llm-foundry's ``optimizers`` and ``schedulers`` registries (llmfoundry/optim/__init__.py registers them), with the
section's other keys as the class's keyword arguments.

Runs where llm-foundry is installed (CI's ``foundry`` stack, ``.ci/run foundry``); seconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("llmfoundry")

from llmfoundry.optim import DecoupledLionW, InverseSquareRootWithWarmupScheduler  # noqa: E402

from composer_qsdp.recipes.loader import build_optimizer, build_scheduler  # noqa: E402
from composer_qsdp.recipes.train import RecipeError, load_recipe  # noqa: E402

BASELINE = Path(__file__).resolve().parents[2] / "yamls" / "cpu" / "gpt-tiny-baseline.yaml"


def test_llm_foundry_registered_names_build_their_classes():
    recipe = load_recipe(BASELINE, ["optimizer={name: decoupled_lionw, lr: 1.0e-4, betas: [0.9, 0.99]}",
                                    "scheduler={name: inv_sqrt_with_warmup, t_warmup: 2ba, t_scale: 4ba, "
                                    "t_cooldown: 2ba}"])
    optimizer = build_optimizer(recipe, [torch.nn.Parameter(torch.zeros(2))])
    assert type(optimizer) is DecoupledLionW
    assert (optimizer.defaults["lr"], optimizer.defaults["betas"]) == (1e-4, (0.9, 0.99))
    schedule = build_scheduler(recipe)
    assert type(schedule) is InverseSquareRootWithWarmupScheduler
    assert (schedule.t_warmup, schedule.t_scale, schedule.t_cooldown) == ("2ba", "4ba", "2ba")


def test_llm_foundry_names_are_suggested():
    with pytest.raises(RecipeError, match="'optimizer.name' = 'decoupled_lion' is invalid: no optimizer of that name; "
                                          "did you mean 'decoupled_lionw'"):
        load_recipe(BASELINE, ["optimizer.name=decoupled_lion"])
