"""The FSDP1 adapter beyond the scenarios every adapter passes (tests/fsdp2/test_fsdp_training.py runs those with
``use_orig_params=True``): ``use_orig_params=False``, ``SHARD_GRAD_OP``, LoCo's error feedback (``w8g4``), mixed
precision as Composer configures it, units of several FSDP1 roots (Composer's wrapping) and the configurations QSDP
refuses. Real spawned ranks against
the exact single-process reference of tests/sharded_mlp.py; one spawn per backend.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from dist_spawn import RankInfo, run_ranks, skip_unless_backend, spawn_params
from sharded_mlp import HID, IN, LR, ODD, OUT, STEPS, Adapter, Capture, MLP, _train, batch, reference_training

from composer_qsdp.config import from_preset
from composer_qsdp.schemes import build_scheme

W8G8 = from_preset("w8g8", bucket_size=64, seed=7)
QWD = from_preset("w8g8", weight_scheme="difference", weight_bits=4, weight_codec="symmetric", bucket_size=64,
                  seed=7)
LOCO = from_preset("w8g4", bucket_size=64, grad_bucket_size=64, seed=7)  # LoCo's feedback, int8 residual
FLAT = Adapter("fsdp1", use_orig_params=False)
ORIG = Adapter("fsdp1")
UNITS = {"l1": IN * HID + HID, "l2": HID * ODD + ODD, "l3": ODD * OUT + OUT}  # unsharded elements per unit


class _TwoRoots(nn.Module):
    """A model whose children are FSDP1 roots, as Composer wraps a ``ComposerModel``'s children."""

    def __init__(self, info: RankInfo) -> None:
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        super().__init__()
        self.body = FullyShardedDataParallel(MLP(), auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
                                             device_id=info.device)
        torch.manual_seed(5)
        self.head = FullyShardedDataParallel(nn.Linear(OUT, OUT), device_id=info.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def _run(info: RankInfo, adapter: Adapter, config, capture: bool = True, **fsdp1_options) -> dict:
    model = adapter.shard(info, fsdp1_options=fsdp1_options)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    handle = adapter.apply(model, config, optimizers=opt)
    out = _train(info, model, STEPS, opt, capture=Capture(model) if capture else None, grads=adapter.use_orig_params)
    out["traffic"] = handle.traffic()
    out["keyframes"] = [getattr(u.weights, "keyframes", None) for u in handle.units]
    out["residuals"] = {u.name: u.grads.residual.decode().reshape(-1) for u in handle.units
                        if getattr(u.grads, "residual", None) is not None}
    return out


def _two_roots(info: RankInfo) -> dict:
    from composer_qsdp.fsdp1 import apply_qsdp
    from composer_qsdp.fsdp1.units import find_roots

    model = _TwoRoots(info)
    handle = apply_qsdp(model, from_preset("w8g8", bucket_size=64, exclude=["head"]))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(2):
        x, y = batch(info.rank, step)
        nn.functional.mse_loss(model(x.to(info.device)), y.to(info.device)).backward()
        opt.step()
        opt.zero_grad()
    return {"roots": [type(r.module).__name__ for r in find_roots(model)],
            "units": {u.name: (u.quantized, u.weights.traffic, u.grads.traffic) for u in handle.units}}


def _refusal(make) -> str:
    try:
        make()
    except ValueError as err:
        return str(err)
    return "no error"


def _refusals(info: RankInfo) -> dict:
    from torch.distributed.fsdp import CPUOffload, ShardingStrategy

    from composer_qsdp.fsdp2 import apply_qsdp as apply_fsdp2
    from composer_qsdp.fsdp1 import apply_qsdp

    def hooked():
        model = ORIG.shard(info)
        model.register_comm_hook(None, lambda state, grad, output=None: None)
        return apply_qsdp(model, W8G8)

    def twice():
        model = ORIG.shard(info)
        apply_qsdp(model, W8G8)
        return apply_qsdp(model, W8G8)

    no_shard = {"sharding_strategy": ShardingStrategy.NO_SHARD}
    offload = {"cpu_offload": CPUOffload(offload_params=True)}
    return {
        "no_shard": _refusal(lambda: apply_qsdp(ORIG.shard(info, fsdp1_options=no_shard))),
        "offload": _refusal(lambda: apply_qsdp(ORIG.shard(info, fsdp1_options=offload))),
        "hooked": _refusal(hooked),
        "twice": _refusal(twice),
        "fsdp2_model": _refusal(lambda: apply_qsdp(Adapter("fsdp2-proxy").shard(info))),
        "fsdp1_model_to_fsdp2": _refusal(lambda: apply_fsdp2(ORIG.shard(info))),
    }


def _in_place_change(info: RankInfo) -> list[str]:
    """The units whose weight-difference scheme hears of an in-place weight edit between two forwards (no step):
    FSDP1's handle reads the version counters of the units' flat and original parameters (fsdp1/compat.py)."""
    model = ORIG.shard(info)
    handle = ORIG.apply(model, QWD)
    changed: list[str] = []
    for unit in handle.units:
        unit.weights.on_weights_changed = lambda name=unit.name: changed.append(name)
    x, _ = batch(info.rank, 0)
    model(x.to(info.device))
    assert changed == []
    with torch.no_grad():
        next(next(u for u in handle.units if u.name == "l2").module.parameters()).mul_(0.5)
    model(x.to(info.device))
    return changed


def _worker(info: RankInfo) -> dict:
    from composer.distributed.mosaic_parallelism import get_mixed_precision
    from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy

    out = {
        "flat_params": _run(info, FLAT, W8G8),
        "flat_params_difference": _run(info, FLAT, QWD),
        "shard_grad_op": _run(info, ORIG, W8G8, sharding_strategy=ShardingStrategy.SHARD_GRAD_OP),
        "loco": _run(info, ORIG, LOCO),
        "two_roots": _two_roots(info),
        "refusals": _refusals(info),
        "in_place_change": _in_place_change(info),
    }
    for name in ("DEFAULT", "PURE"):  # Composer's FSDP1 settings for precision='amp_bf16'
        composer = {"mixed_precision": get_mixed_precision("amp_bf16", name)[0],
                    "backward_prefetch": BackwardPrefetch.BACKWARD_POST, "limit_all_gathers": True}
        out[f"composer_{name.lower()}"] = _run(info, ORIG, W8G8, capture=False, **composer)
    return out


@pytest.fixture(scope="module", params=spawn_params((2,)))
def results(request) -> list[dict]:
    backend, world = request.param
    skip_unless_backend(backend, world)
    return run_ranks(_worker, world, backend=backend)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _check_training(results: list[dict], key: str, tolerance: float = 1e-2) -> None:
    """Identical weights on both ranks, forward = backward weights, and the exact reference within ``tolerance``."""
    ref_params, ref_losses = reference_training(2, STEPS)
    for step, weights in enumerate(results[0][key]["forward"]):
        for name, weight in weights.items():
            assert torch.equal(results[1][key]["forward"][step][name], weight), (step, name)
    for rank in range(2):
        res = results[rank][key]
        for step, weights in enumerate(res["backward"]):
            for name, weight in weights.items():
                assert torch.equal(res["forward"][step][name], weight), (rank, step, name)
        for name, ref in ref_params.items():
            assert _rel(res["params"][name], ref) < tolerance, (key, name)
        assert max(abs(a - b) for a, b in zip(res["losses"], ref_losses)) < tolerance


def test_flat_parameters_train_like_the_reference(results):  # use_orig_params=False
    _check_training(results, "flat_params")
    traffic = results[0]["flat_params"]["traffic"]
    assert traffic.weights.calls == 2 * 3 * STEPS and traffic.grads.calls == 3 * STEPS
    assert 3.5 < traffic.total.ratio_vs_native < 4  # 8-bit codes + 8 bytes per 64-element bucket vs fp32


def test_weight_differences_on_flat_parameters_send_one_keyframe(results):
    _check_training(results, "flat_params_difference")
    res = results[0]["flat_params_difference"]
    assert res["keyframes"] == [1, 1, 1]  # the optimizer's updates of the flat parameter are no outside edits
    codec = build_scheme("weights", QWD.weights, 4).codec
    per_rank = [-(-numel // 2) for numel in UNITS.values()]  # each flat parameter padded to a multiple of 2
    assert res["traffic"].weights.sent == sum(4 * n + (STEPS - 1) * codec.wire_bytes(n) for n in per_rank)


def test_loco_feeds_each_ranks_error_back_on_fsdp1(results):
    """``w8g4``'s LoCo gradients on FSDP1's flat parameters: one int8 residual of each unit's padded flat gradient
    per rank, its own rank's error, and training within the exact reference's bound of the other presets."""
    _check_training(results, "loco")
    per_rank = {name: -(-numel // 2) for name, numel in UNITS.items()}  # each flat parameter padded to a multiple of 2
    for rank in range(2):
        residuals = results[rank]["loco"]["residuals"]
        assert {name: r.numel() for name, r in residuals.items()} == {n: 2 * k for n, k in per_rank.items()}
        for name, r in residuals.items():
            assert torch.isfinite(r).all() and r.abs().max() > 0, (rank, name)
    assert all(not torch.equal(results[0]["loco"]["residuals"][n], results[1]["loco"]["residuals"][n]) for n in UNITS)
    grads = results[0]["loco"]["traffic"].grads
    assert grads.calls == 3 * STEPS and 6 < grads.ratio_vs_native < 8  # 4-bit codes + a scale pair per 64 vs fp32


def test_shard_grad_op_gathers_once_per_step(results):
    _check_training(results, "shard_grad_op")
    traffic = results[0]["shard_grad_op"]["traffic"]
    assert traffic.weights.calls == 3 * STEPS and traffic.grads.calls == 3 * STEPS  # no backward re-gather


@pytest.mark.parametrize("name,grad_bytes", [("default", 4), ("pure", 2)])
def test_composer_mixed_precision_gathers_bf16_and_reduces_in_its_dtype(results, name, grad_bytes):
    res = results[0][f"composer_{name}"]
    assert res["traffic"].weights.native == res["traffic"].weights.bf16  # bf16 all-gather inputs
    assert res["traffic"].grads.native == grad_bytes // 2 * res["traffic"].grads.bf16  # fp32 / bf16 reductions
    ref_params, _ = reference_training(2, STEPS)
    for rank in range(2):
        for param, ref in ref_params.items():
            assert _rel(results[rank][f"composer_{name}"]["params"][param], ref) < 2e-2, (name, param)


def test_an_in_place_weight_change_outside_a_step_is_seen_through_the_version_counters(results):
    assert [r["in_place_change"] for r in results] == [["l2"], ["l2"]]


def test_units_of_several_roots_are_named_like_fsdp2_units(results):
    res = results[0]["two_roots"]
    assert res["roots"] == ["MLP", "Linear"]
    assert list(res["units"]) == ["body.l1", "body.l2", "body.l3", "head"]  # no _fsdp_wrapped_module segments
    for name, (quantized, weights, grads) in res["units"].items():
        # FSDP1 keeps a root's parameters gathered from forward to backward; the others gather twice a step.
        assert (weights.calls, grads.calls) == ((2, 2) if name == "head" else (4, 2)), name
        assert quantized == (name != "head")  # exclude=["head"]
        assert (weights.sent < weights.native) == quantized and (grads.sent < grads.native) == quantized


def test_unsupported_configurations_are_refused_with_what_to_do(results):
    for rank in range(2):
        refused = results[rank]["refusals"]
        assert "uses sharding_strategy=NO_SHARD; QSDP supports FULL_SHARD and SHARD_GRAD_OP" in refused["no_shard"]
        assert "(CPUOffload(offload_params=True)); QSDP's FSDP1 adapter supports offload_params=False" in (
            refused["offload"])
        assert "already has a communication hook" in refused["hooked"]
        assert "QSDP is already applied to this model; call remove_qsdp(model)" in refused["twice"]
        assert "has no FSDP1 unit with parameters" in refused["fsdp2_model"]
        assert "for fully_shard use composer_qsdp.apply_qsdp" in refused["fsdp2_model"]
        assert "for FSDP1's FullyShardedDataParallel use composer_qsdp.fsdp1.apply_qsdp" in (
            refused["fsdp1_model_to_fsdp2"])


@pytest.fixture
def one_rank_model():
    """An FSDP1 model on a 1-rank gloo group (FSDP1 switches it to NO_SHARD, with a warning)."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    with pytest.warns(UserWarning, match="NO_SHARD"):
        model = FullyShardedDataParallel(MLP(), device_id=torch.device("cpu"))
    yield model
    if created:
        dist.destroy_process_group()


def test_a_single_rank_is_refused_as_no_shard(one_rank_model):
    """(The Composer algorithm skips world size 1 before applying.)"""
    from composer_qsdp.fsdp1 import apply_qsdp

    with pytest.raises(ValueError, match=r"NO_SHARD has no all-gather .*FSDP1 also picks it at world size 1"):
        apply_qsdp(one_rank_model)


def test_the_fsdp1_internals_fit_this_torch_and_a_move_is_named(one_rank_model, monkeypatch):
    # If the first call fails, a torch release moved a private name the adapter relies on: the message names it.
    from torch.distributed.fsdp import _runtime_utils
    from torch.distributed.fsdp._flat_param import FlatParamHandle

    from composer_qsdp.fsdp1 import compat

    compat.check_fsdp1_support(one_rank_model)
    monkeypatch.setattr(FlatParamHandle, "unshard", lambda self: None)
    monkeypatch.setattr(_runtime_utils, "_reduce_grad", lambda state, handle: None)
    message = (rf"FSDP1 adapter does not fit torch {re.escape(str(torch.__version__))}: FlatParamHandle.unshard no "
               r"longer calls self._all_gather_flat_param; _runtime_utils._reduce_grad no longer passes")
    with pytest.raises(RuntimeError, match=message):
        compat.check_fsdp1_support(one_rank_model)
