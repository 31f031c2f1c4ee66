"""The recipe's ``optimizer`` and ``scheduler`` sections name any optimizer or schedule class (Composer's, torch's,
llm-foundry's where installed, a ``module:Class`` path) with its keyword arguments: tiny one-process runs on CPU
build that class with those arguments and follow the schedule's learning rate; bad names and arguments stop the
recipe before anything is built, naming the key and what is allowed."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
import torch
from composer.core import Time
from composer.optim import (
    ConstantScheduler,
    DecoupledAdamW,
    DecoupledSGDW,
    LinearWithWarmupScheduler,
    MultiStepScheduler,
    StepScheduler,
)

from composer_qsdp.recipes.data import write_token_shards
from composer_qsdp.recipes.loader import HostSyncOptimizerWarning, build_optimizer, build_scheduler
from composer_qsdp.recipes.train import RecipeError, load_recipe, train

ROOT = Path(__file__).resolve().parents[2]
BASELINE = ROOT / "yamls" / "cpu" / "gpt-tiny-baseline.yaml"
ZERO_ONE_ADAM = ROOT / "yamls" / "gpt-125m" / "zero-one-adam.yaml"
SEQ_LEN = 32
BATCHES = 6


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """Repetitive English-like text as 32-token samples (no download, no gensim)."""
    words = "the model shards its weights and gathers them before each layer then scatters gradients".split()
    documents = (("train", " ".join(words[(i + j) % len(words)] for j in range(400))) for i in range(20))
    out = tmp_path_factory.mktemp("shards") / f"t{SEQ_LEN}"
    write_token_shards(documents, out, SEQ_LEN)
    return out


def tiny_run(shards: Path, run_dir: Path, *sections: str) -> list[str]:
    """One process, no FSDP, no evaluation: BATCHES optimizer steps on the tiny GPT."""
    return [f"data.local={shards}", "data.eval_split=null", f"model.max_seq_len={SEQ_LEN}", "fsdp=null",
            "global_train_batch_size=4", f"max_duration={BATCHES}ba", "progress_bar=false", "log_to_console=false",
            "callbacks={lr_monitor: {}}", f"metrics_file={run_dir / 'metrics.json'}", *sections]


def logged_lrs(run_dir: Path, optimizer: str) -> list[float]:
    """The learning rate of each batch's optimizer step (LRMonitor logs it at the batch's end), in batch order."""
    series = json.loads((run_dir / "metrics.json").read_text())["metrics"][f"lr-{optimizer}/group0"]
    return [lr for _, lr in sorted(series)]


def expected_lrs(lr: float, multiplier) -> list[float]:
    """``lr * multiplier(t)`` for batches t = 0..BATCHES-1."""
    return [lr * multiplier(t) for t in range(BATCHES)]


# -------------------------------------------------------------------------------------- training, one process
# (sections, optimizer class, its arguments, schedule class, its attributes, lr, the schedule's multiplier in
# batches, written from Composer's documented formulas)
CASES = {
    "sgd+step": (
        ["optimizer={name: sgd, lr: 0.1, momentum: 0.9}", "scheduler={name: step, step_size: 2ba, gamma: 0.5}"],
        torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": False},
        StepScheduler, {"step_size": Time(2, "ba"), "gamma": 0.5},
        0.1, lambda t: 0.5 ** (t // 2)),
    "decoupled_sgdw+constant": (
        ["optimizer={name: DecoupledSGDW, lr: 0.2, momentum: 0.5, weight_decay: 1.0e-4}",
         "scheduler={name: ConstantScheduler, alpha: 0.5, t_max: 4ba}"],
        DecoupledSGDW, {"lr": 0.2, "momentum": 0.5, "weight_decay": 1e-4},
        ConstantScheduler, {"alpha": 0.5, "t_max": Time(4, "ba")},
        0.2, lambda t: 0.5 if t < 4 else 1.0),
    "module_class+linear_with_warmup": (
        ["optimizer={name: 'torch.optim:RMSprop', lr: 0.01, alpha: 0.9}",
         "scheduler={name: linear_with_warmup, t_warmup: 2ba, alpha_i: 1.0, alpha_f: 0.5}"],
        torch.optim.RMSprop, {"lr": 0.01, "alpha": 0.9},
        LinearWithWarmupScheduler, {"t_warmup": Time(2, "ba"), "alpha_i": 1.0, "alpha_f": 0.5},
        0.01, lambda t: t / 2 if t < 2 else 1.0 + (0.5 - 1.0) * (t - 2) / (BATCHES - 2)),
}


@pytest.mark.parametrize("case", CASES)
def test_named_classes_train_with_their_arguments_and_schedule(shards, tmp_path, case):
    sections, optimizer_class, optimizer_args, schedule_class, schedule_attrs, lr, multiplier = CASES[case]
    recipe = load_recipe(BASELINE, tiny_run(shards, tmp_path, *sections))

    schedule = build_scheduler(recipe)
    assert type(schedule) is schedule_class
    assert {k: getattr(schedule, k) for k in schedule_attrs} == schedule_attrs

    trainer = train(recipe)
    optimizer = trainer.state.optimizers[0]
    assert type(optimizer) is optimizer_class
    assert {k: optimizer.defaults[k] for k in optimizer_args} == optimizer_args
    assert trainer.state.timestamp.batch.value == BATCHES
    assert logged_lrs(tmp_path, optimizer_class.__name__) == pytest.approx(expected_lrs(lr, multiplier), rel=1e-6)


def test_the_default_sections_still_build_decoupled_adamw_and_the_warmup_cosine(shards, tmp_path):
    """The recipe's own names and defaults: DecoupledAdamW with the paper's betas, cosine decay to 0.1 x lr after a
    linear warm-up (Composer's CosineAnnealingWithWarmupScheduler formula)."""
    recipe = load_recipe(BASELINE, tiny_run(shards, tmp_path, "scheduler.t_warmup=2ba"))
    trainer = train(recipe)
    optimizer = trainer.state.optimizers[0]
    assert type(optimizer) is DecoupledAdamW and optimizer.defaults["betas"] == (0.9, 0.95)

    def cosine(t: int) -> float:
        if t < 2:
            return t / 2
        frac = (t - 2) / (BATCHES - 2)
        return 0.1 + (1 - 0.1) * 0.5 * (1 + math.cos(math.pi * frac))

    assert logged_lrs(tmp_path, "DecoupledAdamW") == pytest.approx(expected_lrs(3e-3, cosine), rel=1e-6)


# -------------------------------------------------------------------------------------------- without training
def test_any_composer_or_torch_class_by_name_or_path_with_durations_parsed():
    recipe = load_recipe(BASELINE, ["optimizer={name: decoupled_sgdw, lr: 0.05, nesterov: true, momentum: 0.9}",
                                    "scheduler={name: multi_step, milestones: [10ba, 0.5dur], gamma: 0.3}"])
    optimizer = build_optimizer(recipe, [torch.nn.Parameter(torch.zeros(3))])
    assert type(optimizer) is DecoupledSGDW
    assert (optimizer.defaults["lr"], optimizer.defaults["nesterov"], optimizer.defaults["momentum"]) == (0.05, True,
                                                                                                            0.9)
    schedule = build_scheduler(recipe)
    assert type(schedule) is MultiStepScheduler
    assert schedule.milestones == [Time(10, "ba"), Time(0.5, "dur")] and schedule.gamma == 0.3

    recipe = load_recipe(BASELINE, ["scheduler={name: 'composer.optim:ExponentialScheduler', gamma: 0.9, "
                                    "decay_period: 3ba}"])
    schedule = build_scheduler(recipe)
    assert (type(schedule).__name__, schedule.gamma, schedule.decay_period) == ("ExponentialScheduler", 0.9,
                                                                                Time(3, "ba"))


def test_the_paper_recipes_train_with_fused_adamw_and_decoupled_adamw_on_gpu_warns():
    """The GPU recipes' optimizer is torch's fused AdamW (DecoupledAdamW syncs the host once per parameter); naming
    DecoupledAdamW in a GPU recipe warns with the fix, and on CPU it does not."""
    gpu = Path(__file__).parents[2] / "yamls" / "gpt-125m" / "baseline.yaml"
    params = [torch.nn.Parameter(torch.zeros(3))]
    optimizer = build_optimizer(load_recipe(gpu, ["data.remote=null"]), params)
    assert type(optimizer) is torch.optim.AdamW and optimizer.defaults["fused"] is True
    assert (optimizer.defaults["betas"], optimizer.defaults["weight_decay"]) == ((0.9, 0.95), 0.0)
    with pytest.warns(HostSyncOptimizerWarning, match="optimizer.name='decoupled_adamw'.*use name: adamw"):
        build_optimizer(load_recipe(gpu, ["data.remote=null", "optimizer.name=decoupled_adamw"]), params)
    with warnings.catch_warnings():
        warnings.simplefilter("error", HostSyncOptimizerWarning)
        build_optimizer(load_recipe(BASELINE, []), params)  # a CPU recipe


def test_a_child_naming_another_class_keeps_only_the_keys_it_takes(tmp_path):
    """The base's DecoupledAdamW section (lr, betas, eps, weight_decay) under a child that names SGD: lr and
    weight_decay carry over, Adam's betas and eps do not; the base's warm-up keys likewise."""
    (tmp_path / "child.yaml").write_text(f"base: {BASELINE}\noptimizer: {{name: sgd, momentum: 0.8}}\n"
                                         "scheduler: {name: step, step_size: 5ba}\n")
    recipe = load_recipe(tmp_path / "child.yaml")
    assert recipe.optimizer_kwargs == {"lr": 3e-3, "weight_decay": 0.0, "momentum": 0.8}
    assert recipe.scheduler_kwargs == {"step_size": Time(5, "ba")}
    assert dict(recipe.cfg.optimizer) == {"name": "sgd", "lr": 3e-3, "weight_decay": 0.0, "momentum": 0.8}


@pytest.mark.parametrize("overrides, message", [
    # Unknown names: a suggestion and the known names.
    (["optimizer.name=sdg"], "recipe key 'optimizer.name' = 'sdg' is invalid: no optimizer of that name; did you mean "
                             "'sgd'?; known: adadelta, adafactor"),
    (["scheduler.name=multistep"], "recipe key 'scheduler.name' = 'multistep' is invalid: no schedule of that name; "
                                   "did you mean 'multi_step'?; known: constant, constant_with_warmup"),
    (["scheduler.name=composer.optim:NoSuchScheduler"], "recipe key 'scheduler.name': cannot import "
                                                        "'composer.optim:NoSuchScheduler' ('module:Class')"),
    # Arguments the class does not take, or needs: the bad key and what the class takes.
    (["optimizer={name: sgd, lr: 0.1, betas: [0.9, 0.99]}"],
     "recipe key 'optimizer.betas' is unknown; 'optimizer' takes: lr, momentum, dampening, weight_decay, nesterov"),
    (["scheduler={name: step, step_sise: 2ba}"],
     "recipe key 'scheduler.step_sise' is unknown; did you mean 'step_size'?; 'scheduler' takes: step_size, gamma"),
    (["scheduler={name: step}"], "recipe is missing required key(s): scheduler.step_size (the keyword arguments of "
                                 "scheduler.name 'step' without a default)"),
    (["optimizer={name: sgd, momentum: 0.9}", "optimizer.lr=null"],
     "recipe key 'optimizer.lr' = None is invalid; it must be a finite number > 0"),
    (["optimizer.params=[1]"], "recipe key 'optimizer.params' cannot be set: the recipe passes it"),
    # Values: durations as Composer parses them, numbers, the class's own checks.
    (["scheduler={name: multi_step, milestones: [2ba, soon]}"],
     "recipe key 'scheduler.milestones[1]' = 'soon' is not a duration"),
    (["optimizer={name: sgd, lr: 0.1, momentum: fast}"], "recipe key 'optimizer.momentum' = 'fast' is invalid; it "
                                                         "must be a number"),
    (["optimizer={name: sgd, lr: 0.1, nesterov: true}"],
     "recipe section 'optimizer' (sgd) is invalid: Nesterov momentum requires a momentum and zero dampening"),
    # torch.optim.lr_scheduler is no registry's module: only an exact allow_imports entry lets the path import it.
    (["scheduler={name: 'torch.optim.lr_scheduler:StepLR', step_size: 2}"],
     "recipe key 'scheduler.name' = 'torch.optim.lr_scheduler:StepLR' is invalid; a recipe imports only the modules "
     "that the registries name"),
    (["scheduler={name: 'torch.optim.lr_scheduler:StepLR', step_size: 2}",
      "allow_imports=[torch.optim.lr_scheduler]"],
     "recipe key 'scheduler.name' = 'torch.optim.lr_scheduler:StepLR' is invalid; it names StepLR, not a "
     "composer.optim.ComposerScheduler subclass; it is a torch LRScheduler"),
    (["optimizer.name=composer.optim:StepScheduler"],
     "'optimizer.name' = 'composer.optim:StepScheduler' is invalid; it names StepScheduler, not a "
     "torch.optim.Optimizer"),
])
def test_bad_sections_name_the_key(overrides, message):
    with pytest.raises(RecipeError) as err:
        load_recipe(BASELINE, overrides)
    assert message in str(err.value)


def test_zero_one_adam_refuses_an_optimizer_it_cannot_replace():
    """0/1 Adam replaces the run's Adam at Event.INIT: a recipe naming SGD (or Adam with L2 weight decay) is refused
    before anything is built, and a schedule without t_warmup leaves a freeze step of ${scheduler.t_warmup}
    unresolved, which names the key."""
    paper = ["data.remote=s3://bucket/c4"]
    assert load_recipe(ZERO_ONE_ADAM, [*paper, "optimizer.name=adamw"]).optimizer_kwargs["betas"] == (0.9, 0.95)
    with pytest.raises(RecipeError, match="'optimizer.name' = 'sgd' does not work with algorithms.zero_one_adam: "
                                          "0/1 Adam replaces an Adam optimizer, got SGD"):
        load_recipe(ZERO_ONE_ADAM, [*paper, "optimizer.name=sgd"])
    with pytest.raises(RecipeError, match="does not work with algorithms.zero_one_adam: Adam parameter group 0 has "
                                          "weight_decay=0.1"):
        load_recipe(ZERO_ONE_ADAM, [*paper, "optimizer.name=adam", "optimizer.weight_decay=0.1"])
    with pytest.raises(RecipeError, match="recipe key 'algorithms.zero_one_adam.var_freeze_step' cannot be resolved: "
                                          "Interpolation key 'scheduler.t_warmup' not found"):
        load_recipe(ZERO_ONE_ADAM, [*paper, "scheduler.name=constant",
                                    "algorithms.zero_one_adam.var_freeze_step=${scheduler.t_warmup}"])
    recipe = load_recipe(ZERO_ONE_ADAM, [*paper, "scheduler.name=constant",
                                         "algorithms.zero_one_adam.var_freeze_step=50ba"])
    assert type(build_scheduler(recipe)) is ConstantScheduler
