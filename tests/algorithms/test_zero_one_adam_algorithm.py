"""ZeroOneAdamDDP in one process: which optimizers it converts and how, what it refuses at Event.INIT (FSDP, fp16,
several optimizers, options given twice) with messages naming the problem, and a world-size-1 Composer run that
warns and trains with the run's own optimizer."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from composer import Trainer
from composer.core import Event, Precision
from composer.optim import DecoupledAdamW
from torch.utils.data import DataLoader

import composer_qsdp.algorithms.zero_one_adam.zero_one_adam as module
from composer_qsdp.algorithms.zero_one_adam import ZeroOneAdam, ZeroOneAdamDDP, to_zero_one_adam


def _params() -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.zeros(3, 2)), torch.nn.Parameter(torch.zeros(3))]


def test_decoupled_adamw_becomes_zero_one_adam_with_the_same_decay_per_step():
    params = _params()
    source = DecoupledAdamW([{"params": params[:1]}, {"params": params[1:], "lr": 4e-4, "weight_decay": 0.0}],
                            lr=2e-3, betas=(0.9, 0.95), eps=1e-6, weight_decay=1e-5)
    opt = to_zero_one_adam(source, var_freeze_step=7, bucket_size=8)
    assert isinstance(opt, ZeroOneAdam) and opt.schedule.var_freeze_step == 7
    first, second = opt.param_groups
    assert first["params"] == params[:1] and second["params"] == params[1:]
    assert (first["lr"], first["betas"], first["eps"]) == (2e-3, (0.9, 0.95), 1e-6)
    # DecoupledAdamW multiplies by 1 - wd * lr / initial_lr, ZeroOneAdam by 1 - lr * wd': wd' = wd / initial_lr.
    assert first["weight_decay"] == pytest.approx(1e-5 / 2e-3) and second["weight_decay"] == 0.0
    assert second["lr"] == 4e-4


def test_torch_adamw_and_adam_without_decay_carry_over():
    assert to_zero_one_adam(torch.optim.AdamW(_params(), lr=0.1, weight_decay=0.01)).param_groups[0][
        "weight_decay"] == 0.01
    assert to_zero_one_adam(torch.optim.Adam(_params(), lr=0.1)).param_groups[0]["lr"] == 0.1


def _stepped() -> torch.optim.Optimizer:
    params = _params()
    opt = torch.optim.AdamW(params)
    params[0].grad = torch.ones(3, 2)
    opt.step()
    return opt


@pytest.mark.parametrize("make, match", [
    (lambda: torch.optim.SGD(_params(), lr=0.1), "replaces an Adam optimizer, got SGD"),
    (lambda: torch.optim.Adam(_params(), weight_decay=0.1), "weight_decay=0.1 .an L2 term"),
    (lambda: torch.optim.AdamW(_params(), amsgrad=True), "amsgrad=True"),
    (lambda: DecoupledAdamW(_params(), lr=0.0, weight_decay=1e-5), "initial_lr=0"),
    (_stepped, "has state from earlier steps"),
])
def test_optimizers_it_cannot_convert_are_named(make, match):
    with pytest.raises(ValueError, match=match):
        to_zero_one_adam(make())


@pytest.mark.parametrize("options, match", [
    ({"var_freeze_stpe": 3}, "unknown ZeroOneAdamDDP option.s. var_freeze_stpe; allowed: var_freeze_step"),
    ({"local_step_clipper": 0}, "local_step_clipper=0 is invalid"),
    ({"codec": "minmax"}, "rounds stochastically"),
])
def test_bad_options_fail_at_construction(options, match):
    with pytest.raises(ValueError, match=match):
        ZeroOneAdamDDP(**options)


def _state(optimizers, **overrides) -> SimpleNamespace:
    state = {"fsdp_config": None, "tp_config": None, "precision": Precision.AMP_BF16, "optimizers": optimizers}
    return SimpleNamespace(**{**state, **overrides})


_LOGGER = SimpleNamespace(log_hyperparameters=lambda _: None)


@pytest.fixture
def two_ranks(monkeypatch):
    monkeypatch.setattr(module.dist, "get_world_size", lambda: 2)


@pytest.mark.parametrize("overrides, match", [
    ({"fsdp_config": object()}, "does not work with FSDP or tensor parallelism"),
    ({"tp_config": object()}, "does not work with FSDP or tensor parallelism"),
    ({"precision": Precision.AMP_FP16}, "precision='amp_fp16' is not supported"),
])
def test_runs_it_cannot_serve_are_refused_at_init(two_ranks, overrides, match):
    with pytest.raises(ValueError, match=match):
        ZeroOneAdamDDP().apply(Event.INIT, _state((DecoupledAdamW(_params()),), **overrides), _LOGGER)


def test_init_replaces_the_optimizer_or_keeps_a_zero_one_adam(two_ranks):
    state = _state((DecoupledAdamW(_params(), lr=1e-3),))
    algorithm = ZeroOneAdamDDP(var_freeze_step=5)
    algorithm.apply(Event.INIT, state, _LOGGER)
    assert state.optimizers == (algorithm.optimizer,) and algorithm.optimizer.schedule.var_freeze_step == 5

    own = ZeroOneAdam(_params(), var_freeze_step=9)
    state = _state((own,))
    kept = ZeroOneAdamDDP()
    kept.apply(Event.INIT, state, _LOGGER)
    assert state.optimizers == (own,) and kept.optimizer is own
    with pytest.raises(ValueError, match=r"already is a ZeroOneAdam; give the options \(var_freeze_step\) to it"):
        ZeroOneAdamDDP(var_freeze_step=5).apply(Event.INIT, _state((own,)), _LOGGER)
    with pytest.raises(ValueError, match="exactly one optimizer, the run has 2"):
        ZeroOneAdamDDP().apply(Event.INIT, _state((own, own)), _LOGGER)


def test_world_size_one_warns_and_trains_with_the_runs_optimizer():
    from composer.models import ComposerClassifier

    model = ComposerClassifier(torch.nn.Sequential(torch.nn.Linear(4, 2)), num_classes=2)
    data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,)))
    optimizer = DecoupledAdamW(model.parameters(), lr=1e-2)
    algorithm = ZeroOneAdamDDP(var_freeze_step=2)
    with pytest.warns(UserWarning, match="does nothing with world size 1"):
        trainer = Trainer(model=model, optimizers=optimizer, train_dataloader=DataLoader(data, batch_size=4),
                          max_duration="2ba", algorithms=[algorithm], device="cpu", progress_bar=False)
    trainer.fit()
    assert trainer.state.optimizers[0] is optimizer and algorithm.optimizer is None
    assert algorithm.traffic().total.sent == 0
    trainer.close()
