"""The automatic policy on 2 spawned gloo ranks training the FSDP2 MLP of tests/sharded_mlp.py against the exact
single-process reference: with injected timings it decides at the end of the warm-up, every unit gets the decided
schemes at that optimizer-step boundary (exact training before, quantized after, identical weights on every
rank), a re-check re-decides once; with real measurements (probe and forward timer) the ranks agree. The default
candidates are w8g8's sides; the opt-in 3-bit ones (qwd3, g3loco) install LoCo schemes with a residual per unit, and
the opt-in 4-bit ones (qwd4, g4) are chosen only when the options name them; the probe times the stateful LoCo scheme
at every size."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from dist_spawn import RankInfo, run_ranks
from sharded_mlp import HID, IN, LAYERS, LR, ODD, OUT, Adapter, Capture, batch, full_tensors, reference_training

from composer_qsdp.config import from_preset
from composer_qsdp.auto import AutoOptions, AutoPolicy, LinkFit, UnitProfile, decide
from composer_qsdp.auto.choice import G3LOCO, GRAD_CANDIDATES, QWD3, WEIGHT_CANDIDATES, candidates
from composer_qsdp.auto.runtime import probe_network, probe_sizes

pytestmark = pytest.mark.requires_custom_comm

STEPS, WARMUP = 6, 2
FORWARD_S = 2e-3  # injected forward time of every unit per microbatch
OFF = from_preset("w8g8", weight_bits=None, grad_bits=None, error_sample_interval=0)
UNIT_NUMEL = {"l1": 32 * 128 + 128, "l2": 128 * 67 + 67, "l3": 67 * 16 + 16}


def links(gbs: float) -> dict[str, LinkFit]:
    """Every candidate of the registry (the opt-in ones too) at ``gbs`` GB/s of wire bytes and 50 us per call."""
    return {c.key: LinkFit(50e-6, gbs * 1e9) for side in ("weights", "grads") for c in candidates(side)}


# 5 MB/s: communication dominates, so the fewest bytes offered win; 1 TB/s: it never pays
SLOW, FAST = links(0.005), links(1000.0)
#: The options naming the opt-in 3-bit candidates (the bench_e2e configuration qsdp-auto-3bit's lists).
THREE_BIT_OPTIONS = {"weight_candidates": ["off", "w8", "qwd3"], "grad_candidates": ["off", "g8", "g3loco"]}
#: The options naming the opt-in 4-bit candidates instead (the bench_e2e configuration qsdp-auto-4bit's lists).
FOUR_BIT_OPTIONS = {"weight_candidates": ["off", "w8", "qwd4"], "grad_candidates": ["off", "g8", "g4"]}
#: The schemes each candidate installs, as ``_scheme`` reports them.
SCHEMES = {"w8": ("direct", 8), "qwd4": ("difference", 4), "qwd3": ("difference", 3), "g8": ("flat", 8),
           "g4": ("flat", 4), "g3loco": ("loco", 3)}


def _scheme(side) -> tuple[str, int | None]:
    return side.name, None if side.codec is None else side.codec.bits


def _residual(grads) -> tuple[int, int] | None:
    """A LoCo scheme's residual as ``(its id, its elements)``; ``None`` for other schemes."""
    residual = getattr(grads, "residual", None)
    return None if residual is None else (id(residual), residual.rows * residual.numel)


def _run(info: RankInfo, tolerance: float, networks: list[dict] | None, inject: bool,
         adapter: Adapter = Adapter("fsdp2"), options: dict | None = None) -> dict:
    model = adapter.shard(info)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    handle = adapter.apply(model, OFF, optimizers=opt)
    calls = iter(networks or [])
    policy = AutoPolicy(handle, AutoOptions(warmup_steps=WARMUP, recheck_tolerance=tolerance, **(options or {})),
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
    out["candidates"] = {side: [c.name for c in cands] for side, cands in policy.candidates.items()}
    out["residuals"] = [_residual(u.grads) for u in handle.units]
    out["profiles"] = [(u.name, u.numel, u.forward_s, u.regathers) for u in policy.records[0].units]
    out["microbatches"] = policy.records[0].microbatches
    out["phase"] = policy.phase
    return out


def _worker(info: RankInfo) -> dict:
    return {
        "decide": _run(info, 1e9, [SLOW], inject=True),
        "decide-fsdp1": _run(info, 1e9, [SLOW], inject=True, adapter=Adapter("fsdp1")),
        "recheck": _run(info, 1e-9, [SLOW, FAST], inject=True, options=THREE_BIT_OPTIONS),  # LoCo, then off
        "measured": _run(info, 1e9, None, inject=False),
        "three-bit": _run(info, 1e9, [SLOW], inject=True, options=THREE_BIT_OPTIONS),
        "four-bit": _run(info, 1e9, [SLOW], inject=True, options=FOUR_BIT_OPTIONS),
        "probe": _probe_loco(info),
    }


def _probe_loco(info: RankInfo) -> dict:
    """The real probe of the opt-in candidates at three sizes (the LoCo scheme keeps a residual of one size)."""
    sizes = probe_sizes(list(UNIT_NUMEL.values()), info.world_size)
    fits, samples = probe_network(torch.distributed.group.WORLD,
                                  [QWD3, G3LOCO], sizes,
                                  weight_dtype=torch.float32, grad_dtype=torch.float32, device=torch.device("cpu"),
                                  repeats=2)
    return {"sizes": sizes, "fits": fits, "samples": samples}


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return run_ranks(_worker, 2)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def _expected_decision(weights=WEIGHT_CANDIDATES, grads=GRAD_CANDIDATES):
    """What the decision must be for the injected inputs: FSDP2 re-gathers every (non-root) unit, one microbatch,
    fp32 on both sides of the 2-rank group."""
    units = [UnitProfile(n, UNIT_NUMEL[n], FORWARD_S, 2 * FORWARD_S, True) for n in LAYERS]
    return decide(units, SLOW, world_size=2, weight_element_size=4, grad_element_size=4, weight_candidates=weights,
                  grad_candidates=grads)


ADAPTERS = pytest.mark.parametrize("key", ["decide", "decide-fsdp1"], ids=["fsdp2", "fsdp1"])


@ADAPTERS
def test_decides_at_the_step_boundary_and_trains_exactly_before(results, key):
    expected = _expected_decision()
    assert expected.weights == ("w8",) * 3 and expected.grads == ("g8",) * 3  # a slow network, the defaults
    for res in results:
        run = res[key]
        assert run["candidates"] == {"weights": ["off", "w8"], "grads": ["off", "g8"]}
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
        for step in range(WARMUP - 1, STEPS):
            assert [(s[1], s[2]) for s in run["schemes"][step]] == [
                (SCHEMES[w], SCHEMES[g]) for w, g in zip(expected.weights, expected.grads)]
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
            if SCHEMES[expected.weights[i]][0] == "difference" and step == WARMUP:
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
        assert run["schemes"][rechecked_at - 1][0][2] == ("loco", 3)
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


def test_the_opt_in_3_bit_candidates_install_a_loco_residual_per_unit(results):
    expected = _expected_decision(candidates("weights", THREE_BIT_OPTIONS["weight_candidates"]),
                                  candidates("grads", THREE_BIT_OPTIONS["grad_candidates"]))
    assert expected.weights == ("qwd3",) * 3 and expected.grads == ("g3loco",) * 3
    assert results[0]["decide"]["residuals"] == [None] * 3  # the defaults keep no residual
    for res in results:
        run = res["three-bit"]
        assert run["candidates"] == {"weights": THREE_BIT_OPTIONS["weight_candidates"],
                                     "grads": THREE_BIT_OPTIONS["grad_candidates"]}
        assert run["events"][WARMUP - 1][:3] == ("decided", expected.weights, expected.grads)
        # Real LoCo schemes: each unit its own residual of the unit's whole gradient as FSDP2 reduce-scatters it
        # (each parameter's dim 0 padded to a multiple of the 2 ranks).
        residuals = run["residuals"]
        assert len({r[0] for r in residuals}) == 3
        assert [r[1] for r in residuals] == [(HID * IN + HID), (ODD + 1) * HID + ODD + 1, OUT * ODD + OUT]
        assert run["losses"][-1] < run["losses"][0]


def test_opt_in_4_bit_candidates_are_chosen_only_when_named(results):
    # The defaults never offer them (above); named, they win on this network.
    decided = results[0]["decide"]["events"][WARMUP - 1]
    assert not {*decided[1], *decided[2]} & {"qwd4", "g4"}
    expected = _expected_decision(candidates("weights", FOUR_BIT_OPTIONS["weight_candidates"]),
                                  candidates("grads", FOUR_BIT_OPTIONS["grad_candidates"]))
    assert set(expected.grads) == {"g4"} and set(expected.weights) <= {"w8", "qwd4"}
    for res in results:
        run = res["four-bit"]
        assert run["candidates"] == {"weights": FOUR_BIT_OPTIONS["weight_candidates"],
                                     "grads": FOUR_BIT_OPTIONS["grad_candidates"]}
        assert run["events"][WARMUP - 1][:3] == ("decided", expected.weights, expected.grads)
        for step in range(WARMUP - 1, STEPS):
            assert [(s[1], s[2]) for s in run["schemes"][step]] == [
                (SCHEMES[w], SCHEMES[g]) for w, g in zip(expected.weights, expected.grads)]
        assert run["residuals"] == [None] * 3
        assert run["losses"][-1] < run["losses"][0]
    for step in range(WARMUP, STEPS):  # every rank computes with the same quantized weights
        for name in LAYERS:
            assert torch.equal(results[0]["four-bit"]["forward"][step][name],
                               results[1]["four-bit"]["forward"][step][name])


def test_the_probe_times_loco_at_every_size(results):
    for res in results:
        probe = res["probe"]
        assert len(probe["sizes"]) == 3
        assert sorted(probe["fits"]) == ["grads:g3loco", "weights:qwd3"]
        for key, rows in probe["samples"].items():
            wire = [b for b, _ in rows]
            assert len(rows) == 3 and wire == sorted(wire) and wire[0] < wire[-1], key
            assert isinstance(probe["fits"][key], LinkFit)
    assert results[0]["probe"] == results[1]["probe"]  # the maxima over ranks: every rank fits the same lines
