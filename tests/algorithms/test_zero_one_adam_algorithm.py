"""ZeroOneAdamDDP in one process: which optimizers it converts and how, what it refuses at Event.INIT (FSDP, fp16,
several optimizers, options given twice) with messages naming the problem, and a world-size-1 Composer run that
warns and trains with the run's own optimizer."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from composer import Trainer
from composer.algorithms import GradientClipping
from composer.core import Event, Precision, Time, TimeUnit
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
    ({"var_freeze_step": "2ep"}, r"var_freeze_step='2ep' is invalid; allowed units: ba \(batches\), dur"),
    ({"local_step_scaler": "soon"}, "local_step_scaler='soon' is invalid; it must be an integer of steps"),
    ({"max_grad_norm": -1.0}, "max_grad_norm=-1.0 is invalid"),
])
def test_bad_options_fail_at_construction(options, match):
    with pytest.raises(ValueError, match=match):
        ZeroOneAdamDDP(**options)


def _state(optimizers, **overrides) -> SimpleNamespace:
    state = {"fsdp_config": None, "tp_config": None, "precision": Precision.AMP_BF16, "optimizers": optimizers,
             "algorithms": [], "max_duration": Time(600, TimeUnit.BATCH), "dataloader_len": None}
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


def test_gradient_clipping_moves_into_the_optimizer(two_ranks):
    """Composer's GradientClipping would clip each rank's local gradient; the optimizer clips the mean instead."""
    clip, other = GradientClipping("norm", 0.5), object()
    state = _state((DecoupledAdamW(_params()),), algorithms=[other, clip])
    algorithm = ZeroOneAdamDDP()
    algorithm.apply(Event.INIT, state, _LOGGER)
    assert algorithm.optimizer.max_grad_norm == 0.5 and state.algorithms == [other]

    with pytest.raises(ValueError, match="clipping_type value, which would clip each rank's local gradient"):
        ZeroOneAdamDDP().apply(Event.INIT, _state((DecoupledAdamW(_params()),),
                                                  algorithms=[GradientClipping("value", 0.5)]), _LOGGER)
    with pytest.raises(ValueError, match="max_grad_norm=1.0 and the run also has GradientClipping"):
        ZeroOneAdamDDP(max_grad_norm=1.0).apply(Event.INIT, _state((DecoupledAdamW(_params()),),
                                                                   algorithms=[GradientClipping("norm", 0.5)]), _LOGGER)


def test_durations_become_steps_of_the_run(two_ranks):
    state = _state((DecoupledAdamW(_params()),))
    algorithm = ZeroOneAdamDDP(var_freeze_step="100ba", local_step_scaler="0.05dur", local_step_clipper=8)
    algorithm.apply(Event.INIT, state, _LOGGER)
    algorithm._resolve_schedule(state)  # at FIT_START, once max_duration (600 batches) is known
    schedule = algorithm.optimizer.schedule
    assert (schedule.var_freeze_step, schedule.local_step_scaler) == (100, 30)


@pytest.mark.parametrize("options, match", [
    ({"var_freeze_step": 600}, "variance never freezes in this run"),
    ({"var_freeze_step": 100, "bound_updates": False}, "bound_updates=False with a frozen variance"),
])
def test_schedules_that_skip_a_phase_or_diverge_warn(two_ranks, options, match):
    state = _state((DecoupledAdamW(_params()),))
    algorithm = ZeroOneAdamDDP(**options)
    algorithm.apply(Event.INIT, state, _LOGGER)
    with pytest.warns(UserWarning, match=match):
        algorithm._resolve_schedule(state)
