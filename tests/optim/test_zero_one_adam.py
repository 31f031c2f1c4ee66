"""ZeroOneAdam against a single-process float64 reference of the paper's update (tests/zero_one_reference.py) on real
gloo groups of 2 and 4 ranks: the variance-freezing schedule with 1-bit synchronization, and the local-step phase
with its lr-weighted synchronizations; against torch's AdamW when neither freezing nor local steps happen; exact
checkpoint resume mid-interval; and its schedules, byte counts and argument checks."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from dist_spawn import RankInfo, run_ranks, skip_unless_backend, spawn_params
from zero_one_reference import ZeroOneAdamReference, chunk_numel, local_interval, variance_steps

from composer_qsdp.optim import ZeroOneAdam, ZeroOneSchedule, default_bucket_size
from composer_qsdp.quant import make_codec

BUCKET = 16
# Two parameter groups with different hyperparameters; the frozen parameter stays out of the flat layout.
SHAPES = [[(6, 5), (6,)], [(3, 7)]]
GROUPS = [{"lr": 0.01, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.05},
          {"lr": 0.005, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.0}]
SCENARIOS = {
    # Variance phase only: T_v = {1, 2, 4, 6, 10, 14}; the other steps synchronize with 1 bit.
    "freezing": {"steps": 14, "var_freeze_step": 100, "var_update_scaler": 2, "local_step_scaler": 2,
                 "local_step_clipper": 4, "bias_correction": False},
    # Frozen after step 4; synchronizations at steps 5, 6, 8, 12 and 16 (intervals 1, 1, 2, 4, 4).
    "local": {"steps": 16, "var_freeze_step": 4, "var_update_scaler": 2, "local_step_scaler": 2,
              "local_step_clipper": 4, "bias_correction": True},
}
RESUME_AT = (3, 10)  # a variance-phase step, and a local step between two synchronizations of "local"
# The step before which a parameter is frozen mid-run: in the variance phase, and between the synchronizations of
# steps 8 and 12 of "local"; and the step whose weights it must keep from then on (the last synchronized ones).
FREEZE_AT = {"freezing": (5, 4), "local": (10, 8)}
CLIP = 5.0  # max_grad_norm of the AdamW comparison


def _lr_factor(step: int) -> float:
    return 0.5 + 0.1 * step  # a warm-up-like ramp: each step's learning rate differs


def _params() -> list[list[torch.nn.Parameter]]:
    gen = torch.Generator().manual_seed(7)
    return [[torch.nn.Parameter(torch.randn(shape, generator=gen)) for shape in shapes] for shapes in SHAPES]


def _grads(step: int, rank: int, dead_unit: bool = True) -> list[list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    grads = [[torch.randn(shape, generator=gen) * (1 + rank) for shape in shapes] for shapes in SHAPES]
    if dead_unit:
        # Row 0 of the first weight gets no gradient on rank 0, and on the other ranks only at steps that update no
        # variance ("freezing": T_v = 1, 2, 4, 6, 10, 14; "local": 1, 2, 4): its variance stays zero, so it must not
        # move, although its gradients' mean is not zero.
        grads[0][0][0] = 0.0 if rank == 0 or step in (1, 2, 4, 6, 10, 14) else 1.0
    return grads


def _optimizer(params, settings: dict, extra: torch.nn.Parameter | None = None) -> ZeroOneAdam:
    """``extra``: one more parameter of group 0 (frozen, or trained and frozen later)."""
    groups = [{"params": ps, **options} for ps, options in zip(params, GROUPS)]
    if extra is not None:
        groups[0]["params"] = [*groups[0]["params"], extra]
    options = {k: v for k, v in settings.items() if k != "steps"}
    return ZeroOneAdam(groups, bucket_size=BUCKET, **options)


def _train(opt: ZeroOneAdam, params, steps: range, rank: int, dead_unit: bool = True) -> list[torch.Tensor]:
    """Steps ``steps`` with the test's gradients and learning rates; the flat parameters after each."""
    flats = []
    for step in steps:
        for group, base in zip(opt.param_groups, GROUPS):
            group["lr"] = base["lr"] * _lr_factor(step)
        for ps, gs in zip(params, _grads(step, rank, dead_unit)):
            for p, g in zip(ps, gs):
                p.grad = g.to(p.device)
        opt.step()
        flats.append(torch.cat([p.detach().reshape(-1) for ps in params for p in ps]).cpu())
    return flats


def _worker(info: RankInfo) -> dict:
    out: dict = {}
    for name, settings in SCENARIOS.items():
        params = [[p.to(info.device).detach().requires_grad_() for p in ps] for ps in _params()]
        frozen = torch.nn.Parameter(torch.ones(4, device=info.device), requires_grad=False)
        opt = _optimizer(params, settings, frozen)
        out[name] = {"flats": _train(opt, params, range(1, settings["steps"] + 1), info.rank),
                     "traffic": opt.traffic(), "frozen_untouched": bool((frozen == 1).all())}

    # A third weight in group 0, trained and then frozen as Composer's LayerFreezing does it (requires_grad off, out
    # of its group): the others' steps must be those of the optimizer above, which never held it.
    for name, settings in SCENARIOS.items():
        params = [[p.to(info.device).detach().requires_grad_() for p in ps] for ps in _params()]
        later = torch.nn.Parameter(torch.randn(6, 5, generator=torch.Generator().manual_seed(3)).to(info.device))
        opt = _optimizer(params, settings, later)
        at, keeps = FREEZE_AT[name]
        flats, laters = [], []
        for step in range(1, settings["steps"] + 1):
            if step == at:
                later.requires_grad_(False)
                later.grad = None
                for group in opt.param_groups:
                    group["params"] = [p for p in group["params"] if p is not later]
            elif step < at:
                gen = torch.Generator().manual_seed(500 * step + info.rank)
                later.grad = torch.randn(6, 5, generator=gen).to(info.device)
            flats.extend(_train(opt, params, range(step, step + 1), info.rank))
            laters.append(later.detach().clone().cpu())
        out[f"{name}_freeze_later"] = {"flats": flats, "laters": laters}

    # AdamW: every step updates the variance from an exact mean, and the variance never freezes; the mean gradient
    # is clipped (the test gradients' means have norms of about 9).
    params = [[p.to(info.device).detach().requires_grad_() for p in ps] for ps in _params()]
    opt = _optimizer(params, {"var_freeze_step": 1000, "var_update_scaler": 1000, "bias_correction": True,
                              "max_grad_norm": CLIP})
    out["adamw"] = _train(opt, params, range(1, 11), info.rank, dead_unit=False)

    # Resume: a fresh optimizer over the model checkpoint's weights (rank 0's) loads the state rank 0 saved (every
    # rank loads rank 0's checkpoint file), DDP's construction broadcasts rank 0's weights again, and the restored run
    # continues bit for bit.
    settings = SCENARIOS["local"]
    for at in RESUME_AT:
        params = [[p.to(info.device).detach().requires_grad_() for p in ps] for ps in _params()]
        opt = _optimizer(params, settings)
        _train(opt, params, range(1, at + 1), info.rank)
        between_syncs = opt.schedule.between_syncs
        model_checkpoint = [[p.detach().clone() for p in ps] for ps in params]
        for ps in model_checkpoint:
            for p in ps:
                dist.broadcast(p, src=0)
        state = opt.state_dict()  # collective: every rank takes part; rank 0's is what Composer writes
        saved = [copy.deepcopy(state) if info.rank == 0 else None]  # as written to disk: not the live tensors
        dist.broadcast_object_list(saved, src=0)
        continued = _train(opt, params, range(at + 1, settings["steps"] + 1), info.rank)

        fresh = [[p.requires_grad_() for p in ps] for ps in model_checkpoint]
        resumed_opt = _optimizer(fresh, settings)
        resumed_opt.load_state_dict(saved[0])
        for ps in fresh:
            for p in ps:
                dist.broadcast(p.data, src=0)
        restored = resumed_opt.restore_local_params()
        resumed = _train(resumed_opt, fresh, range(at + 1, settings["steps"] + 1), info.rank)
        out[f"resume{at}"] = {"continued": continued, "resumed": resumed, "between_syncs": between_syncs,
                              "restored": restored, "state": saved[0] if info.rank == 0 else None,
                              "traffic": (opt.traffic(), resumed_opt.traffic())}
    return out


# 4 ranks: 17 s on 2 cores with a bytecode cache, 90 s without; W=2 runs the same paths by default.
@pytest.fixture(scope="module", params=spawn_params((2, 4), slow_sizes=(4,)))
def runs(request):
    backend, world = request.param
    skip_unless_backend(backend, world)
    return world, run_ranks(_worker, world, backend=backend)


def _reference(settings: dict, world: int, bucket: int | None) -> list[list[torch.Tensor]]:
    """Each rank's flat parameters after each step, from the float64 reference."""
    x0 = torch.cat([p.detach().reshape(-1) for ps in _params() for p in ps])
    groups = [([torch.Size(s).numel() for s in shapes], g["lr"], g["betas"], g["eps"], g["weight_decay"],
               settings["bias_correction"]) for shapes, g in zip(SHAPES, GROUPS)]
    ref = ZeroOneAdamReference(x0, groups, world, bucket, settings["var_freeze_step"], settings["var_update_scaler"],
                               settings["local_step_scaler"], settings["local_step_clipper"])
    per_step = []
    for step in range(1, settings["steps"] + 1):
        grads = [torch.cat([g.reshape(-1) for gs in _grads(step, r) for g in gs]) for r in range(world)]
        ref.step(grads, [g["lr"] * _lr_factor(step) for g in GROUPS])
        per_step.append([x.clone() for x in ref.x])
    return per_step


@pytest.mark.parametrize("name", SCENARIOS)
def test_matches_the_float64_reference(runs, name):
    world, outs = runs
    expected = _reference(SCENARIOS[name], world, BUCKET)
    x0 = torch.cat([p.detach().reshape(-1) for ps in _params() for p in ps]).double()
    for rank, out in enumerate(outs):
        assert out[name]["frozen_untouched"]
        assert torch.equal(out[name]["flats"][-1][:5].double(), x0[:5])  # the dead unit's row never moved
        for step, (got, ref) in enumerate(zip(out[name]["flats"], expected), start=1):
            # fp32 against float64 over up to 16 steps of Adam: rounding only (a wrong sign or schedule is O(lr)).
            torch.testing.assert_close(got.double(), ref[rank], rtol=1e-5, atol=2e-6, msg=f"rank {rank} step {step}")
    if name == "local":  # between synchronizations the ranks' weights differ; after one they are the same again
        assert not torch.equal(outs[0][name]["flats"][8], outs[1][name]["flats"][8])  # step 9: local steps
        assert all(torch.equal(out[name]["flats"][11], outs[0][name]["flats"][11]) for out in outs)  # step 12: sync


@pytest.mark.parametrize("name", SCENARIOS)
def test_a_parameter_frozen_mid_run_stays_and_leaves_the_others_alone(runs, name):
    """Frozen before step ``at``, the parameter keeps the weights of step ``keeps`` (the step before, or in the
    local-step phase the last synchronization's, the same on every rank) to the end, and the other parameters take
    the steps of an optimizer that never held it: bit for bit on 2 ranks, to rounding on more."""
    world, outs = runs
    at, keeps = FREEZE_AT[name]
    for out in outs:
        got = out[f"{name}_freeze_later"]
        for a, b in zip(got["flats"], out[name]["flats"]):
            if world == 2:
                assert torch.equal(a, b)
            else:  # an exact all-reduce's sum of 3+ ranks rounds by where the element falls in the ring's segments
                torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
        assert not torch.equal(got["laters"][keeps - 1], got["laters"][0])  # it trained before
        for step in range(at, SCENARIOS[name]["steps"] + 1):
            assert torch.equal(got["laters"][step - 1], got["laters"][keeps - 1]), f"step {step}"
        assert torch.equal(got["laters"][-1], outs[0][f"{name}_freeze_later"]["laters"][-1])
    if name == "local":  # between synchronizations the ranks' copies differed: the frozen one is the synced one
        ranks = [out[f"{name}_freeze_later"]["laters"][8] for out in outs]  # step 9
        assert not torch.equal(ranks[0], ranks[1])


def test_without_freezing_or_local_steps_it_is_adamw_with_the_mean_gradient_clipped(runs):
    world, outs = runs
    params = _params()
    adamw = torch.optim.AdamW([{"params": ps, **g} for ps, g in zip(params, GROUPS)])
    for step in range(1, 11):
        for group, base in zip(adamw.param_groups, GROUPS):
            group["lr"] = base["lr"] * _lr_factor(step)
        per_rank = [_grads(step, r, dead_unit=False) for r in range(world)]
        for i, ps in enumerate(params):
            for j, p in enumerate(ps):
                p.grad = torch.stack([g[i][j] for g in per_rank]).mean(0)
        torch.nn.utils.clip_grad_norm_([p for ps in params for p in ps], CLIP)  # DDP's clipping: the mean
        adamw.step()
        flat = torch.cat([p.detach().reshape(-1) for ps in params for p in ps])
        for out in outs:
            # The same update up to the order of fp32 operations (AdamW decays the weights before the Adam step
            # and folds the bias corrections into its step size): a few ulps per step.
            torch.testing.assert_close(out["adamw"][step - 1], flat, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("at", RESUME_AT)
def test_checkpoint_resume_is_exact(runs, at):
    world, outs = runs
    for out in outs:
        result = out[f"resume{at}"]
        assert result["between_syncs"] == (at == 10) == result["restored"]
        assert all(torch.equal(a, b) for a, b in zip(result["continued"], result["resumed"]))
        before, after = result["traffic"]
        assert after == before  # the byte counters are part of the state
    state = outs[0][f"resume{at}"]["state"]["state"]
    entry = state[0]
    assert entry["worker_error"].shape == (world, *SHAPES[0][0]) and entry["server_error"].shape == SHAPES[0][0]
    assert ("local_param" in entry) == ("local_exp_avg" in entry) == (at == 10)
    assert entry["zero_one"]["world_size"] == world and entry["step"] == at


def test_a_checkpoint_between_syncs_needs_the_same_world_size(runs):
    world, outs = runs
    params = [[p.detach().requires_grad_() for p in ps] for ps in _params()]
    opt = _optimizer(params, SCENARIOS["local"])
    with pytest.raises(ValueError, match=f"taken by {world} ranks between two synchronizations"):
        opt.load_state_dict(outs[0]["resume10"]["state"])
    opt.load_state_dict(outs[0]["resume3"]["state"])  # variance phase: the ranks agree; only the errors are lost
    assert opt.schedule.step == 3
    partial = copy.deepcopy(outs[0]["resume3"]["state"])
    del partial["state"][1]["zero_one"]
    with pytest.raises(ValueError, match="for some trainable parameters only"):
        opt.load_state_dict(partial)


def test_bytes_count_what_was_sent_against_an_fp32_all_reduce_every_step(runs):
    world, outs = runs
    sizes = [torch.Size(s).numel() for shapes in SHAPES for s in shapes]
    padded = sum(-(-n // BUCKET) * BUCKET for n in sizes)  # every parameter starts on a bucket
    chunk = chunk_numel(padded, world, BUCKET)
    wire = make_codec("sign", bucket_size=BUCKET).wire_bytes(chunk)
    fp32 = 2 * (world - 1) * chunk * 4
    # "local": steps 1, 2, 4 update the variance (exact), step 3 and the syncs at 5, 6, 8, 12, 16 are 1-bit.
    traffic = outs[0]["local"]["traffic"]
    assert traffic.calls == 9
    assert traffic.sent == 3 * fp32 + 6 * 2 * (world - 1) * wire
    # Against what DDP sends: an fp32 all-reduce of the gradients (no gaps), every step.
    assert traffic.native == 16 * 2 * (world - 1) * -(-sum(sizes) // world) * 4
    assert traffic.bf16 == traffic.native // 2


def test_world_size_one_runs_the_update_without_communication():
    for name, settings in SCENARIOS.items():
        params = _params()
        opt = _optimizer(params, settings)
        flats = _train(opt, params, range(1, settings["steps"] + 1), rank=0)
        expected = _reference(settings, world=1, bucket=None)
        for got, ref in zip(flats, expected):
            torch.testing.assert_close(got.double(), ref[0], rtol=1e-5, atol=2e-6, msg=name)
        assert opt.world_size == 1 and opt.traffic().sent == 0


def test_schedules_follow_their_closed_forms():
    schedule = ZeroOneSchedule(var_freeze_step=200, var_update_scaler=3, local_step_scaler=5, local_step_clipper=8)
    plans = [schedule.advance() for _ in range(400)]
    assert {p.step for p in plans if p.update_variance} == variance_steps(200, 3)
    assert all(p.sync for p in plans[:200]) and [p.step for p in plans if p.enter_local] == [201]
    last = 0
    for p in plans[200:]:
        i = p.step - 200
        assert p.sync == (i - last >= local_interval(i, 5, 8)), i
        last = i if p.sync else last
    assert schedule.local_step_interval == 8 and schedule.var_updates == len(variance_steps(200, 3))


@pytest.mark.parametrize("options, match", [
    ({"lr": -0.1}, r"lr=-0.1 \(parameter group 0\) is invalid; it must be a finite number >= 0"),
    ({"lr": float("inf")}, r"lr=inf \(parameter group 0\) is invalid; it must be a finite number >= 0"),
    ({"eps": 0.0}, "eps=0.0 .* must be a finite number > 0"),
    ({"max_grad_norm": 0.0}, "max_grad_norm=0.0 is invalid; it must be a finite number > 0, or None"),
    ({"max_grad_norm": float("nan")}, "max_grad_norm=nan"),
    ({"bound_updates": 1}, "bound_updates=1 is invalid; allowed: True, False"),
    ({"betas": (1.0, 0.9)}, r"betas=\(1.0, 0.9\) .* two numbers in \[0, 1\)"),
    ({"eps": -1e-8}, "eps=-1e-08"),
    ({"weight_decay": -0.01}, "weight_decay=-0.01"),
    ({"bias_correction": "yes"}, "bias_correction='yes' .* allowed: True, False"),
    ({"var_freeze_step": 0}, "var_freeze_step=0 is invalid; it must be an integer >= 1"),
    ({"var_update_scaler": 0}, "var_update_scaler=0"),
    ({"local_step_scaler": 1.5}, "local_step_scaler=1.5"),
    ({"local_step_clipper": 0}, "local_step_clipper=0"),
    ({"amsgrad": True}, "amsgrad=True is not supported"),
    ({"codec": "minmax"}, "codec='minmax' rounds stochastically"),
    ({"codec": "zip"}, "unknown codec 'zip'"),
    ({"bucket_size": 0}, "bucket_size=0"),
])
def test_bad_options_are_named(options, match):
    with pytest.raises(ValueError, match=match):
        ZeroOneAdam([torch.nn.Parameter(torch.zeros(3))], **options)


def test_the_default_bucket_never_spans_two_rows():
    def widths(*shapes):
        return [torch.nn.Parameter(torch.zeros(shape)) for shape in shapes]

    assert default_bucket_size(widths((50304, 768), (768, 3072), (3072,))) == 256  # GPT-125M
    assert default_bucket_size(widths((50304, 64), (64, 192), (64,))) == 64  # the tiny CPU GPT
    assert default_bucket_size(widths((16, 67), (67,))) == 256  # an odd width: 1-element buckets would not pay
    assert default_bucket_size(widths((5,))) == 256
    frozen = widths((10, 8))[0].requires_grad_(False)
    assert default_bucket_size([frozen, *widths((4, 128))]) == 128
    params = widths((12, 64))
    opt = ZeroOneAdam(model for model in [{"params": (p for p in params)}])  # generators are read once
    assert opt.param_groups[0]["params"] == params and opt._codec.bucket_size == 64


def test_parameters_it_cannot_hold_are_named():
    with pytest.raises(ValueError, match="parameter 1 has dtype torch.bfloat16"):
        ZeroOneAdam([torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))])
    with pytest.raises(ValueError, match="parameter 1 is on meta but parameter 0 is on cpu"):
        ZeroOneAdam([torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2, device="meta"))])
    opt = ZeroOneAdam([torch.nn.Parameter(torch.zeros(3))])
    with pytest.raises(ValueError, match="parameter groups at construction only"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})
