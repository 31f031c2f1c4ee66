"""Evaluation of the exact weights (``QSDPHandle.set_weight_gathers("exact")`` / ``exact_weights()``), on 2 gloo
ranks through FSDP2 and FSDP1.

References are independent of QSDP's gathers: the weights each layer computes with are captured in the forward and
compared with the full-precision parameters (gathered by ``full_tensors``, which QSDP leaves exact) or with a
single-process model holding the captured weights. The root unit of every model here owns a layer (``l3``): FSDP
keeps the root's weights gathered after a forward without a backward, which is where an evaluation's gathers could
leak into the next training step.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from dist_spawn import RankInfo, run_ranks
from sharded_mlp import LAYERS, LR, MLP, batch, full_tensors, layer

from composer_qsdp.config import QSDPConfig

STEPS, EVAL_EVERY = 6, 2
PRESETS = ("w8g8", "qwd-w4g4", "qwd-w4g2-loco")


def _shard(info: RankInfo, adapter: str) -> nn.Module:
    """l1 and l2 their own units, the root unit owning l3."""
    model = MLP()
    if adapter == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        model.l1, model.l2 = (FSDP(m, device_id=info.device, use_orig_params=True) for m in (model.l1, model.l2))
        return FSDP(model, device_id=info.device, use_orig_params=True)
    from torch.distributed.fsdp import fully_shard

    for name in ("l1", "l2"):
        fully_shard(getattr(model, name), mesh=info.mesh())
    fully_shard(model, mesh=info.mesh())
    return model


def _apply(adapter: str, model: nn.Module, config: QSDPConfig):
    if adapter == "fsdp1":
        from composer_qsdp.fsdp1 import apply_qsdp
    else:
        from composer_qsdp.fsdp2 import apply_qsdp
    return apply_qsdp(model, config)


class _Seen:
    """The weights and biases each layer computed with in the latest forward."""

    def __init__(self, model: nn.Module) -> None:
        self.weights: dict[str, torch.Tensor] = {}
        for name in LAYERS:
            layer(model, name).register_forward_pre_hook(self._hook(name))

    def _hook(self, name: str):
        def hook(module: nn.Module, args) -> None:
            self.weights[f"{name}.weight"] = module.weight.detach().clone()
            self.weights[f"{name}.bias"] = module.bias.detach().clone()
        return hook


def _loss_with(weights: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The loss of a single-process MLP holding ``weights``: plain evaluation, no FSDP."""
    reference = MLP()
    reference.load_state_dict(weights)
    with torch.no_grad():
        return nn.functional.mse_loss(reference(x), y)


def _eval_batch(info: RankInfo) -> tuple[torch.Tensor, torch.Tensor]:
    return batch(info.rank, 1000)


def _evaluate(model: nn.Module, info: RankInfo) -> torch.Tensor:
    x, y = _eval_batch(info)
    with torch.no_grad():
        return nn.functional.mse_loss(model(x), y)


def _train_step(model: nn.Module, opt: torch.optim.Optimizer, info: RankInfo, step: int) -> None:
    x, y = batch(info.rank, step)
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad()


def _eval_losses_side(info: RankInfo, preset: str, adapter: str) -> dict:
    """Two training steps, then an exact evaluation and a quantized one, each against its own reference."""
    model = _shard(info, adapter)
    handle = _apply(adapter, model, QSDPConfig.from_preset(preset))
    seen = _Seen(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(2):
        _train_step(model, opt, info, step)
    exact_params = full_tensors(model)
    x, y = _eval_batch(info)
    with handle.exact_weights():
        exact = _evaluate(model, info)
    exact_seen = dict(seen.weights)
    assert handle.weight_gathers == "quantized"
    quantized = _evaluate(model, info)  # today's behaviour: the gathers of a training forward
    quantized_seen = dict(seen.weights)
    return {
        "exact_seen_is_exact": all(torch.equal(exact_seen[k], exact_params[k]) for k in exact_params),
        "exact_loss": exact, "exact_reference": _loss_with(exact_params, x, y),
        "quantized_seen_is_exact": all(torch.equal(quantized_seen[k], exact_params[k]) for k in ("l1.weight",
                                                                                                "l3.weight")),
        "quantized_loss": quantized, "quantized_reference": _loss_with(quantized_seen, x, y),
        "exact_bytes": handle.exact_traffic().sent, "exact_native": handle.exact_traffic().native,
    }


@pytest.mark.parametrize("preset", ["w8g8", "qwd-w4g4"])
def test_exact_evaluation_loss_is_plain_evaluation_of_the_same_weights(preset):
    """Bitwise: each rank's evaluation computes the same fp32 ops on the same batch with the same (exact) weights
    as a single-process model holding the full-precision parameters, so not even the summation order differs."""
    for rank in run_ranks(_eval_losses_side, 2, preset, "fsdp2"):
        assert rank["exact_seen_is_exact"]
        assert torch.equal(rank["exact_loss"], rank["exact_reference"])
        # "quantized" is today's evaluation: the quantized weights, and the loss computed with them.
        assert not rank["quantized_seen_is_exact"]
        assert torch.equal(rank["quantized_loss"], rank["quantized_reference"])
        assert not torch.equal(rank["quantized_loss"], rank["exact_loss"])
        # Counted apart, as unquantized gathers of fp32 shards (the model is not mixed precision).
        assert rank["exact_bytes"] == rank["exact_native"] > 0


def _state_equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_state_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_state_equal(x, y) for x, y in zip(a, b))
    return a == b


def _training_side(info: RankInfo, preset: str, adapter: str, evaluate: str | None) -> dict:
    """Train STEPS steps; after every EVAL_EVERY-th an evaluation of the weights ``evaluate`` ("exact",
    "quantized") or none. Returns the parameters, the handle's state and the training losses."""
    model = _shard(info, adapter)
    handle = _apply(adapter, model, QSDPConfig.from_preset(preset))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        x, y = batch(info.rank, step)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
        if evaluate is not None and step % EVAL_EVERY == 0:
            if evaluate == "exact":
                with handle.exact_weights():
                    _evaluate(model, info)
                    _evaluate(model, info)  # a second batch: the root's weights are still gathered
            else:
                _evaluate(model, info)
    state = handle.state_dict()
    state.pop("exact_traffic")
    dist.barrier()
    return {"params": full_tensors(model), "state": state, "losses": losses}


def _bit_identity_side(info: RankInfo, preset: str, adapter: str) -> dict:
    plain = _training_side(info, preset, adapter, None)
    exact = _training_side(info, preset, adapter, "exact")
    quantized = _training_side(info, preset, adapter, "quantized")
    return {
        "params": _state_equal(plain["params"], exact["params"]),
        "state": _state_equal(plain["state"], exact["state"]),
        "losses": _state_equal(plain["losses"], exact["losses"]),
        # The check can fail: a quantized evaluation draws seeds, so stochastic rounding after it differs.
        "quantized_differs": not _state_equal(plain["params"], quantized["params"]),
    }


@pytest.mark.parametrize("preset", PRESETS)
def test_training_with_exact_evaluations_is_bit_identical_to_training_without(preset):
    """Direct W8G8 (stochastic rounding: seeds), qWD (a reference the gathers advance) and qWD with LoCo (residuals);
    qwd-w4g2-loco rounds to nearest on both sides, so even a quantized evaluation leaves it unchanged."""
    stochastic = preset != "qwd-w4g2-loco"
    for rank in run_ranks(_bit_identity_side, 2, preset, "fsdp2"):
        assert rank == {"params": True, "state": True, "losses": True, "quantized_differs": stochastic}


def test_fsdp1_exact_evaluations_leave_training_bit_identical():
    for rank in run_ranks(_bit_identity_side, 2, "w8g8", "fsdp1"):
        assert rank == {"params": True, "state": True, "losses": True, "quantized_differs": True}


def _modes_side(info: RankInfo) -> dict:
    model = _shard(info, "fsdp2")
    handle = _apply("fsdp2", model, QSDPConfig.from_preset("w8g8"))
    problems = []
    try:
        handle.set_weight_gathers("exactly")
    except ValueError as err:
        problems.append(str(err))
    try:
        with handle.exact_weights():
            raise RuntimeError("an evaluation failed")
    except RuntimeError:
        pass
    return {"problems": problems, "mode_after_exception": handle.weight_gathers}


def test_weight_gather_modes_are_checked_and_restored_after_an_exception():
    for rank in run_ranks(_modes_side, 2):
        assert rank["mode_after_exception"] == "quantized"
        assert rank["problems"] == ["weight gather mode 'exactly' is invalid; allowed: 'exact', 'quantized'"]
