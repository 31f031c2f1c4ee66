"""The automatic policy's pure parts (composer_qsdp.auto.choice) with injected timings: the step model against
hand-computed schedules, the decision against a brute-force search over every choice, the accuracy rule over random
inputs, rank agreement of max-reduced measurements, the probe's line fit against a synthetic latency + bandwidth
law, and the options' errors."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
import torch.nn as nn

from composer_qsdp import QSDP, QSDPConfig
from composer_qsdp.auto import AutoOptions
from composer_qsdp.config import SideConfig, from_preset
from composer_qsdp.auto.choice import (G3LOCO, GRAD_CANDIDATES, QWD3, WEIGHT_CANDIDATES, Candidate, LinkFit,
                                       UnitProfile, accuracy_violation, candidates, decide, fit_link, pack_profiles,
                                       predict_step, schedule_step, unpack_profiles)
from composer_qsdp.auto.runtime import AutoRecord, probe_sizes

GB = 1e9
W = {c.name: c for c in candidates("weights")}  # every registered candidate, the opt-in ones too
G = {c.name: c for c in candidates("grads")}
THREE_BIT = {"weight_candidates": candidates("weights", ("off", "w8", "qwd3")),  # the opt-in 3-bit candidates
             "grad_candidates": candidates("grads", ("off", "g8", "g3loco"))}
FOUR_BIT = {"weight_candidates": candidates("weights", ("off", "w8", "qwd4")),  # the opt-in 4-bit candidates
            "grad_candidates": candidates("grads", ("off", "g8", "g4"))}
# Candidates the accuracy rule must refuse, each faster on the wire than the allowed ones.
W4_DIRECT = Candidate("w4", "weights", SideConfig(bits=4))
QWD2 = Candidate("qwd2", "weights", SideConfig(bits=2, codec="symmetric", scheme="difference"))
G4_NEAREST = Candidate("g4n", "grads", SideConfig(bits=4, rounding="nearest"))
G2 = Candidate("g2", "grads", SideConfig(bits=2))
G3_NEAREST = Candidate("g3n", "grads", SideConfig(bits=3, rounding="nearest", bucket_size=256,
                                                 codec_options={"hadamard": True}))
G2_LOCO = Candidate("g2loco", "grads", from_preset("qwd-w4g2-loco").grads)  # 2-bit LoCo: +1.8-2.4% loss
FORBIDDEN = {"weights": (W4_DIRECT, QWD2), "grads": (G4_NEAREST, G2, G3_NEAREST, G2_LOCO)}


def network(off_gbs: float, quantized_gbs: float, off_latency: float = 20e-6, quantized_latency: float = 60e-6,
            extra: tuple[Candidate, ...] = ()) -> dict[str, LinkFit]:
    """Unquantized collectives at ``off_gbs``; quantized ones (codec kernels included) at ``quantized_gbs`` of
    wire bytes, with a larger fixed cost per call; every registered candidate and ``extra``."""
    out = {}
    for c in (*W.values(), *G.values(), *extra):
        out[c.key] = LinkFit(off_latency, off_gbs * GB) if c.config is None else LinkFit(quantized_latency,
                                                                                          quantized_gbs * GB)
    return out


def gpt_like(blocks: int = 4, block_numel: int = 12_600_000, forward_s: float = 4e-3) -> list[UnitProfile]:
    """A root (embeddings: large, little compute; kept gathered through backward) and equal blocks."""
    root = UnitProfile("", 40_000_000, forward_s / 2, forward_s, regathers=False)
    return [root, *[UnitProfile(f"blocks.{i}", block_numel, forward_s, 2 * forward_s) for i in range(blocks)]]


def root_schedule(n: int) -> dict:
    """FSDP2's order with the model as root unit 0: its head first in backward, its reduction last."""
    return {"backward_order": [0, *range(n - 1, 0, -1)], "reduce_at_end": (0,)}


ROOT_SCHEDULE = root_schedule(4)  # gpt_like(blocks=3)


def brute_force(units, net, weights, grads, **kwargs) -> float:
    """The lowest predicted step over every per-unit choice (the decision's search, done exhaustively)."""
    best = float("inf")
    for ws in itertools.product(weights, repeat=len(units)):
        for gs in itertools.product(grads, repeat=len(units)):
            best = min(best, predict_step(units, net, ws, gs, **kwargs))
    return best


# ---------------------------------------------------------------------------------------------- step model
def test_schedule_against_hand_computed_timelines():
    # Forward: gather0 0-3, unit 0 3-4; gather1 issued at 3, done 3.5; unit 1 4-5. Backward (1, 0): regather1 5-5.5,
    # unit 1 5.5-7.5 (regather0 issued 5.5, done 8.5); reduce1 at 8.5-9.5; unit 0 8.5-10.5; reduce0 10.5-11.5.
    args = ([1, 1], [2, 2], [3, 0.5], [0.5, 3], [1, 1])
    assert schedule_step([1, 1], [2, 2], [3, 0.5], [3, 0.5], [1, 1]) == pytest.approx(11.5)
    # No communication: compute only.
    assert schedule_step([1, 2], [2, 4], [0, 0], [0, 0], [0, 0]) == pytest.approx(9)
    # Backward order (0, 1) and unit 0 reducing at the end: regather0 5-5.5; unit 0 5.5-7.5 (regather1 issued 5.5,
    # 5.5-8.5); unit 1 8.5-10.5; reduce1 10.5-11.5; then reduce0 11.5-12.5.
    assert schedule_step(*args, backward_order=[0, 1], reduce_at_end=(0,)) == pytest.approx(12.5)


def test_qwd_gathers_once_per_step():
    units = [UnitProfile("a", 1_000_000, 0.0, 0.0), UnitProfile("b", 1_000_000, 0.0, 0.0)]
    net = network(1.0, 1.0, 0.0, 0.0)
    gather = net["weights:qwd4"].seconds(W["qwd4"].wire_bytes(1_000_000, 2, 2))
    for micro in (1, 4):  # no compute: the step is the queue; two units, one gather each per step
        step = predict_step(units, net, [W["qwd4"]] * 2, [G["off"]] * 2, world_size=2, microbatches=micro,
                            grad_element_size=4)
        reduce = net["grads:off"].seconds(G["off"].wire_bytes(1_000_000, 2, 4))
        assert step == pytest.approx(2 * gather + micro * 2 * reduce)


# ---------------------------------------------------------------------------------------------- decisions
def test_fast_network_turns_quantization_off():
    # NVLink-like: 150 GB/s rings; quantized calls pay codec kernels and launches (effective 60 GB/s, 150 us).
    units = gpt_like(blocks=3)
    net = network(150.0, 60.0, 20e-6, 150e-6)
    d = decide(units, net, world_size=2, **ROOT_SCHEDULE)
    assert set(d.weights) == {"off"} and set(d.grads) == {"off"}
    assert d.step_s == d.plain_step_s and d.speedup >= 1.0
    allowed = {s: [c for c in cs if accuracy_violation(c) is None] for s, cs in
               (("w", WEIGHT_CANDIDATES), ("g", GRAD_CANDIDATES))}
    # No per-unit choice at all gains the 2% (min_gain) that quantizing must pay for here.
    optimum = brute_force(units, net, allowed["w"], allowed["g"], world_size=2, **ROOT_SCHEDULE)
    assert optimum > 0.98 * d.plain_step_s


@pytest.mark.parametrize("offered,grads,weights", [
    ({}, {"g8"}, {"w8"}),  # the defaults: w8g8's sides
    (THREE_BIT, {"g3loco"}, {"w8", "qwd3"}),
    (FOUR_BIT, {"g4"}, {"w8", "qwd4"}),
], ids=["default", "opt-in-3-bit", "opt-in-4-bit"])
def test_slow_network_quantizes_gradients_to_the_fewest_bits_and_weights_to_8_or_qwd(offered, grads, weights):
    units = gpt_like(blocks=3)
    net = network(3.5, 3.3)  # the emulated socket network: every byte costs
    d = decide(units, net, world_size=2, **offered, **ROOT_SCHEDULE)
    assert set(d.grads) == grads
    assert set(d.weights) <= weights
    assert d.speedup > 1.5
    allowed_w = offered.get("weight_candidates", WEIGHT_CANDIDATES)
    assert all(accuracy_violation(c) is None for c in (*allowed_w, *offered.get("grad_candidates", GRAD_CANDIDATES)))
    optimum = brute_force(units, net, allowed_w, offered.get("grad_candidates", GRAD_CANDIDATES), world_size=2,
                          **ROOT_SCHEDULE)
    assert d.step_s == pytest.approx(optimum, rel=1e-9)


def test_min_gain_keeps_units_off_when_quantizing_barely_pays():
    units = [UnitProfile("a", 1_000_000, 10e-3, 20e-3), UnitProfile("b", 1_000_000, 10e-3, 20e-3)]
    net = network(3.0, 3.0, 0.0, 0.0)  # comm mostly hidden behind 60 ms of compute: a gain of about 1%
    quantized = decide(units, net, world_size=2, min_gain=0.0)
    gain = 1 - quantized.step_s / quantized.plain_step_s
    assert 0 < gain < 0.05
    kept = decide(units, net, world_size=2, min_gain=gain + 0.01)
    assert set(kept.weights) == set(kept.grads) == {"off"} and "min_gain" in kept.note
    assert decide(units, net, world_size=2, min_gain=gain - 0.001).step_s == quantized.step_s


def test_locked_units_stay_off():
    units = gpt_like(blocks=2)
    d = decide(units, network(1.0, 1.0), world_size=4, locked=[0, 2], **THREE_BIT, **root_schedule(3))
    assert (d.weights[0], d.grads[0], d.weights[2], d.grads[2]) == ("off",) * 4
    assert d.grads[1] == "g3loco"


def test_accuracy_rule_table():
    assert accuracy_violation(W["off"]) is None and accuracy_violation(G["off"]) is None
    assert accuracy_violation(W["w8"]) is None and accuracy_violation(W["qwd4"]) is None
    assert accuracy_violation(G["g8"]) is None and accuracy_violation(G["g4"]) is None
    assert "difference scheme" in accuracy_violation(W4_DIRECT)
    assert "unmeasured" in accuracy_violation(QWD2)
    assert "stochastic" in accuracy_violation(G4_NEAREST)
    assert "below 4 bits" in accuracy_violation(G2)
    assert accuracy_violation(Candidate("g6n", "grads", SideConfig(bits=8, rounding="nearest"))) is None
    # The opt-in candidates: 3-bit weight differences, 3-bit biased gradients with LoCo's error feedback ...
    assert accuracy_violation(QWD3) is None
    assert accuracy_violation(G3LOCO) is None
    assert G3LOCO.scheme == "loco" and not G3LOCO.codec.unbiased
    # ... and nothing weaker: the same 3-bit biased code without feedback, 2-bit LoCo, 2-bit differences.
    assert "below 4 bits without error feedback" in accuracy_violation(G3_NEAREST)
    assert "error feedback below 3 bits" in accuracy_violation(G2_LOCO)
    assert "below 3 bits" in accuracy_violation(QWD2)


def test_registry_holds_every_candidate_most_accurate_first_and_the_defaults_are_the_measured_presets_sides():
    assert [c.name for c in WEIGHT_CANDIDATES] == ["off", "w8"]
    assert [c.name for c in GRAD_CANDIDATES] == ["off", "g8"]
    assert [c.name for c in candidates("weights")] == ["off", "w8", "qwd4", "qwd3"]
    assert [c.name for c in candidates("grads")] == ["off", "g8", "g4", "g3loco"]
    # Each candidate is a preset's side: the defaults w8g8's, the opt-in ones qwd-w3g3-loco's, qwd-w4g4's and
    # w8g4-paper's.
    preset = from_preset("qwd-w3g3-loco")
    assert (W["w8"].config, G["g8"].config) == (from_preset("w8g8").weights, from_preset("w8g8").grads)
    assert (QWD3.config, G3LOCO.config) == (preset.weights, preset.grads)
    assert (W["qwd4"].config, G["g4"].config) == (from_preset("qwd-w4g4").weights, from_preset("w8g4-paper").grads)
    g3 = G3LOCO.config
    assert (g3.bits, g3.codec, g3.bucket_size, g3.rounding, g3.scheme) == (3, "minmax", 256, "nearest", "loco")
    assert (g3.scheme_options.beta, g3.scheme_options.residual_dtype) == (0.5, "int8")
    w3 = QWD3.config
    assert (w3.bits, w3.codec, w3.bucket_size, w3.scheme) == (3, "symmetric", 2048, "difference")


def test_accuracy_rule_holds_over_random_inputs():
    rng = random.Random(0)
    weights = (*candidates("weights"), *FORBIDDEN["weights"])  # the opt-in candidates too
    grads = (*candidates("grads"), *FORBIDDEN["grads"])
    extra = (*FORBIDDEN["weights"], *FORBIDDEN["grads"])
    refused = {c.key for c in extra}
    chose_quantized = 0
    for case in range(150):
        n = rng.randint(1, 6)
        units = [UnitProfile(f"u{i}", rng.randint(10_000, 50_000_000), rng.uniform(0, 5e-3), rng.uniform(0, 1e-2),
                             rng.random() < 0.8) for i in range(n)]
        net = {c.key: LinkFit(rng.uniform(0, 2e-4), 10 ** rng.uniform(8.5, 11.5))
               for side in ("weights", "grads") for c in candidates(side)}
        for c in extra:  # the refused candidates get the best link of all: they would win if allowed
            net[c.key] = LinkFit(0.0, 1e12)
        world = rng.choice([2, 4, 8])
        d = decide(units, net, world_size=world, weight_candidates=weights, grad_candidates=grads,
                   microbatches=rng.randint(1, 4), min_gain=rng.choice([0.0, 0.02]))
        chosen = {f"weights:{w}" for w in d.weights} | {f"grads:{g}" for g in d.grads}
        assert not chosen & refused, (case, d)
        assert set(d.rejected) == refused
        assert d.step_s <= d.plain_step_s
        chose_quantized += chosen != {"weights:off", "grads:off"}
    assert chose_quantized > 20  # the cases exercise quantized choices, not only 'off'


def test_every_rank_decides_the_same_from_max_reduced_measurements():
    units = gpt_like(blocks=3)
    rng = random.Random(1)
    ranks = []  # each rank's own noisy timings of the same units, and its own step time
    for _ in range(4):
        own = [UnitProfile(u.name, u.numel, u.forward_s * rng.uniform(0.7, 1.3), u.backward_s * rng.uniform(0.7, 1.3),
                           u.regathers) for u in units]
        ranks.append(pack_profiles(own, [rng.uniform(0.1, 0.2)]))
    decisions = set()
    for order in itertools.permutations(range(4)):
        merged = torch.stack([ranks[i] for i in order]).amax(0)  # what all_reduce(MAX) gives every rank
        profiles, (step_s,) = unpack_profiles(units, merged)
        decisions.add(repr(decide(profiles, network(3.5, 3.3), world_size=4, **ROOT_SCHEDULE)))
        assert step_s == max(float(r[-1]) for r in ranks)
    assert len(decisions) == 1
    # Without the reduction, the ranks' own timings give different predictions (so agreement is not a given).
    own = {decide(unpack_profiles(units, r)[0], network(3.5, 3.3), world_size=4, **ROOT_SCHEDULE).step_s
           for r in ranks}
    assert len(own) == 4


def test_decide_rejects_bad_arguments():
    units = gpt_like(blocks=1)
    with pytest.raises(ValueError, match="min_gain=1.5 is invalid"):
        decide(units, network(1, 1), world_size=2, min_gain=1.5)
    with pytest.raises(ValueError, match="exactly one unquantized one, named 'off'"):
        decide(units, network(1, 1), world_size=2, weight_candidates=WEIGHT_CANDIDATES[1:])
    with pytest.raises(ValueError, match="no network measurement for 'grads:g3loco'"):
        decide(units, {k: v for k, v in network(1, 1).items() if k != "grads:g3loco"}, world_size=2, **THREE_BIT)


def test_record_logs_the_decision_it_holds():
    units = gpt_like(blocks=2)
    net = network(3.5, 3.3)
    d = decide(units, net, world_size=2, **THREE_BIT, **root_schedule(3))
    record = AutoRecord("decided", 4, d, 0.5, d.step_s + 0.1, 0.1, net, units, 1, 3, [u.name for u in units])
    m = record.metrics()
    assert m["qsdp/auto/predicted_step_s"] == pytest.approx(d.step_s + 0.1)
    assert m["qsdp/auto/predicted_speedup"] == pytest.approx((d.plain_step_s + 0.1) / (d.step_s + 0.1))
    assert m["qsdp/auto/grads/g3loco"] == 3 and sum(v for k, v in m.items() if k.startswith("qsdp/auto/weights/")) == 3
    assert m["qsdp/auto/network/grads/off/gbytes_per_s"] == pytest.approx(3.5)
    assert record.choice() == {(u.name or "<root>"): f"{w}/{g}" for u, w, g in zip(units, d.weights, d.grads)}
    assert record.message().startswith("QSDP auto decided at step 4: ") and "grads g3loco x3" in record.message()


def test_reconfigure_refuses_what_it_cannot_do_and_changes_nothing():
    from composer_qsdp.comm import Topology
    from composer_qsdp.config import from_preset
    from composer_qsdp.engine import QSDPHandle, Unit, plan_units

    layers = [nn.Linear(4, 4) for _ in range(2)]
    config = from_preset("w8g8", weight_bits=None, grad_bits=None, check_finite=False)
    plans = plan_units([Unit(f"l{i}", m, 20, tuple(m.parameters())) for i, m in enumerate(layers)], config)
    handle = QSDPHandle(nn.Sequential(*layers), config, plans, Topology(1))
    before = handle.units
    with pytest.raises(ValueError, match="one \\(weights, grads\\) pair per unit: 2, got 1"):
        handle.reconfigure([(None, None)])
    with pytest.raises(ValueError, match="unit l1: the difference weight scheme needs the unit's gather layout"):
        handle.reconfigure([(None, None), (W["qwd4"].build(), None)])
    assert handle.units is before


# ---------------------------------------------------------------------------------------------- the probe's fit
def test_fit_recovers_a_latency_bandwidth_law():
    latency, bandwidth = 45e-6, 3.7e9
    sizes = [2**20, 2**22, 2**24, 2**26]
    exact = fit_link([(b, latency + b / bandwidth) for b in sizes])
    assert exact.latency_s == pytest.approx(latency, rel=1e-6)
    assert exact.bytes_per_s == pytest.approx(bandwidth, rel=1e-6)
    rng = random.Random(2)
    noisy = fit_link([(b, (latency + b / bandwidth) * rng.uniform(0.98, 1.02)) for b in sizes for _ in range(3)])
    assert noisy.bytes_per_s == pytest.approx(bandwidth, rel=0.03)
    assert noisy.seconds(2**25) == pytest.approx(latency + 2**25 / bandwidth, rel=0.03)


def test_fit_edge_cases():
    # Noise that makes the intercept negative: the line goes through the origin instead.
    fit = fit_link([(1e6, 0.9e-3), (2e6, 2.1e-3)])
    assert fit.latency_s == 0.0 and fit.bytes_per_s == pytest.approx(1 / ((1e6 * 0.9e-3 + 2e6 * 2.1e-3) / 5e12))
    # Latency-bound (no slope): bytes cost next to nothing.
    flat = fit_link([(1e3, 1e-4), (1e6, 1e-4)])
    assert flat.latency_s == pytest.approx(1e-4) and flat.bytes_per_s >= 1e12
    with pytest.raises(ValueError, match="two or more sizes"):
        fit_link([(1e6, 1e-3), (1e6, 2e-3)])


def test_probe_sizes():
    assert probe_sizes([10_000_000, 40_000_000], 4, max_numel=2**24) == [2**20, 2**22, 2**24]
    small = probe_sizes([5000], 3)
    assert len(small) == 3 and all(s % 3 == 0 and s >= 3 * 1024 for s in small)


# ---------------------------------------------------------------------------------------------- options
def test_options_errors_name_the_value_and_what_is_allowed():
    with pytest.raises(ValueError, match="unknown policy 'fast'; allowed: auto, fixed"):
        QSDPConfig.from_preset(policy="fast")
    with pytest.raises(ValueError, match=r"policy='auto' chooses .* \['grad_bits', 'weight_bits'\]"):
        QSDPConfig.from_preset(policy="auto", weight_bits=8, grad_bits=4)
    with pytest.raises(ValueError, match="the preset 'w4g4' cannot be given"):
        QSDPConfig.from_preset("w4g4", policy="auto")
    with pytest.raises(ValueError, match=r"policy='auto' .* starts unquantized, but weights use bits \[8\], grads "
                                         r"use bits \[8\]"):
        QSDPConfig(policy="auto")
    with pytest.raises(ValueError, match=r"unknown option 'warmup' of policy 'auto'; did you mean 'warmup_steps'\?; "
                                         r"allowed: warmup_steps"):
        QSDPConfig.from_preset(policy="auto", auto_options={"warmup": 3})
    with pytest.raises(ValueError, match="needs policy='auto'"):
        QSDPConfig.from_preset(auto_options={"warmup_steps": 3})
    with pytest.raises(ValueError, match="warmup_steps"):
        AutoOptions(warmup_steps=1)
    with pytest.raises(ValueError, match=r"min_gain=1 is invalid; allowed: a number in \[0, 1\)"):
        AutoOptions(min_gain=1)
    with pytest.raises(ValueError, match=r"weight_candidates: unknown weight candidate 'qwd5'; did you mean 'qwd4'\?; "
                                         r"allowed: off, qwd3, qwd4, w8"):
        AutoOptions(weight_candidates=("off", "qwd5"))
    with pytest.raises(ValueError, match=r"grad_candidates: unknown grad candidate 'g3'.*; allowed: g3loco, g4, g8, off"):
        AutoOptions(grad_candidates=["off", "g3"])
    with pytest.raises(ValueError, match=r"grad_candidates=\['g8', 'g4'\] is invalid; it must name 'off'"):
        AutoOptions(grad_candidates=["g8", "g4"])
    with pytest.raises(ValueError, match=r"repeated: \['w8'\]"):
        AutoOptions(weight_candidates=["off", "w8", "w8"])
    with pytest.raises(ValueError, match="weight_candidates='off' is invalid; it must be a list"):
        AutoOptions(weight_candidates="off")
    qsdp = QSDP(QSDPConfig.from_preset(policy="auto", exclude=["l1"], auto_options={"warmup_steps": 3}))
    assert qsdp.config.weights.bits is None and qsdp.config.grads.bits is None  # starts unquantized
    options = qsdp.config.auto_options
    assert qsdp.policy == "auto" and options.warmup_steps == 3 and qsdp.config.exclude == ("l1",)
    assert (options.weight_candidates, options.grad_candidates) == (("off", "w8"), ("off", "g8"))
    assert QSDPConfig.from_preset(policy="auto").auto_options == AutoOptions()  # None: the defaults


def test_candidate_lists_from_yaml_load_in_accuracy_order():
    from omegaconf import OmegaConf

    # YAML reads a bare `off` as False; lists arrive as ListConfig; any order gives the registry's.
    cfg = OmegaConf.create("weight_candidates: [qwd3, off, qwd4]\ngrad_candidates: [g3loco, g8, 'off']")
    assert cfg.weight_candidates[1] is False
    options = QSDPConfig.from_preset(policy="auto", auto_options=cfg).auto_options
    assert options.weight_candidates == ("off", "qwd4", "qwd3")
    assert options.grad_candidates == ("off", "g8", "g3loco")


# ---------------------------------------------------------------------------------------------- forward timer
class _Clock:
    """A host clock that moves only when told (``perf_counter`` of ``composer_qsdp.auto.runtime`` in a test)."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class _Sleeps(nn.Module):
    """A module whose forward takes ``seconds`` of ``clock``, around an optional child."""

    def __init__(self, clock: _Clock, seconds: float, child: nn.Module | None = None) -> None:
        super().__init__()
        self.clock, self.seconds, self.child, self.lin = clock, seconds, child, nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.clock.sleep(self.seconds)
        return self.child(x) if self.child is not None else x


def test_forward_timer_excludes_nested_units_and_the_wait_for_weights(monkeypatch):
    from composer_qsdp.auto import runtime
    from composer_qsdp.comm import Topology
    from composer_qsdp.config import from_preset
    from composer_qsdp.engine import QSDPHandle, Unit, plan_units
    from composer_qsdp.auto.runtime import ForwardTimer

    # The timer reads this clock, which moves only by the modelled times: the result is exact on any host.
    clock = _Clock()
    monkeypatch.setattr(runtime, "time", clock)
    child = _Sleeps(clock, 0.020)
    parent = _Sleeps(clock, 0.040, child)
    # Like FSDP's pre-forward hook (registered at wrapping, before the timer's): waiting for the gathered weights.
    child.register_forward_pre_hook(lambda *_: clock.sleep(0.060), prepend=True)
    config = from_preset("w8g8", weight_bits=None, grad_bits=None, check_finite=False)
    units = [Unit("", parent, 6, tuple(parent.lin.parameters())), Unit("child", child, 6, tuple(child.lin.parameters()))]
    handle = QSDPHandle(parent, config, plan_units(units, config), Topology(1))
    timer = ForwardTimer(handle)
    parent(torch.zeros(2))  # before start(): not counted
    timer.start()
    for _ in range(3):
        parent(torch.zeros(2))
    with torch.no_grad():
        parent.eval()
        parent(torch.zeros(2))  # evaluation: not counted
    forward, gathers, micro = timer.stop()
    assert micro == 3 and gathers == [0.0, 0.0]  # no collectives in this process
    # Its own 40 ms per forward: not the child's 20 ms, nor the 60 ms the child waits for its weights.
    assert forward[0] == pytest.approx(0.040, abs=1e-9)
    assert forward[1] == pytest.approx(0.020, abs=1e-9)  # without the 60 ms wait before it
    timer.remove()  # only the wait hook is left
    assert (len(child._forward_pre_hooks), len(child._forward_hooks), len(parent._forward_pre_hooks)) == (1, 0, 0)


class _Spins(nn.Module):
    """Keeps the GPU busy for ``cycles`` clock cycles (``torch.cuda._sleep``), then calls ``child``."""

    def __init__(self, cycles: int, child: nn.Module | None = None) -> None:
        super().__init__()
        self.cycles, self.child, self.lin = cycles, child, nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.cuda._sleep(self.cycles)
        return self.child(x) if self.child is not None else x


@pytest.mark.gpu
def test_forward_timer_times_the_compute_stream_with_cuda_events():
    """On CUDA the stamps are events on the compute stream: GPU time, not the host's launch time."""
    from composer_qsdp.comm import Topology
    from composer_qsdp.config import from_preset
    from composer_qsdp.engine import QSDPHandle, Unit, plan_units
    from composer_qsdp.auto.runtime import ForwardTimer

    cycles = 20_000_000
    torch.cuda._sleep(10 * cycles)  # clocks up before the calibration
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    torch.cuda.synchronize()
    spin = start.elapsed_time(end) / 1e3  # seconds of one spin of `cycles`
    child = _Spins(cycles).cuda()
    parent = _Spins(2 * cycles, child).cuda()
    child.register_forward_pre_hook(lambda *_: torch.cuda._sleep(3 * cycles), prepend=True)  # the weights' wait
    config = from_preset("w8g8", weight_bits=None, grad_bits=None, check_finite=False)
    units = [Unit("", parent, 6, tuple(parent.lin.parameters())), Unit("child", child, 6, tuple(child.lin.parameters()))]
    handle = QSDPHandle(parent, config, plan_units(units, config), Topology(1))
    timer = ForwardTimer(handle)
    timer.start()
    for _ in range(2):
        parent(torch.zeros(2, device="cuda"))
    forward, _, micro = timer.stop()
    timer.remove()
    assert micro == 2
    # Spins are clock cycles, so their seconds follow the GPU's clock: the ratio is the exact check (counting the
    # child's spin or its 3-spin wait in either unit moves it to 1.5 or 0.5 at least), the seconds a loose one. Other
    # processes on the GPU time-slice into the spins (2.24 beside training), hence 20%.
    assert forward[0] / forward[1] == pytest.approx(2.0, rel=0.2)
    assert 0.5 * spin < forward[1] < 2 * spin
