"""ZeroOneAdam's two variance options on real 2-rank gloo groups, each against an independent float64 computation.

* ``variance_codec``: the variance updates' all-reduce through an 8-bit codec keeps ``v`` within the error bound
  the codec's half-step rounding implies for the float64 ``v`` of the exact mean gradients, and sends what the codec's
  wire says.
* ``variance_rescale``: with per-bucket squared gradients constant over time the frozen variance is used as is;
  with gradients scaled by ``c`` after the freeze the ratio follows the closed form of a bias-corrected EMA towards
  ``c**2`` (bounded to ``RESCALE_BOUNDS``) and the weights follow a float64 reference of the update with
  ``v_frozen * ratio``; replicas stay bit-identical after every synchronization; checkpoints continue bit for bit.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from dist_spawn import RankInfo, run_ranks

from composer_qsdp.comm import error_feedback_chunk_numel
from composer_qsdp.optim import ZeroOneAdam, ZeroOneSchedule
from composer_qsdp.optim.bucket_statistics import RESCALE_BOUNDS
from composer_qsdp.quant import make_codec

WORLD = 2
BUCKET = 16
SHAPE = (8, 32)  # 256 elements, 16 buckets; rows of different magnitudes, elements of one row too
LR = 1e-2
EPS = 1e-8


def _magnitudes() -> torch.Tensor:
    gen = torch.Generator().manual_seed(3)
    rows = torch.logspace(-2, 1, SHAPE[0], dtype=torch.float64)[:, None]
    return rows * (0.5 + torch.rand(SHAPE, generator=gen, dtype=torch.float64))


def _random_grad(step: int, rank: int) -> torch.Tensor:
    """float64 gradients whose scale differs by row and element (the variance_codec check)."""
    gen = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(SHAPE, generator=gen, dtype=torch.float64) * _magnitudes()


def _sign_grad(step: int, rank: int, scale: float) -> torch.Tensor:
    """``scale * sign * a``: random signs on fixed magnitudes ``a``, so every rank's squared gradient per bucket
    is ``scale**2 * sum(a**2)`` at every step (the variance_rescale checks)."""
    gen = torch.Generator().manual_seed(100 * step + rank)
    signs = torch.randint(0, 2, SHAPE, generator=gen, dtype=torch.float64) * 2 - 1
    return scale * signs * _magnitudes()


# ---------------------------------------------------------------------------------------------- variance_codec
CODEC_STEPS = 12
BETAS_CODEC = (0.9, 0.95)


def _codec_worker(info: RankInfo) -> dict:
    out = {}
    for name, variance_codec in (("exact", None), ("int8", "symmetric")):
        p = torch.nn.Parameter(torch.zeros(SHAPE))
        # Every step updates the variance and it never freezes: only the variance updates' all-reduce is tested.
        opt = ZeroOneAdam([p], lr=LR, betas=BETAS_CODEC, var_freeze_step=1000, var_update_scaler=1000,
                          variance_codec=variance_codec, bucket_size=BUCKET)
        vs = []
        for step in range(1, CODEC_STEPS + 1):
            p.grad = _random_grad(step, info.rank).float()
            opt.step()
            vs.append(opt.state[p]["exp_avg_sq"].clone())
        out[name] = {"v": vs, "traffic": opt.traffic(), "bits": (opt.bits_per_element, opt.variance_bits_per_element,
                                                                  opt.stats_bits_per_element)}
    return out


@pytest.fixture(scope="module")
def codec_runs():
    return run_ranks(_codec_worker, WORLD)


def test_an_8bit_variance_codec_keeps_v_within_the_codec_bound(codec_runs):
    beta2 = BETAS_CODEC[1]
    v_ref = torch.zeros(SHAPE, dtype=torch.float64)
    bound = torch.zeros(SHAPE, dtype=torch.float64)
    qmax = 127
    for step in range(1, CODEC_STEPS + 1):
        grads = [_random_grad(step, r) for r in range(WORLD)]
        mean = torch.stack(grads).mean(0)

        def half_step(x: torch.Tensor) -> torch.Tensor:  # per bucket: absmax / qmax / 2, on every element
            return (x.reshape(-1, BUCKET).abs().amax(1, keepdim=True) / qmax / 2).expand(-1, BUCKET).reshape(SHAPE)

        # Worker rounding: each rank's error is at most half its bucket's step, so the mean's is at most the
        # largest; the server rounds the decoded mean, whose absmax is at most the mean's plus that error.
        worker = torch.stack([half_step(g) for g in grads]).amax(0)
        err = worker + half_step(mean.abs() + worker)
        v_ref = beta2 * v_ref + (1 - beta2) * mean * mean
        bound = beta2 * bound + (1 - beta2) * err * (2 * mean.abs() + err)
        for out in codec_runs:
            exact, int8 = out["exact"]["v"][step - 1].double(), out["int8"]["v"][step - 1].double()
            torch.testing.assert_close(exact, v_ref, rtol=1e-5, atol=0)
            assert ((int8 - v_ref).abs() <= bound * 1.001 + 1e-6 * v_ref).all(), step
    assert not torch.equal(codec_runs[0]["int8"]["v"][-1], codec_runs[0]["exact"]["v"][-1])  # the codec acted
    assert torch.equal(codec_runs[0]["int8"]["v"][-1], codec_runs[1]["int8"]["v"][-1])  # the same on every rank
    assert (bound / v_ref).median() < 0.05  # the bound is not vacuous: 8 bits move v by a few percent at most


def test_the_variance_codec_bytes_are_counted_at_their_wire_size(codec_runs):
    codec = make_codec("symmetric", bucket_size=BUCKET)
    chunk = error_feedback_chunk_numel(SHAPE[0] * SHAPE[1], WORLD, codec)
    for out in codec_runs:
        traffic, exact = out["int8"]["traffic"], out["exact"]["traffic"]
        assert traffic.calls == exact.calls == CODEC_STEPS
        assert traffic.sent == CODEC_STEPS * 2 * (WORLD - 1) * codec.wire_bytes(chunk)
        assert exact.sent == CODEC_STEPS * 2 * (WORLD - 1) * chunk * 4 == traffic.native
        # The schedule's plan predicts the ratio from the bits per element (8 + 32 / 16 bits: 3.2x).
        bits, variance_bits, stats_bits = out["int8"]["bits"]
        plan = ZeroOneSchedule(1000, 1000, 1, 1).plan(CODEC_STEPS)
        assert traffic.ratio_vs_native == pytest.approx(plan.ratio_vs_fp32(bits, variance_bits, stats_bits))
        assert traffic.ratio_vs_native == pytest.approx(32 / (8 + 32 / BUCKET))


# ---------------------------------------------------------------------------------------------- variance_rescale
FREEZE = 6
RESCALE_STEPS = 40
BETAS_RESCALE = (0.9, 0.8)  # a short variance memory: the ratio converges within the run
# Local steps: synchronizations at 7, 8, 10, 12, 16, 20, ... (intervals 1, 2, 4).
SCHEDULE = {"var_freeze_step": FREEZE, "var_update_scaler": 1000, "local_step_scaler": 2, "local_step_clipper": 4}
SCALES = {"constant": 1.0, "scaled": 3.0, "above_bound": 30.0, "below_bound": 0.01}


def _stream(name: str, step: int, rank: int) -> torch.Tensor:
    """Scale 1 until the freeze, ``SCALES[name]`` after it. Until the freeze the ranks' signs agree: where they
    differed at every variance update the mean and ``v`` would be 0, and such an element rightly takes no part."""
    if step <= FREEZE:
        return _sign_grad(step, 0, 1.0)
    return _sign_grad(step, rank, SCALES[name])


def _rescale_run(info: RankInfo, name: str, rescale: bool, codec: str | None) -> dict:
    p = torch.nn.Parameter(torch.ones(SHAPE))
    opt = ZeroOneAdam([p], lr=LR, betas=BETAS_RESCALE, eps=EPS, bound_updates=False, codec=codec,
                      variance_rescale=rescale, bucket_size=BUCKET, **SCHEDULE)
    xs, ratios = [], []
    for step in range(1, RESCALE_STEPS + 1):
        p.grad = _stream(name, step, info.rank).float()
        opt.step()
        xs.append(p.detach().clone())
        ratios.append(opt.state[p]["grad_sq_ratio"].clone() if rescale else None)
    return {"x": xs, "ratio": ratios, "traffic": opt.traffic()}


def _rescale_worker(info: RankInfo) -> dict:
    out = {name: _rescale_run(info, name, True, None) for name in SCALES}
    out["constant_without"] = _rescale_run(info, "constant", False, None)
    out["compressed"] = _rescale_run(info, "scaled", True, "sign")
    return out


@pytest.fixture(scope="module")
def rescale_runs():
    return run_ranks(_rescale_worker, WORLD)


def _sync_steps() -> list[int]:
    schedule = ZeroOneSchedule(FREEZE, 1000, SCHEDULE["local_step_scaler"], SCHEDULE["local_step_clipper"])
    return [s.step for s in (schedule.advance() for _ in range(RESCALE_STEPS)) if s.local and s.sync]


def _expected_ratio(name: str, step: int) -> float:
    """The bias-corrected per-step EMA of ``scale**2`` at ``step`` over its value at the freeze, bounded."""
    beta2, c2 = BETAS_RESCALE[1], SCALES[name] ** 2
    ema = c2 + (1 - c2) * beta2 ** (step - FREEZE) * (1 - beta2**FREEZE) / (1 - beta2**step)
    return min(max(ema, RESCALE_BOUNDS[0]), RESCALE_BOUNDS[1])


@pytest.mark.parametrize("name", SCALES)
def test_the_ratio_follows_the_gradients_squares_since_the_freeze(rescale_runs, name):
    syncs = _sync_steps()
    for out in rescale_runs:
        ratio = 1.0
        for step in range(1, RESCALE_STEPS + 1):
            if step in syncs:
                ratio = _expected_ratio(name, step)
            got = out[name]["ratio"][step - 1]
            torch.testing.assert_close(got.double(), torch.full_like(got, ratio, dtype=torch.float64), rtol=2e-5,
                                       atol=0, msg=f"{name} step {step}")
    final = rescale_runs[0][name]["ratio"][-1]
    assert final.double().mean() == pytest.approx(min(max(SCALES[name] ** 2, 0.01), 100), rel=0.01)


def test_a_constant_gradient_scale_leaves_the_frozen_variance_as_it_is(rescale_runs):
    for out in rescale_runs:
        for got, plain in zip(out["constant"]["x"], out["constant_without"]["x"]):
            torch.testing.assert_close(got, plain, rtol=1e-6, atol=1e-7)


def _reference_weights(name: str) -> list[list[torch.Tensor]]:
    """float64 0/1 Adam with exact means, unbounded steps and ``v_frozen * ratio`` after the freeze: every rank's
    weights after every step."""
    beta1, beta2 = BETAS_RESCALE
    syncs = _sync_steps()
    x = [torch.ones(SHAPE, dtype=torch.float64) for _ in range(WORLD)]
    m = [torch.zeros(SHAPE, dtype=torch.float64) for _ in range(WORLD)]
    v = torch.zeros(SHAPE, dtype=torch.float64)
    x_sync, lr_sum, ratio = x[0].clone(), 0.0, 1.0
    out = []
    for step in range(1, RESCALE_STEPS + 1):
        grads = [_stream(name, step, r) for r in range(WORLD)]
        if step <= FREEZE:
            g = torch.stack(grads).mean(0)
            v = beta2 * v + (1 - beta2) * g * g
            m = [beta1 * m[0] + (1 - beta1) * g] * WORLD
            x = [x[0] - LR * m[0] / (v.sqrt() + EPS)] * WORLD
            x_sync = x[0].clone()
        else:
            d = (v * ratio).sqrt() + EPS
            m = [beta1 * m[r] + (1 - beta1) * grads[r] for r in range(WORLD)]
            x = [x[r] - LR * m[r] / d for r in range(WORLD)]
            lr_sum += LR
            if step in syncs:
                u = torch.stack([xr - x_sync for xr in x]).mean(0)
                m = [-u * d / lr_sum] * WORLD
                x_sync = x_sync + u
                x = [x_sync.clone() for _ in range(WORLD)]
                lr_sum = 0.0
                ratio = _expected_ratio(name, step)
        out.append([xr.clone() for xr in x])
    return out


@pytest.mark.parametrize("name", ["scaled", "below_bound"])
def test_the_frozen_variance_is_scaled_by_the_ratio_in_the_update(rescale_runs, name):
    expected = _reference_weights(name)
    for rank, out in enumerate(rescale_runs):
        for step, (got, ref) in enumerate(zip(out[name]["x"], expected), start=1):
            torch.testing.assert_close(got.double(), ref[rank], rtol=1e-5, atol=1e-5, msg=f"rank {rank} step {step}")
    # Not the update without the rescale: its steps would be 3x (or 0.1x) smaller or larger.
    plain = _reference_weights("constant")
    assert not torch.allclose(rescale_runs[0][name]["x"][-1].double(), plain[-1][0], rtol=1e-3, atol=1e-3)


def test_replicas_and_ratios_are_bit_identical_after_every_synchronization(rescale_runs):
    a, b = (out["compressed"] for out in rescale_runs)
    syncs = _sync_steps()
    for step in range(1, RESCALE_STEPS + 1):
        assert torch.equal(a["ratio"][step - 1], b["ratio"][step - 1]), step
        if step <= FREEZE or step in syncs:
            assert torch.equal(a["x"][step - 1], b["x"][step - 1]), step
    between = [step for step in range(FREEZE + 1, RESCALE_STEPS + 1) if step not in syncs]
    assert between and all(not torch.equal(a["x"][step - 1], b["x"][step - 1]) for step in between)  # local steps
    assert a["ratio"][-1].double().mean() == pytest.approx(9, rel=0.01)


def test_the_statistics_bytes_are_one_fp32_per_bucket_at_every_sync(rescale_runs):
    syncs = _sync_steps()
    buckets = SHAPE[0] * SHAPE[1] // BUCKET
    stats_chunk = error_feedback_chunk_numel(buckets, WORLD, None)
    sign = make_codec("sign", bucket_size=BUCKET)
    chunk = error_feedback_chunk_numel(SHAPE[0] * SHAPE[1], WORLD, sign)
    traffic = rescale_runs[0]["compressed"]["traffic"]
    # FREEZE exact variance updates and len(syncs) 1-bit syncs, each with one statistics all-reduce.
    assert traffic.calls == 2 * (FREEZE + len(syncs))
    per_call = 2 * (WORLD - 1)
    assert traffic.sent == per_call * (FREEZE * chunk * 4 + len(syncs) * sign.wire_bytes(chunk)
                                       + (FREEZE + len(syncs)) * stats_chunk * 4)


# ---------------------------------------------------------------------------------------------- checkpoints
RESUME_SCHEDULE = {"var_freeze_step": 8, "var_update_scaler": 2, "local_step_scaler": 2, "local_step_clipper": 4}
RESUME_STEPS = 20
RESUME_AT = (5, 13)  # between two sparse variance updates (4 and 6); between two local-phase syncs (12 and 16)


def _resume_optimizer(params: list[torch.nn.Parameter]) -> ZeroOneAdam:
    return ZeroOneAdam(params, lr=LR, betas=BETAS_CODEC, variance_codec="symmetric", variance_rescale=True,
                       bucket_size=BUCKET, max_grad_norm=20.0, **RESUME_SCHEDULE)


def _resume_train(opt: ZeroOneAdam, p: torch.nn.Parameter, steps: range, rank: int) -> list[torch.Tensor]:
    xs = []
    for step in steps:
        p.grad = _random_grad(step, rank).float() * (1 + step / 4)
        opt.step()
        xs.append(p.detach().clone())
    return xs


def _resume_worker(info: RankInfo) -> dict:
    out = {}
    for at in RESUME_AT:
        p = torch.nn.Parameter(torch.ones(SHAPE))
        opt = _resume_optimizer([p])
        _resume_train(opt, p, range(1, at + 1), info.rank)
        checkpoint = p.detach().clone()
        dist.broadcast(checkpoint, src=0)  # the model checkpoint is rank 0's weights
        state = opt.state_dict()
        saved = [copy.deepcopy(state) if info.rank == 0 else None]
        dist.broadcast_object_list(saved, src=0)
        local_nonzero = bool(state["state"][0]["grad_sq_local"].abs().sum() > 0)
        continued = _resume_train(opt, p, range(at + 1, RESUME_STEPS + 1), info.rank)
        fresh = torch.nn.Parameter(checkpoint)
        resumed_opt = _resume_optimizer([fresh])
        resumed_opt.load_state_dict(saved[0])
        resumed_opt.restore_local_params()
        resumed = _resume_train(resumed_opt, fresh, range(at + 1, RESUME_STEPS + 1), info.rank)
        out[at] = {"continued": continued, "resumed": resumed, "local_nonzero": local_nonzero,
                   "traffic": (opt.traffic(), resumed_opt.traffic()), "state": saved[0]}
    return out


def test_checkpoints_with_both_options_continue_exactly():
    outs = run_ranks(_resume_worker, WORLD)
    for out in outs:
        for at in RESUME_AT:
            result = out[at]
            assert result["local_nonzero"]  # the per-rank squares since the last sync were saved, not zeros
            assert all(torch.equal(a, b) for a, b in zip(result["continued"], result["resumed"])), at
            assert result["traffic"][0] == result["traffic"][1]
    entry = outs[0][13]["state"]["state"][0]
    assert entry["grad_sq_local"].shape == (WORLD, SHAPE[0] * SHAPE[1] // BUCKET)
    assert entry["grad_sq_ratio"].shape == (SHAPE[0] * SHAPE[1] // BUCKET,)
    # A checkpoint without the statistics cannot drive variance_rescale.
    plain = ZeroOneAdam([torch.nn.Parameter(torch.ones(SHAPE))], bucket_size=BUCKET, **RESUME_SCHEDULE)
    plain.load_state_dict(outs[0][5]["state"])  # ... but a run without it may drop them
    plain.param_groups[0]["params"][0].grad = torch.ones(SHAPE)
    plain.step()
    state = plain.state_dict()
    assert "grad_sq_ema" not in state["state"][0]
    with pytest.raises(ValueError, match="saved without it"):
        _resume_optimizer([torch.nn.Parameter(torch.ones(SHAPE))]).load_state_dict(state)


@pytest.mark.parametrize("options, match", [
    ({"variance_codec": "minmax"}, "variance_codec='minmax' rounds stochastically"),
    ({"variance_codec": 8}, "variance_codec=8 is invalid; allowed: None"),
    ({"variance_codec": {"bits": 8}}, "variance_codec=.* is invalid"),
    ({"variance_codec": {"name": "symmetric", "bits": 12}}, "variance_codec=.*bits"),
    ({"variance_codec": "symetric"}, "unknown codec 'symetric'"),
    ({"variance_codec": {"name": "symmetric", "bucket_size": 96}, "bucket_size": 64}, "does not divide"),
    ({"variance_rescale": True, "codec": None, "bucket_size": 0}, "bucket_size=0 is invalid"),
    ({"variance_rescale": "yes"}, "variance_rescale='yes' is invalid; allowed: True, False"),
])
def test_bad_variance_options_are_named(options, match):
    with pytest.raises(ValueError, match=match):
        ZeroOneAdam([torch.nn.Parameter(torch.zeros(3))], **options)
