"""What QSDP adds to an FSDP2 training step, op by op: nothing for a unit it leaves unquantized.

Two spawned gloo ranks train the MLP of tests/sharded_mlp.py one warm-up step, then one profiled step (forward,
backward, optimizer step), with plain FSDP2 and with QSDP in four settings that leave units or sides unquantized:
both sides off on every unit, weights off on every unit (gradients quantized), gradients off on every unit (weights
quantized; also with mixed precision), and ``policy=auto``'s choice of quantizing l1 and l3 while leaving l2 off.
The profiler's CPU events give the ops each unit's all-gather, copy-out and reduce-scatter ran (FSDP2's
``record_function`` ranges, named by unit); a side QSDP leaves unquantized must run exactly plain FSDP2's ops, and a
setting where nothing is quantized must run exactly plain FSDP2's step.

Host syncs: no step may issue more of the ops that make a CUDA host wait for the device (a tensor's value read on
the host, ``nonzero``'s output size) than plain FSDP2's step; inside any unit's collectives, quantized ones included, there may be none beyond plain FSDP2's. The
exception is the non-finite weight check's one read per forward of a setting that quantizes weights: on a CPU device
it reads its flags directly (nothing to wait for), on CUDA through an asynchronous copy that it never waits on
(tests/engine/test_finite_check.py).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn as nn
from dist_spawn import RankInfo, run_ranks
from sharded_mlp import LAYERS, LR, Adapter, batch

from composer_qsdp.auto import AutoOptions, AutoPolicy
from composer_qsdp.config import from_preset

pytestmark = pytest.mark.requires_custom_comm

OFF = from_preset("w8g8", weight_bits=None, grad_bits=None, bucket_size=64, seed=7)
GRADS_ONLY = from_preset("w8g8", weight_bits=None, bucket_size=64, seed=7)
WEIGHTS_ONLY = from_preset("w8g8", grad_bits=None, bucket_size=64, seed=7)
#: policy=auto's decision in the scenario: (weight candidate, gradient candidate) per unit of LAYERS.
AUTO_CHOICE = (("w8", "g8"), ("off", "off"), ("w8", "g8"))
#: FSDP2's per-unit ranges that hold its collectives (``"<label> (<unit>)"``).
RANGES = ("FSDP::all_gather", "FSDP::all_gather_copy_out", "FSDP::post_backward_reduce")
#: Ops after which a CUDA host waits for the device: a value read on the host (``item``, ``bool(t)``,
#: ``torch.equal``) or an output sized by the data. (A copy from host memory, which synchronizes too, looks on a CPU
#: device like any other copy.)
SYNC_OPS = frozenset({"aten::_local_scalar_dense", "aten::item", "aten::is_nonzero", "aten::nonzero", "aten::equal"})


# ---------------------------------------------------------------------------------------------- rank side
def _profiled_step(info: RankInfo, model: nn.Module) -> dict:
    """One warm-up step, then the op names of one profiled step: per FSDP2 range of each unit (in the order they
    ran) and over the whole step."""
    from torch.profiler import ProfilerActivity, profile

    opt = torch.optim.SGD(model.parameters(), lr=LR)

    def step(index: int) -> None:
        x, y = (t.to(info.device) for t in batch(info.rank, index))
        nn.functional.mse_loss(model(x).float(), y).backward()  # .float(): bf16 outputs under mixed precision
        opt.step()
        opt.zero_grad()

    step(0)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step(1)
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    ranges: dict[str, list[list[str]]] = {}
    for outer in events:
        label, _, unit = outer.name.partition(" (")
        if label not in RANGES:
            continue
        inside = [e.name for e in events if e.thread == outer.thread and e is not outer
                  and outer.time_range.start <= e.time_range.start and e.time_range.end <= outer.time_range.end]
        ranges.setdefault(f"{label} ({unit}", []).append(inside)
    return {"ranges": ranges, "step": [e.name for e in events]}


def _worker(info: RankInfo) -> dict:
    adapter = Adapter("fsdp2")
    out = {"plain": _profiled_step(info, adapter.shard(info))}
    for name, config in (("off", OFF), ("grads_only", GRADS_ONLY), ("weights_only", WEIGHTS_ONLY)):
        model = adapter.shard(info)
        adapter.apply(model, config)
        out[name] = _profiled_step(info, model)
    # the recipes' precision (bf16 gathers, fp32 reductions), where the gradient side's casts live
    out["plain_mp"] = _profiled_step(info, adapter.shard(info, mixed_precision=True))
    model = adapter.shard(info, mixed_precision=True)
    adapter.apply(model, WEIGHTS_ONLY)
    out["weights_only_mp"] = _profiled_step(info, model)
    model = adapter.shard(info)
    policy = AutoPolicy(adapter.apply(model, OFF), AutoOptions())
    policy.apply(*zip(*AUTO_CHOICE))
    policy.remove()  # decided: it measures no more, as after its re-check
    out["auto"] = _profiled_step(info, model)
    return out


# ---------------------------------------------------------------------------------------------- tests
@pytest.fixture(scope="module")
def results() -> list[dict]:
    return run_ranks(_worker, 2)


def _unit_ranges(profiled: dict, unit: str, labels: tuple[str, ...] = RANGES) -> dict[str, list[list[str]]]:
    return {key: ops for key, ops in profiled["ranges"].items() if key.endswith(f"({unit})") and
            key.partition(" (")[0] in labels}


def _syncs(ops: list[str]) -> Counter:
    return Counter(op for op in ops if op in SYNC_OPS)


@pytest.mark.parametrize("setting", ["off", "grads_only", "weights_only", "auto"])
def test_every_unit_communicates_in_plain_fsdp2_ranges(results, setting):
    """The comparisons below are not vacuous: every unit's three ranges ran, with its collectives (a quantized
    reduce-scatter is an all-to-all)."""
    for rank in results:
        for unit in LAYERS:
            for profiled in (rank["plain"], rank[setting]):
                ranges = _unit_ranges(profiled, unit)
                assert {key.partition(" (")[0] for key in ranges} == set(RANGES), (unit, sorted(ranges))
                for label, collective in (("FSDP::all_gather", "c10d::_allgather_base_"),
                                          ("FSDP::post_backward_reduce", "c10d::")):
                    ops = [op for call in ranges[f"{label} ({unit})"] for op in call]
                    assert any(op.startswith(collective) for op in ops), (label, unit, ops)


def test_qsdp_with_nothing_quantized_runs_plain_fsdp2s_step_op_for_op(results):
    for rank in results:
        assert rank["off"]["step"] == rank["plain"]["step"]


def test_sides_left_unquantized_run_plain_fsdp2s_ops(results):
    """Weights off on every unit (gradients quantized), and the unit policy=auto left off: their collectives issue
    exactly plain FSDP2's ops (no extra copy, cast, allocation, reduction or sync)."""
    gathers = ("FSDP::all_gather", "FSDP::all_gather_copy_out")
    for rank in results:
        for unit in LAYERS:
            assert _unit_ranges(rank["grads_only"], unit, gathers) == _unit_ranges(rank["plain"], unit, gathers), unit
        assert _unit_ranges(rank["auto"], "l2") == _unit_ranges(rank["plain"], "l2")


@pytest.mark.parametrize("precision", ["", "_mp"])
def test_gradients_left_unquantized_reduce_as_plain_fsdp2(results, precision):
    """Weights quantized, gradients off (the ablation arm ``w8-only``): every unit's gradient reduction runs exactly
    plain FSDP2's ops, in fp32 and with the recipes' mixed precision (bf16 gathers, fp32 reductions)."""
    reduce = ("FSDP::post_backward_reduce",)
    for rank in results:
        for unit in LAYERS:
            ours, plain = (_unit_ranges(rank[f"{name}{precision}"], unit, reduce) for name in ("weights_only", "plain"))
            assert ours == plain, (unit, ours, plain)


@pytest.mark.parametrize("setting", ["off", "grads_only", "weights_only", "auto"])
def test_no_collective_syncs_the_host_beyond_plain_fsdp2(results, setting):
    for rank in results:
        for unit in LAYERS:
            for key, calls in _unit_ranges(rank[setting], unit).items():
                plain = _unit_ranges(rank["plain"], unit)[key]
                assert [_syncs(ops) for ops in calls] == [_syncs(ops) for ops in plain], key


@pytest.mark.parametrize("setting", ["off", "grads_only"])
def test_a_step_without_quantized_weights_syncs_the_host_as_plain_fsdp2(results, setting):
    for rank in results:
        assert _syncs(rank[setting]["step"]) == _syncs(rank["plain"]["step"])
