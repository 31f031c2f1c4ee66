"""QSDP on raw sharded models: real spawned ranks trained against an exact single-process reference, through every
adapter: FSDP2 by its custom-collective API (torch >= 2.9) and by its internal collectives (the path of torch 2.6-2.8,
forced here on newer torch), and FSDP1 (``use_orig_params=True``; tests/fsdp1 covers the rest of FSDP1).

One spawn per (backend, world size, adapter) runs the scenarios (plain FSDP, QSDP off, QSDP removed, W8G8,
weights-only, mixed precision, gradient accumulation, activation checkpointing, non-finite gradients and weights,
checkpoint save -> resume, weight differences); the tests check the results. The model, data and reference are in
tests/sharded_mlp.py; the model has a layer of 67 rows, which no world size here divides (uneven shards).
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from dist_spawn import RankInfo, run_ranks, skip_unless_backend, spawn_params
from sharded_mlp import (
    BATCH,
    HID,
    IN,
    LR,
    ODD,
    OUT,
    STEPS,
    Adapter,
    Capture,
    MLP,
    _train,
    batch,
    full_tensors,
    global_batch,
    local_shard,
    reference_training,
)

from composer_qsdp.config import from_preset
from composer_qsdp.schemes import build_scheme
from composer_qsdp.fsdp2 import HAS_CUSTOM_COMM_API, check_custom_comm_support
from composer_qsdp.engine import NonFiniteWeightError

W8G8 = from_preset("w8g8", bucket_size=64, seed=7)
WEIGHTS_ONLY = from_preset("w8g8", grad_bits=None, bucket_size=64, seed=7)
GRADS_ONLY = from_preset("w8g8", weight_bits=None, bucket_size=64, seed=7)
OFF = from_preset("w8g8", weight_bits=None, grad_bits=None)
# The same settings with the gradient collectives on a second group of the same ranks (and OFF's passthrough one).
SEPARATE = {"w8g8": from_preset("w8g8", bucket_size=64, seed=7, separate_grad_group=True),
            "off": from_preset("w8g8", weight_bits=None, grad_bits=None, separate_grad_group=True)}
ACCUMULATION = 2  # microbatches per optimizer step in the accumulation scenario
# SDP4Bit's weight differences (symmetric INT4, round to nearest; small groups for these small layers), 8-bit grads.
# 4-bit weights in buckets aligned to parameters, biases sent as they are.
ALIGNED = from_preset("w4g4", bucket_size=64, seed=7,
                      weight_scheme_options={"align_buckets": True, "unquantized_params": ["bias"]})
QWD = from_preset("w8g8", weight_scheme="difference", weight_bits=4, weight_codec="symmetric", bucket_size=64,
                  seed=7)


# ---------------------------------------------------------------------------------------------- rank side
def _accumulation_scenario(info: RankInfo, adapter: Adapter) -> dict:
    """Each step's batch in ACCUMULATION microbatches, one optimizer step: QSDP's step boundary is that step."""
    model = adapter.shard(info)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    handle = adapter.apply(model, W8G8, optimizers=opt)
    return _train(info, model, STEPS, opt, capture=Capture(model), microbatches=ACCUMULATION, handle=handle)


def _difference_scenario(info: RankInfo, adapter: Adapter) -> dict:
    """qWD: train, compare the reference with the gathered weights, then edit a weight outside the optimizer."""
    model = adapter.shard(info)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    handle = adapter.apply(model, QWD, optimizers=opt)
    capture = Capture(model)
    out = _train(info, model, STEPS, opt, capture=capture)
    out["traffic"] = handle.traffic()
    l2 = next(u for u in handle.units if u.name == "l2")
    out["split"] = {k: v.clone() for k, v in l2.weights.layout.split(l2.weights.reference).items()}
    out["memory"] = handle.memory_bytes()
    with torch.no_grad():
        model.l2.weight.mul_(0.5)  # outside the optimizer: the next gather of l2 must be a keyframe
    edited = full_tensors(model)["l2.weight"]
    keyframes = [u.weights.keyframes for u in handle.units]
    model(batch(info.rank, 0)[0].to(info.device))
    out["after_edit"] = {"expected": edited, "gathered": capture.forward["l2"],
                         "keyframes": [u.weights.keyframes - k for u, k in zip(handle.units, keyframes)]}
    return out


def _checkpoint_scenario(info: RankInfo, adapter: Adapter, ckpt_dir: str, config) -> dict:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    def fresh():
        model = adapter.shard(info)
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
        return model, opt, adapter.apply(model, config, optimizers=opt)

    model, opt, handle = fresh()
    _train(info, model, 3, opt)
    saved_params = full_tensors(model)
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd, "qsdp": handle.state_dict()}, checkpoint_id=ckpt_dir)
    capture = Capture(model)
    continued = _train(info, model, 3, opt, first_step=3, capture=capture)

    model, opt, handle = fresh()
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd, "qsdp": handle.state_dict()}
    dcp.load(state, checkpoint_id=ckpt_dir)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    handle.load_state_dict(state["qsdp"])
    resumed = _train(info, model, 3, opt, first_step=3)
    return {"saved_params": saved_params, "continued": continued, "resumed": resumed}


def _nonfinite_weight_scenario(info: RankInfo, adapter: Adapter) -> str:
    model = adapter.shard(info)
    adapter.apply(model, W8G8)
    _train(info, model, 1)
    if info.rank == 0:
        with torch.no_grad():  # a diverged master weight on one rank's shard
            local_shard(model.l2.weight).view(-1)[0] = float("nan")
    try:  # 3 steps: on CUDA the check reports one step late, at the third forward
        _train(info, model, 3)
    except NonFiniteWeightError as err:
        return str(err)
    return "no error"


def _reduce_scatter_avg_sums(info: RankInfo) -> bool:
    """Whether this backend's reduce_scatter_tensor(AVG) sums instead (gloo on torch 2.6/2.7, pytorch#162338)."""
    ones = torch.ones(info.world_size, device=info.device)
    out = torch.empty(1, device=info.device)
    dist.reduce_scatter_tensor(out, ones, op=dist.ReduceOp.AVG)
    return out.item() == info.world_size


def _worker(info: RankInfo, ckpt_dir: str, adapter: Adapter) -> dict:
    out: dict = {"adapter": adapter.name, "avg_sums": _reduce_scatter_avg_sums(info)}
    model = adapter.shard(info)
    handle = adapter.apply(model, W8G8)
    capture = Capture(model)
    out["describe"] = handle.describe()
    out["w8g8"] = _train(info, model, STEPS, capture=capture)
    out["w8g8"]["traffic"] = handle.traffic()
    out["w8g8"]["errors"] = {k: v.item() for k, v in handle.take_quantization_errors().items()}
    if info.world_size > 2:
        return out  # the larger world checks the main invariants only

    out["plain"] = _train(info, adapter.shard(info), STEPS)
    model = adapter.shard(info)
    handle = adapter.apply(model, OFF)
    out["off"] = _train(info, model, STEPS)
    out["off"]["traffic"] = handle.traffic()
    model = adapter.shard(info)
    adapter.apply(model, W8G8)
    adapter.remove(model)
    out["removed"] = _train(info, model, STEPS)

    for name, config in SEPARATE.items():
        model = adapter.shard(info)
        handle = adapter.apply(model, config)
        out[f"separate_{name}"] = _train(info, model, STEPS)
        out[f"separate_{name}"]["groups"] = [
            (u.grads.group is not u.weights.group,
             dist.get_process_group_ranks(u.grads.group) == dist.get_process_group_ranks(u.weights.group))
            for u in handle.units]

    model = adapter.shard(info)
    adapter.apply(model, WEIGHTS_ONLY)
    out["weights_only"] = _train(info, model, 1, capture=Capture(model))
    model = adapter.shard(info)
    adapter.apply(model, GRADS_ONLY)
    out["grads_only"] = _train(info, model, 1, capture=Capture(model))
    model = adapter.shard(info)
    out["plain_captured"] = _train(info, model, 1, capture=Capture(model))

    model = adapter.shard(info, mixed_precision=True)
    handle = adapter.apply(model, W8G8)
    out["mixed_precision"] = _train(info, model, STEPS)
    out["mixed_precision"]["traffic"] = handle.traffic()

    if hasattr(model, "set_force_sum_reduction_for_comms"):  # FSDP2 on torch >= 2.8
        model = adapter.shard(info)  # FSDP sends SUM and divides by the world size itself
        for module in (model, model.l1, model.l2, model.l3):
            module.set_force_sum_reduction_for_comms(True)
        adapter.apply(model, W8G8)
        out["force_sum"] = _train(info, model, STEPS)
        model = adapter.shard(info)  # a custom divide factor makes FSDP pass PREMUL_SUM, which a quantized sum
        model.l1.set_gradient_divide_factor(4.0)  # cannot apply
        adapter.apply(model, W8G8)
        try:
            _train(info, model, 1)
            out["premul_sum"] = "no error"
        except ValueError as err:
            out["premul_sum"] = str(err)

    out["accumulation"] = _accumulation_scenario(info, adapter)
    model = adapter.shard(info)
    try:
        adapter.apply(model, ALIGNED)
        out["aligned"] = _train(info, model, 2, capture=Capture(model))
    except ValueError as err:  # FSDP1: ranks hold pieces of different parameters
        out["aligned"] = str(err)
    model = adapter.shard(info, checkpoint_l2=True)
    adapter.apply(model, W8G8)
    out["activation_checkpointing"] = _train(info, model, STEPS, capture=Capture(model))

    model = adapter.shard(info)
    adapter.apply(model, W8G8)
    out["nonfinite_grads"] = _train(info, model, 1, poison=(1, 0))
    out["checkpoint"] = _checkpoint_scenario(info, adapter, ckpt_dir, W8G8)
    out["difference"] = _difference_scenario(info, adapter)
    out["checkpoint_difference"] = _checkpoint_scenario(info, adapter, ckpt_dir + "-qwd", QWD)
    out["nonfinite_weight"] = _nonfinite_weight_scenario(info, adapter)
    return out


# ---------------------------------------------------------------------------------------------- tests
def _params() -> list:
    """Every backend and world size through FSDP2's custom collectives (ids ``gloo-w2``...), plus the other
    adapters at world size 2 (``gloo-w2-fsdp2-proxy``, ``gloo-w2-fsdp1``...)."""
    params = []
    for param in spawn_params((2, 4)):
        backend, world = param.values[0]
        for adapter in ("fsdp2", "fsdp2-proxy", "fsdp1") if world == 2 else ("fsdp2",):
            suffix = "" if adapter == "fsdp2" else f"-{adapter}"
            params.append(pytest.param((backend, world, adapter), id=param.id + suffix, marks=param.marks))
    return params


pytestmark = pytest.mark.parametrize("run", _params(), indirect=True, scope="module")


@pytest.fixture(scope="module")
def run(request, tmp_path_factory):
    backend, world, adapter = request.param
    skip_unless_backend(backend, world)
    if adapter == "fsdp2" and not HAS_CUSTOM_COMM_API:
        try:
            check_custom_comm_support()
        except RuntimeError as err:
            pytest.skip(str(err))
    if adapter.startswith("fsdp2") and backend == "gloo" and torch.__version__ < "2.7":
        pytest.skip(f"FSDP2 cannot run on CPU with torch {torch.__version__} ('Stream' has no record_event)")
    ckpt_dir = str(tmp_path_factory.mktemp("dcp"))
    return world, run_ranks(_worker, world, ckpt_dir, Adapter(adapter), backend=backend), ckpt_dir


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _only_world_2(world: int) -> None:
    if world != 2:
        pytest.skip("scenario runs at world size 2")


def test_the_handle_names_its_adapter_and_comm_path(run):
    world, results, _ = run
    first = {"fsdp2": "fsdp2 (custom: FSDPModule.set_custom_all_gather", "fsdp2-proxy": "fsdp2 (proxy: a proxy",
             "fsdp1": "fsdp1 (gradients: register_comm_hook"}[results[0]["adapter"]]
    lines = results[0]["describe"].splitlines()
    assert lines[0].startswith(first) and torch.__version__ in lines[0], lines[0]
    assert [line.split(" (")[0] for line in lines[1:]] == ["l1", "l2", "l3"]  # the same unit names everywhere


def test_every_rank_computes_with_identical_weights(run):
    world, results, _ = run
    for step in range(STEPS):
        for name, weight in results[0]["w8g8"]["forward"][step].items():
            for rank in range(1, world):
                assert torch.equal(results[rank]["w8g8"]["forward"][step][name], weight), (step, name, rank)


def test_forward_and_backward_of_a_step_see_the_same_weights(run):
    world, results, _ = run
    for rank in range(world):
        res = results[rank]["w8g8"]
        for step in range(STEPS):
            for name, weight in res["backward"][step].items():
                assert torch.equal(res["forward"][step][name], weight), (rank, step, name)


def test_forward_weights_are_quantized_within_one_step(run):
    world, results, _ = run
    master = MLP()  # the weights of step 0
    for name in ("l1", "l2", "l3"):
        layer = getattr(master, name)
        values = torch.cat([layer.weight.detach().flatten(), layer.bias.detach(), torch.zeros(1)])  # 0: padding
        step = (values.max() - values.min()) / 255  # no 64-element bucket spans a wider range
        for key, value in ((name, layer.weight), (f"{name}.bias", layer.bias)):  # biases share buckets with padding
            err = (results[0]["w8g8"]["forward"][0][key] - value).abs().max()
            assert 0 < err <= step * (1 + 1e-5), key


def test_training_matches_exact_single_process_reference(run):
    world, results, _ = run
    ref_params, ref_losses = reference_training(world, STEPS)
    res = results[0]["w8g8"]
    for name, ref in ref_params.items():
        assert _rel(res["params"][name], ref) < 1e-2, name
        for rank in range(1, world):
            assert torch.equal(results[rank]["w8g8"]["params"][name], res["params"][name])
    assert max(abs(a - b) for a, b in zip(res["losses"], ref_losses)) < 1e-2


def test_traffic_is_quantized_and_counted(run):
    world, results, _ = run
    traffic = results[0]["w8g8"]["traffic"]
    assert traffic.weights.calls == 2 * 3 * STEPS  # forward + backward re-gather of the 3 units
    assert traffic.grads.calls == 3 * STEPS
    assert 3.5 < traffic.total.ratio_vs_native < 4  # 8-bit codes + 8 bytes per 64-element bucket vs fp32
    assert 0 < results[0]["w8g8"]["errors"]["weights"] < 0.05
    assert 0 < results[0]["w8g8"]["errors"]["grads"] < 0.05


def test_qsdp_off_and_removed_are_bit_identical_to_plain_fsdp(run):
    world, results, _ = run
    _only_world_2(world)
    for rank in range(world):
        plain = results[rank]["plain"]
        for variant in ("off", "removed"):
            assert results[rank][variant]["losses"] == plain["losses"], variant
            for name, value in plain["params"].items():
                assert torch.equal(results[rank][variant]["params"][name], value), (variant, name)
    off = results[0]["off"]["traffic"]
    assert off.total.sent == off.total.native > 0  # unquantized traffic is still counted


def test_gradients_on_a_twin_group_train_bit_for_bit_as_on_fsdps_group(run):
    """separate_grad_group moves every gradient collective, quantized (w8g8) or FSDP's own (off), to another group of
    the same ranks: the same collectives, so the same training to the bit."""
    world, results, _ = run
    _only_world_2(world)
    for rank in range(world):
        for name, same in (("w8g8", results[rank]["w8g8"]), ("off", results[rank]["plain"])):
            separate = results[rank][f"separate_{name}"]
            assert separate["groups"] == [(True, True)] * 3, name  # its own group, FSDP's ranks, every unit
            assert separate["losses"] == same["losses"], name
            for param, value in same["params"].items():
                assert torch.equal(separate["params"][param], value), (name, param)


def test_unquantized_weights_are_plain_fsdps_weights(run):
    """With only the gradients quantized, the weight side is plain FSDP2's gather: the first step computes with the
    very weights plain FSDP2 computes with, and its loss is plain FSDP2's to the bit (the gradients' quantization
    acts only after it)."""
    world, results, _ = run
    _only_world_2(world)
    for rank in range(world):
        grads_only, plain = results[rank]["grads_only"], results[rank]["plain_captured"]
        assert grads_only["losses"][0] == plain["losses"][0]
        assert grads_only["forward"][0].keys() == plain["forward"][0].keys()
        for name, weight in plain["forward"][0].items():
            assert torch.equal(grads_only["forward"][0][name], weight), name
        # ...and the step after it differs from plain FSDP2's: the quantized gradients were applied.
        assert any(not torch.equal(grads_only["params"][n], plain["params"][n]) for n in plain["params"])


def test_gradient_is_the_exact_gradient_at_the_quantized_weights(run):
    world, results, _ = run
    _only_world_2(world)
    res = results[0]["weights_only"]
    model = MLP()
    with torch.no_grad():
        for name in ("l1", "l2", "l3"):
            getattr(model, name).weight.copy_(res["forward"][0][name])
            getattr(model, name).bias.copy_(res["forward"][0][f"{name}.bias"])
    x, y = global_batch(world, 0)
    nn.functional.mse_loss(model(x), y).backward()
    # Unquantized, FSDP2's gradients pass through torch's reduce-scatter with FSDP2's AVG, which gloo sums on torch
    # 2.6/2.7 (pytorch#162338): plain FSDP2 does the same there. FSDP1's divisions are QSDP's hook's own.
    scale = world if results[0]["avg_sums"] and results[0]["adapter"] != "fsdp1" else 1
    for name, p in model.named_parameters():
        # fp32 summation-order noise only: other weights (another seed) would put ~1e-2 relative errors here.
        torch.testing.assert_close(res["grads0"][name], scale * p.grad, rtol=1e-4, atol=1e-6)


def test_mixed_precision_gathers_bf16_and_reduces_fp32(run):
    world, results, _ = run
    _only_world_2(world)
    res = results[0]["mixed_precision"]
    assert res["traffic"].weights.native == res["traffic"].weights.bf16  # bf16 all-gather inputs
    assert res["traffic"].grads.native == 2 * res["traffic"].grads.bf16  # fp32 reduce-scatter inputs
    ref_params, _ = reference_training(world, STEPS)
    for name, ref in ref_params.items():
        assert _rel(res["params"][name], ref) < 2e-2, name


def test_fsdp_reduce_ops_sum_and_premul_sum(run):
    world, results, _ = run
    _only_world_2(world)
    if "force_sum" not in results[0]:
        pytest.skip("FSDP2 sets its reduce op (set_force_sum_reduction_for_comms) from torch 2.8 on; FSDP1 has none")
    ref_params, _ = reference_training(world, STEPS)
    for name, ref in ref_params.items():  # force-sum: SUM on the wire, FSDP divides afterwards
        assert _rel(results[0]["force_sum"]["params"][name], ref) < 1e-2, name
    for rank in range(world):  # PREMUL_SUM: refused on every rank, with the fix in the message
        assert "got PREMUL_SUM" in results[rank]["premul_sum"]
        assert "set_force_sum_reduction_for_comms(True)" in results[rank]["premul_sum"]


def test_gradient_accumulation_steps_at_the_optimizer_step(run):
    world, results, _ = run
    _only_world_2(world)
    ref_params, ref_losses = reference_training(world, STEPS)
    for rank in range(world):
        res = results[rank]["accumulation"]
        assert res["seeds"] == [(step, micro) for step in range(STEPS) for micro in range(1, ACCUMULATION + 1)]
        for i, (fwd, bwd) in enumerate(zip(res["forward"], res["backward"])):
            for name, weight in bwd.items():
                assert torch.equal(fwd[name], weight), (rank, i, name)  # each microbatch's re-gather
        first, second = res["forward"][0]["l2"], res["forward"][1]["l2"]
        assert not torch.equal(first, second)  # the microbatches of one step draw independent weight noise
        for name, ref in ref_params.items():
            assert _rel(res["params"][name], ref) < 1e-2, name
        assert max(abs(a - b) for a, b in zip(res["losses"], ref_losses)) < 1e-2


def test_aligned_buckets_and_unquantized_biases(run):
    world, results, _ = run
    _only_world_2(world)
    if results[0]["adapter"] == "fsdp1":
        for rank in range(world):  # refused at apply, on every rank, saying why
            message = results[rank]["aligned"]
            assert "FSDP1 shards a unit's flat parameter as one contiguous range" in message, message
            assert "align_buckets and unquantized_params need FSDP2" in message, message
        return
    master = MLP()  # the weights of step 0
    for rank in range(world):
        res = results[rank]["aligned"]
        for name in ("l1", "l2", "l3"):
            layer = getattr(master, name)
            assert torch.equal(res["forward"][0][f"{name}.bias"], layer.bias.detach())  # sent unquantized
            weight = layer.weight.detach()
            step = (weight.max() - weight.min()) / 15  # buckets hold this weight only: no bias, no padding zeros
            err = (res["forward"][0][name] - weight).abs().max()
            assert 0 < err <= step * (1 + 1e-5), name
            assert torch.equal(res["forward"][0][name], results[0]["aligned"]["forward"][0][name])
            assert torch.equal(res["backward"][0][name], res["forward"][0][name])


def test_activation_checkpointing_recomputes_with_the_same_weights(run):
    world, results, _ = run
    _only_world_2(world)
    for rank in range(world):
        res, plain = results[rank]["activation_checkpointing"], results[rank]["w8g8"]
        for step in range(STEPS):
            for name, weight in res["backward"][step].items():
                assert torch.equal(res["forward"][step][name], weight), (rank, step, name)
        # The recomputation reads the same seeds and weights: the run equals the one without checkpointing.
        assert res["losses"] == plain["losses"]
        params = {n.replace("_checkpoint_wrapped_module.", ""): p for n, p in res["params"].items()}
        assert params.keys() == plain["params"].keys()
        for name, value in plain["params"].items():
            assert torch.equal(params[name], value), name


def test_non_finite_gradients_stay_non_finite(run):
    world, results, _ = run
    _only_world_2(world)
    x, y = global_batch(world, 0)
    x[BATCH, 0] = float("inf")  # rank 1's first sample, as poisoned on the rank side
    model = MLP()
    nn.functional.mse_loss(model(x), y).backward()
    for rank in range(world):
        for name, p in model.named_parameters():
            ours = results[rank]["nonfinite_grads"]["grads0"][name]
            assert not torch.isfinite(ours[~torch.isfinite(p.grad)]).any(), name
            assert not torch.isfinite(ours).all(), name


def test_non_finite_weight_is_a_clear_error_on_every_rank(run):
    world, results, _ = run
    _only_world_2(world)
    for rank in range(world):
        message = results[rank]["nonfinite_weight"]
        assert "non-finite weights" in message and "'l2'" in message, message


@pytest.mark.parametrize("scenario", ["checkpoint", "checkpoint_difference"], ids=["w8g8", "difference"])
def test_resume_from_checkpoint_gives_the_same_losses(run, scenario):
    world, results, _ = run
    _only_world_2(world)
    for rank in range(world):
        ckpt = results[rank][scenario]
        assert ckpt["resumed"]["losses"] == ckpt["continued"]["losses"]
        for name, value in ckpt["continued"]["params"].items():
            assert torch.equal(ckpt["resumed"]["params"][name], value), name


def test_weight_differences_train_with_identical_weights_and_free_regathers(run):
    world, results, _ = run
    _only_world_2(world)
    ref_params, ref_losses = reference_training(world, STEPS)
    res = results[0]["difference"]
    for step in range(STEPS):
        for name, weight in res["backward"][step].items():  # served from the reference
            assert torch.equal(res["forward"][step][name], weight), (step, name)
        for name, weight in res["forward"][step].items():
            assert torch.equal(results[1]["difference"]["forward"][step][name], weight), (step, name)
    for name, ref in ref_params.items():
        assert _rel(res["params"][name], ref) < 1e-2, name
    assert max(abs(a - b) for a, b in zip(res["losses"], ref_losses)) < 1e-2
    traffic = res["traffic"].weights
    # One keyframe (fp32) and STEPS - 1 updates (4-bit codes) per unit; the backward re-gathers send nothing.
    codec = build_scheme("weights", QWD.weights, 4).codec
    shards = [(IN * HID + HID), (HID * ODD + ODD), (ODD * OUT + OUT)]  # unsharded elements per unit
    if results[0]["adapter"] == "fsdp1":  # one flat parameter per unit, padded to a multiple of the world size
        per_rank = [-(-numel // world) for numel in shards]
    else:  # FSDP2 pads each parameter to ceil(rows / W) rows per rank
        per_rank = [-(-rows // world) * (numel // rows) for rows, numel in zip((HID, ODD, OUT), shards)]
    expected = sum((world - 1) * (4 * n + (STEPS - 1) * codec.wire_bytes(n)) for n in per_rank)
    assert traffic.calls == 2 * 3 * STEPS and traffic.sent == expected
    # The backward re-gathers issue no collective: outside the baselines, which count the forward gathers only.
    assert traffic.served_locally == 3 * STEPS and traffic.native == sum((world - 1) * 4 * n * STEPS for n in per_rank)
    assert traffic.served_native == traffic.native  # each re-gather would have cost plain FSDP its forward's bytes
    assert res["memory"] == 4 * world * sum(per_rank)  # one fp32 replica per rank
    # The layout maps the reference back to the parameters: the last forward's weights, per parameter.
    assert torch.equal(res["split"]["weight"], res["forward"][-1]["l2"])
    assert torch.equal(res["split"]["bias"], res["forward"][-1]["l2.bias"])


def test_an_edit_outside_the_optimizer_is_a_keyframe(run):
    world, results, _ = run
    _only_world_2(world)
    for rank in range(world):
        edit = results[rank]["difference"]["after_edit"]
        assert torch.equal(edit["gathered"], edit["expected"])  # full precision: exactly the edited weights
        assert edit["keyframes"] == [0, 1, 0]  # units l1, l2, l3: only the edited l2 re-keyframes


def test_checkpoint_holds_full_precision_weights(run, tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    world, results, ckpt_dir = run
    _only_world_2(world)
    dcp_to_torch_save(ckpt_dir, os.fspath(tmp_path / "full.pt"))
    saved = torch.load(tmp_path / "full.pt", weights_only=False)["model"]
    ckpt = results[0]["checkpoint"]
    for name, value in ckpt["saved_params"].items():
        assert torch.equal(saved[name], value), name  # the master weights, bit for bit...
    for name in ("l1", "l2", "l3"):  # ...not the quantized copies the next forward computed with
        assert not torch.equal(saved[f"{name}.weight"], ckpt["continued"]["forward"][0][name])

