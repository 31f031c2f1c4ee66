"""The automatic policy on 2 spawned gloo ranks training the FSDP2 MLP of tests/sharded_mlp.py against the exact
single-process reference: with injected timings it decides at the end of the warm-up, every unit gets the decided
schemes at that optimizer-step boundary (exact training before, quantized after, identical weights on every
rank), a re-check re-decides once; with real measurements (probe and forward timer) the ranks agree."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from dist_spawn import RankInfo, run_ranks
from sharded_mlp import LAYERS, LR, Adapter, Capture, batch, full_tensors, reference_training

from composer_qsdp.config import from_preset
from composer_qsdp.auto import AutoOptions, AutoPolicy, LinkFit, UnitProfile, decide
from composer_qsdp.auto.choice import GRAD_CANDIDATES, WEIGHT_CANDIDATES

pytestmark = pytest.mark.requires_custom_comm

STEPS, WARMUP = 6, 2
FORWARD_S = 2e-3  # injected forward time of every unit per microbatch
OFF = from_preset("w8g8", weight_bits=None, grad_bits=None, error_sample_interval=0)
UNIT_NUMEL = {"l1": 32 * 128 + 128, "l2": 128 * 67 + 67, "l3": 67 * 16 + 16}


def links(gbs: float) -> dict[str, LinkFit]:
    """Every candidate at ``gbs`` GB/s of wire bytes and 50 us per call."""
    return {c.key: LinkFit(50e-6, gbs * 1e9) for c in (*WEIGHT_CANDIDATES, *GRAD_CANDIDATES)}


SLOW, FAST = links(0.005), links(1000.0)  # 5 MB/s: communication dominates; 1 TB/s: it never pays


def _scheme(side) -> tuple[str, int | None]:
    return side.name, None if side.codec is None else side.codec.bits


def _run(info: RankInfo, tolerance: float, networks: list[dict] | None, inject: bool,
         adapter: Adapter = Adapter("fsdp2")) -> dict:
    model = adapter.shard(info)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    handle = adapter.apply(model, OFF, optimizers=opt)
    calls = iter(networks or [])
    policy = AutoPolicy(handle, AutoOptions(warmup_steps=WARMUP, recheck_tolerance=tolerance),
                        network=(lambda _: next(calls)) if networks else None,
                        forward_times=(lambda p: [FORWARD_S] * len(p.handle.units)) if inject else None)
    capture = Capture(model)
    out: dict = {"forward": [], "master": [], "schemes": [], "events": [], "losses": []}
    for step in range(STEPS):
        out["master"].append(full_tensors(model))  # the weights this step's forward should see, unquantized
        x, y = batch(info.rank, step)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        out["forward"].append({k: v.clone() for k, v in capture.forward.items()})
        opt.step()
        opt.zero_grad()
        record = policy.on_step_end()  # the step boundary
        out["events"].append(None if record is None else (record.event, record.decision.weights,
                                                          record.decision.grads, sorted(record.network)))
        out["schemes"].append([(u.name, _scheme(u.weights), _scheme(u.grads)) for u in handle.units])
        total = loss.detach().clone()
        torch.distributed.all_reduce(total)
        out["losses"].append(total.item() / info.world_size)
    out["params"] = full_tensors(model)
    out["profiles"] = [(u.name, u.numel, u.forward_s, u.regathers) for u in policy.records[0].units]
    out["microbatches"] = policy.records[0].microbatches
    out["phase"] = policy.phase
    return out


def _worker(info: RankInfo) -> dict:
    return {
        "decide": _run(info, 1e9, [SLOW], inject=True),
        "decide-fsdp1": _run(info, 1e9, [SLOW], inject=True, adapter=Adapter("fsdp1")),
        "recheck": _run(info, 1e-9, [SLOW, FAST], inject=True),
        "measured": _run(info, 1e9, None, inject=False),
    }


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return run_ranks(_worker, 2)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def _expected_decision():
    """What the decision must be for the injected inputs: FSDP2 re-gathers every (non-root) unit, one microbatch,
    fp32 on both sides of the 2-rank group."""
    units = [UnitProfile(n, UNIT_NUMEL[n], FORWARD_S, 2 * FORWARD_S, True) for n in LAYERS]
    return decide(units, SLOW, world_size=2, weight_element_size=4, grad_element_size=4)


ADAPTERS = pytest.mark.parametrize("key", ["decide", "decide-fsdp1"], ids=["fsdp2", "fsdp1"])


@ADAPTERS
def test_decides_at_the_step_boundary_and_trains_exactly_before(results, key):
    expected = _expected_decision()
    assert set(expected.grads) == {"g4"} and set(expected.weights) <= {"w8", "qwd4"}  # a slow network
    for res in results:
        run = res[key]
        # FSDP1 names its units by its wrappers' paths: compare sizes, timings and re-gathers in unit order.
        assert [p[1:] for p in run["profiles"]] == [(UNIT_NUMEL[n], FORWARD_S, True) for n in LAYERS]
        assert run["microbatches"] == 1
        events = [e for e in run["events"] if e is not None]
        assert [e[0] for e in events] == ["decided", "confirmed"] and run["phase"] == "done"
        assert run["events"][WARMUP - 1][1:3] == (expected.weights, expected.grads)
        # Unquantized through the warm-up: each forward computed with the exact master weights ...
        for step in range(WARMUP):
            for name in LAYERS:
                assert torch.equal(run["forward"][step][name], run["master"][step][f"{name}.weight"])
        for step in range(WARMUP - 1):  # schemes after each step's boundary: unquantized until the decision's
            assert all(s[1] == ("direct", None) and s[2] == ("flat", None) for s in run["schemes"][step])
        # ... and the reconfigured schemes from the decision step's boundary on.
        want = {"w8": ("direct", 8), "qwd4": ("difference", 4), "g4": ("flat", 4)}
        for step in range(WARMUP - 1, STEPS):
            assert [(s[1], s[2]) for s in run["schemes"][step]] == [
                (want[w], want[g]) for w, g in zip(expected.weights, expected.grads)]
    # Exact plain data parallelism through the warm-up.
    assert results[0][key]["events"] == results[1][key]["events"]
    ref, _ = reference_training(2, WARMUP)
    for name, value in ref.items():
        assert torch.allclose(results[0][key]["master"][WARMUP][name], value, atol=1e-6), name


@ADAPTERS
def test_after_the_decision_every_rank_computes_with_the_same_quantized_weights(results, key):
    expected = _expected_decision()
    run0, run1 = results[0][key], results[1][key]
    for step in range(WARMUP, STEPS):
        for i, name in enumerate(LAYERS):
            assert torch.equal(run0["forward"][step][name], run1["forward"][step][name]), (step, name)
            exact = run0["master"][step][f"{name}.weight"]
            got = run0["forward"][step][name]
            if expected.weights[i] == "qwd4" and step == WARMUP:
                assert torch.equal(got, exact)  # a new difference scheme starts with a full-precision keyframe
            else:
                assert 0 < _rel(got, exact) < 0.05, (step, name)
    ref, ref_losses = reference_training(2, STEPS)
    for name, value in ref.items():
        assert _rel(run0["params"][name], value) < 2e-2, name
    assert run0["losses"][-1] < run0["losses"][0]


def test_a_missed_prediction_re_decides_once(results):
    for res in results:
        run = res["recheck"]
        events = [e for e in run["events"] if e is not None]
        assert [e[0] for e in events] == ["decided", "rechecked"] and run["phase"] == "done"
        decided_at = WARMUP - 1
        rechecked_at = decided_at + WARMUP
        assert run["events"][rechecked_at][1:3] == (("off",) * 3, ("off",) * 3)  # the new network: 1 TB/s
        assert run["schemes"][rechecked_at - 1][0][2] == ("flat", 4)
        for step in range(rechecked_at + 1, STEPS):  # unquantized again from the re-check's boundary on
            assert all(s[1] == ("direct", None) and s[2] == ("flat", None) for s in run["schemes"][step])
            for name in LAYERS:
                assert torch.equal(run["forward"][step][name], run["master"][step][f"{name}.weight"])
    assert results[0]["recheck"]["events"] == results[1]["recheck"]["events"]


def test_real_measurements_agree_across_ranks(results):
    run0, run1 = results[0]["measured"], results[1]["measured"]
    assert run0["events"] == run1["events"] and run0["profiles"] == run1["profiles"]
    decided = run0["events"][WARMUP - 1]
    assert decided[0] == "decided"
    assert decided[3] == sorted(c.key for c in (*WEIGHT_CANDIDATES, *GRAD_CANDIDATES))  # every candidate probed
    assert all(f > 0 for _, _, f, _ in run0["profiles"]) and all(r for *_, r in run0["profiles"])
    assert run0["schemes"] == run1["schemes"]
