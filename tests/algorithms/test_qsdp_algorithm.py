"""QSDP as a Composer algorithm, in process: options, run validation, world size 1."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from composer import Trainer
from composer.core import Event
from composer.models import ComposerModel
from composer.utils import FSDP2Config
from torch.utils.data import DataLoader, TensorDataset

from composer_qsdp import QSDP, QSDPConfig
from composer_qsdp.config import from_preset
from composer_qsdp.algorithms.qsdp import check_run
from composer_qsdp.schemes import build_scheme
from composer_qsdp.fsdp2 import HAS_CUSTOM_COMM_API, compat


class Regression(ComposerModel):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

    def forward(self, batch):
        return self.net(batch[0])

    def loss(self, outputs, batch):
        return nn.functional.mse_loss(outputs, batch[1])


def _trainer(**kwargs) -> Trainer:
    data = TensorDataset(torch.randn(32, 8), torch.randn(32, 4))
    model = Regression()
    return Trainer(model=model, train_dataloader=DataLoader(data, batch_size=8), max_duration="2ba", device="cpu",
                   optimizers=torch.optim.SGD(model.parameters(), lr=0.1), progress_bar=False,
                   log_to_console=False, **kwargs)


@pytest.mark.parametrize("kwargs,message", [
    (dict(weight_bits=16), r"weights: codec 'minmax'.*bits=16"),
    (dict(grad_rounding="round"), r"rounding='round'"),
    (dict(bucket_size=-1), r"bucket_size=-1"),
    (dict(exclude="model.wte"), r"must be a list of fnmatch patterns"),
    (dict(min_numel="big"), r"min_numel='big' is invalid"),
    (dict(preset="w3g3"), r"unknown QSDP preset .w3g3.; allowed: qwd-w3g2-loco, qwd-w3g3-loco, qwd-w4g2-loco, qwd-w4g3-loco, qwd-w4g4, sdp4bit, tlq-hs, w4g4, w8g4, w8g4-paper, w8g8, zeropp"),
])
def test_out_of_range_options_fail_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        QSDPConfig.from_preset(kwargs.pop("preset", "w8g8"), **kwargs)


def test_defaults_are_w8g8_stochastic():
    config = QSDP().config
    assert config == from_preset("w8g8")
    assert (config.weights.bits, config.grads.bits, config.weights.bucket_size) == (8, 8, 1024)
    weights, grads = build_scheme("weights", config.weights, 8), build_scheme("grads", config.grads, 8)
    assert weights.codec.rounding == grads.codec.rounding == "stochastic"


def test_options_change_the_preset():
    config = QSDPConfig.from_preset("w8g4", weight_bucket_size=2048, exclude=["model.wte"],
                                    weight_bits_overrides={"*": None})
    assert config.weights.bits_overrides == {"*": None} and config.exclude == ("model.wte",)
    assert (config.grads.bits, config.weights.bucket_size, config.grads.bucket_size) == (4, 2048, 256)
    assert QSDP(config).config is config
    assert QSDPConfig.from_preset(grad_bits=None).grads.bits is None  # None is a value, not "unset"
    assert repr(QSDP("w4g4")) == "QSDP('w4g4', weight_bits=4, grad_bits=4)"


def test_run_validation_picks_the_adapter_of_the_run():
    with pytest.raises(ValueError, match=r"does not use FSDP.*\(FSDP1; FSDP2 with .*FSDP_VERSION=2 .*FSDP2Config\)"):
        check_run(0, 2)
    with pytest.raises(ValueError, match=r"fsdp_config_version=3; QSDP supports 1 \(FSDP1\) and 2 \(FSDP2\)"):
        check_run(3, 2)
    with pytest.warns(UserWarning, match="world size 1"):
        assert check_run(1, 1) is None
    assert check_run(1, 8) == "fsdp1"
    assert check_run(2, 2) == ("fsdp2-custom" if HAS_CUSTOM_COMM_API else "fsdp2-proxy")


def test_fsdp2_runs_take_the_proxy_path_on_torch_without_custom_collectives(monkeypatch):
    monkeypatch.setattr(compat, "HAS_CUSTOM_COMM_API", False)  # torch 2.6-2.8
    assert check_run(2, 2) == "fsdp2-proxy"


def test_trainer_without_fsdp_is_refused_at_after_load():
    with pytest.raises(ValueError, match="does not use FSDP"):
        _trainer(algorithms=[QSDP()])


def test_world_size_one_warns_and_trains_unchanged():
    qsdp = QSDP()
    with pytest.warns(UserWarning, match="world size 1"):
        trainer = _trainer(algorithms=[qsdp], parallelism_config={"fsdp": FSDP2Config()})
    assert trainer.state.fsdp_config_version == 2
    assert qsdp.handle is None and not qsdp.match(Event.BATCH_END, trainer.state)
    trainer.fit()
    assert qsdp.traffic().total.calls == 0
    trainer.close()


class _ModeHandle:
    """The part of a QSDPHandle the evaluation events use: the weight gather mode and the byte counters."""

    def __init__(self) -> None:
        self.weight_gathers = "quantized"

    def set_weight_gathers(self, mode: str) -> str:
        previous, self.weight_gathers = self.weight_gathers, mode
        return previous

    def traffic(self):
        from composer_qsdp.comm import TrafficCounter, TrafficReport

        return TrafficReport(TrafficCounter(), TrafficCounter())


def test_evaluations_gather_by_label_and_an_evaluation_that_raised_is_undone_at_the_next_batch():
    from types import SimpleNamespace

    qsdp = QSDP(QSDPConfig.from_preset("w8g8", eval_weights={"val_quantized": "quantized"}))
    qsdp.handle = handle = _ModeHandle()
    for label, mode in (("val", "exact"), ("val_quantized", "quantized"), ("val", "exact")):
        state = SimpleNamespace(dataloader_label=label)
        assert qsdp.match(Event.EVAL_START, state)
        qsdp.apply(Event.EVAL_START, state, None)
        assert handle.weight_gathers == mode
    # The last evaluation raised: no EVAL_END. Training's gathers come back before the next batch's forward.
    assert qsdp.match(Event.BATCH_START, state)
    qsdp.apply(Event.BATCH_START, state, None)
    assert handle.weight_gathers == "quantized"
    assert not qsdp.match(Event.BATCH_START, state) and not qsdp.match(Event.FIT_START, state)
