"""The loco gradient scheme (LoCo's error feedback in the flat reduce-scatter) on real gloo groups.

* Against an exact reference: a single-process float64 simulation of every rank's recursion
  ``c = g + e; send encode(c); e <- beta e + (1 - beta)(c - decode(encode(c)))`` over several calls (two calls per
  optimizer step, as gradient accumulation makes them), with the sum of the owners' decoded chunks as the output;
  chunk sizes that no bucket divides (FSDP's padded uneven shards); nearest and stochastic rounding; fp32, bf16 and
  int8-coded residuals (the simulation rounds its residual to the same storage after every call); 2 and 3 ranks (4
  marked slow).
* Classic error feedback (``beta = 0``) telescopes: the outputs summed over calls equal the gradients summed over
  calls less the ranks' final residuals (an identity of exact arithmetic, checked here in fp64 from the scheme's own
  outputs).
* Its state survives a save -> load into a new scheme bit for bit, float or int8-coded; saving makes no collective
  call (each rank's residual is its own ``Shard(0)`` piece); residuals of another group size, a state without this
  rank's piece, or one saved in the other storage (int8 codes against floats) start from zero with one warning naming
  why; a piece of the wrong shape raises; ``reset_every`` zeroes the
  residual; a NaN gradient stays NaN in the output but leaves the residual finite; misuse raises naming the bad
  value; a call of another size (FSDP's gradient layout after parameters were frozen or unfrozen) warns once and
  computes what a fresh scheme computes.
* On an FSDP2 model with an uneven layer, with gradient accumulation, a ``torch.distributed.checkpoint`` resume
  continues exactly as the uninterrupted run.
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch
import torch.distributed as dist
from dist_spawn import RankInfo, run_ranks
from sharded_mlp import LR, Adapter, _train, load_sharded, save_sharded

from composer_qsdp.config import from_preset
from composer_qsdp.comm import Topology, mix_seed, quantized_reduce_scatter
from composer_qsdp.quant import CodedResidual, SymmetricCodec, make_codec
from composer_qsdp.schemes import LoCoReduceScatter, LoCoResidualWarning, build_scheme, make_grad_scheme

N = 37  # elements per rank's chunk: no bucket size here divides it
CALLS, PER_STEP = 6, 2  # reduce-scatter calls, and calls per optimizer step
SEED = 11
CASES = {  # name: (codec, beta, residual dtype)
    "nearest": (("minmax", 2, 16, "nearest"), 0.8, "float32"),
    "stochastic": (("minmax", 2, 16, "stochastic"), 0.5, "float32"),
    "classic": (("symmetric", 3, 8, None), 0.0, "float32"),
    "bf16": (("minmax", 2, 16, "nearest"), 0.8, "bfloat16"),
    "int8": (("minmax", 2, 16, "nearest"), 0.8, "int8"),
}


def _codec(spec):
    name, bits, bucket, rounding = spec
    return make_codec(name, bits=bits, bucket_size=bucket, **({} if rounding is None else {"rounding": rounding}))


def _grad(rank: int, call: int, world: int) -> torch.Tensor:
    return torch.randn(world * N, generator=torch.Generator().manual_seed(1000 * call + rank))


def _values(residual: torch.Tensor | CodedResidual) -> torch.Tensor:
    """A residual's ``W * N`` values, a new float tensor whatever its storage."""
    return residual.decode().reshape(-1) if isinstance(residual, CodedResidual) else residual.clone()


def _stored(residual: torch.Tensor, dtype: str, world: int, bucket: int) -> torch.Tensor:
    """float64 ``residual`` (``W * N``) as the scheme stores it between calls, read back as float64."""
    if dtype != "int8":
        return residual.to(getattr(torch, dtype)).double()
    storage = SymmetricCodec(8, bucket)
    return storage.decode_rows(storage.encode_rows(residual.float().view(world, N)), N).double().reshape(-1)


def _reference(world: int, codec, beta: float, dtype: str) -> tuple[list[torch.Tensor], torch.Tensor]:
    """float64 simulation of every rank: the AVG outputs of each call ([W, N] per call) and the final residuals."""
    residuals = torch.zeros(world, world * N, dtype=torch.float64)
    outputs = []
    for call in range(CALLS):
        decoded = torch.empty(world, world, N, dtype=torch.float64)  # [sender, destination chunk, element]
        for r in range(world):
            c = _grad(r, call, world).double() + residuals[r]
            wire = codec.encode_rows(c.float().view(world, N), seed=mix_seed(SEED + call, r))
            q = codec.decode_rows(wire, N).double()
            decoded[r] = q
            residuals[r] = beta * residuals[r] + (1 - beta) * (c - q.reshape(-1))
            residuals[r] = _stored(residuals[r], dtype, world, codec.bucket_size)  # what the scheme keeps
        outputs.append(decoded.sum(0) / world)
    return outputs, residuals


_COLLECTIVES = ("all_gather", "all_gather_into_tensor", "all_gather_object", "gather", "gather_object", "broadcast",
                "broadcast_object_list", "all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor",
                "all_to_all", "all_to_all_single", "send", "recv", "isend", "irecv", "barrier")


def _count_collectives(fn):
    """``fn()`` with every torch.distributed collective counted: (its result, the names of the calls made)."""
    calls: list[str] = []
    saved = {name: getattr(dist, name) for name in _COLLECTIVES}

    def counting(name):
        def call(*args, **kwargs):
            calls.append(name)
            return saved[name](*args, **kwargs)
        return call

    try:
        for name in _COLLECTIVES:
            setattr(dist, name, counting(name))
        return fn(), calls
    finally:
        for name, original in saved.items():
            setattr(dist, name, original)


def _rank_side(info: RankInfo) -> dict:
    world, group = info.world_size, dist.group.WORLD
    out: dict = {}
    for case, (spec, beta, dtype) in CASES.items():
        scheme = make_grad_scheme("loco", _codec(spec), beta=beta, residual_dtype=dtype)
        scheme.setup(group, Topology(1))
        outputs = []
        for call in range(CALLS):
            o = torch.empty(N)
            scheme.reduce_scatter(o, _grad(info.rank, call, world), dist.ReduceOp.AVG, SEED + call, group)
            outputs.append(o)
            if (call + 1) % PER_STEP == 0:
                scheme.on_optimizer_step()
        out[case] = {"outputs": outputs, "residual": _values(scheme.residual), "memory": scheme.memory_bytes(),
                     "describe": scheme.describe()}

    # save after 3 calls -> a new scheme continues exactly as the first one does, whatever the residual's storage
    spec, beta, _ = CASES["stochastic"]
    saves = {}
    for dtype in ("float32", "int8"):
        first = LoCoReduceScatter(_codec(spec), beta=beta, residual_dtype=dtype)
        first.setup(group, Topology(1))
        for call in range(3):
            first.reduce_scatter(torch.empty(N), _grad(info.rank, call, world), dist.ReduceOp.SUM, SEED + call)
        saved, out[f"save_collectives_{dtype}"] = _count_collectives(first.state_dict)
        saves[dtype] = saved
        piece, storage = saved["residual"], getattr(first.residual, "wire", first.residual)
        out[f"piece_{dtype}"] = (type(piece).__name__, tuple(piece.shape), tuple(piece.to_local().shape),
                                 torch.equal(piece.to_local().view(storage.shape), storage))
        second = LoCoReduceScatter(_codec(spec), beta=beta, residual_dtype=dtype)
        second.setup(group, Topology(1))
        second.load_state_dict(saved)
        same = []
        for call in range(3, CALLS):
            a, b = torch.empty(N), torch.empty(N)
            first.reduce_scatter(a, _grad(info.rank, call, world), dist.ReduceOp.SUM, SEED + call)
            second.reduce_scatter(b, _grad(info.rank, call, world), dist.ReduceOp.SUM, SEED + call)
            same.append(torch.equal(a, b))
        out[f"resume_equal_{dtype}"] = all(same) and torch.equal(_values(first.residual), _values(second.residual))
        out[f"resume_calls_{dtype}"] = second.traffic.calls
    saved = saves["float32"]
    fresh = {}  # residual_dtype: the residual after one call from zero
    for dtype in ("float32", "int8"):
        scheme = LoCoReduceScatter(_codec(spec), beta=beta, residual_dtype=dtype)
        scheme.setup(group, Topology(1))
        scheme.reduce_scatter(torch.empty(N), _grad(info.rank, 0, world), dist.ReduceOp.SUM, SEED)
        fresh[dtype] = _values(scheme.residual)
    other_world = dict(saved, residual_ranks=world + 1)  # what a resume on another number of ranks sees
    no_piece = {k: v for k, v in saved.items() if k != "residual"}  # a full checkpoint's state: no rank's piece
    for key, state, dtype in (("other_world", other_world, "float32"), ("no_piece", no_piece, "float32"),
                              ("float_into_int8", saved, "int8"), ("int8_into_float", saves["int8"], "float32")):
        third = LoCoReduceScatter(_codec(spec), beta=beta, residual_dtype=dtype)
        third.setup(group, Topology(1))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            third.load_state_dict(state)
            third.reduce_scatter(torch.empty(N), _grad(info.rank, 0, world), dist.ReduceOp.SUM, SEED)
        out[f"{key}_warnings"] = [str(w.message) for w in caught if issubclass(w.category, LoCoResidualWarning)]
        out[f"{key}_starts_at_zero"] = torch.equal(_values(third.residual), fresh[dtype])
    wrong = LoCoReduceScatter(_codec(spec), beta=beta)
    wrong.setup(group, Topology(1))
    try:
        wrong.load_state_dict(dict(saved, residual=torch.zeros(2, saved["residual_numel"])))
    except ValueError as err:
        out["wrong_piece"] = str(err)

    # reset_every counts optimizer steps
    for dtype in ("float32", "int8"):
        resetting = LoCoReduceScatter(_codec(spec), beta=beta, reset_every=2, residual_dtype=dtype)
        resetting.setup(group, Topology(1))
        resetting.reduce_scatter(torch.empty(N), _grad(info.rank, 0, world), dist.ReduceOp.SUM, SEED)
        resetting.on_optimizer_step()
        out[f"kept_after_one_{dtype}"] = bool(_values(resetting.residual).any())
        resetting.on_optimizer_step()
        out[f"zero_after_two_{dtype}"] = not _values(resetting.residual).any()

    # a NaN gradient: the output stays non-finite, the (int8-coded) residual does not
    g = _grad(info.rank, 0, world)
    g[3] = float("nan")
    o = torch.empty(N)
    first.reduce_scatter(o, g, dist.ReduceOp.SUM, SEED)
    out["nan_output"] = bool(torch.isnan(o).any()) if info.rank == 0 else None
    out["residual_finite"] = bool(torch.isfinite(_values(first.residual)).all())

    # another gradient layout (FSDP reduce-scatters only the parameters with gradients: some were frozen or
    # unfrozen) restarts the residual from zero: each call computes what a fresh scheme computes for its input
    for dtype in ("float32", "int8"):
        layouts = LoCoReduceScatter(_codec(spec), beta=beta, residual_dtype=dtype)
        layouts.setup(group, Topology(1))
        for call, n in enumerate((N, N, N + 5, N + 5, N)):
            g = torch.randn(world * n, generator=torch.Generator().manual_seed(77 * call + info.rank))
            fresh_scheme = LoCoReduceScatter(_codec(spec), beta=beta, residual_dtype=dtype)
            fresh_scheme.setup(group, Topology(1))
            a, b = torch.empty(n), torch.empty(n)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                layouts.reduce_scatter(a, g.clone(), dist.ReduceOp.SUM, SEED + call)
            fresh_scheme.reduce_scatter(b, g.clone(), dist.ReduceOp.SUM, SEED + call)
            out[f"layout_{dtype}_{call}"] = {
                "warnings": [str(w.message) for w in caught if issubclass(w.category, LoCoResidualWarning)],
                "as_fresh": torch.equal(a, b)
                and torch.equal(_values(layouts.residual), _values(fresh_scheme.residual)),
            }
    return out


@pytest.fixture(scope="module", params=[2, 3, pytest.param(4, marks=pytest.mark.slow)], ids=lambda w: f"w{w}")
def results(request):
    return request.param, run_ranks(_rank_side, request.param)


@pytest.mark.parametrize("case", list(CASES))
def test_loco_matches_a_float64_simulation_of_every_rank(results, case):
    world, outs = results
    spec, beta, dtype = CASES[case]
    expected, residuals = _reference(world, _codec(spec), beta, dtype)
    for rank, out in enumerate(outs):
        got = out[case]
        for call in range(CALLS):
            torch.testing.assert_close(got["outputs"][call].double(), expected[call][rank], rtol=1e-5, atol=1e-5)
        tol = {"float32": 1e-5, "bfloat16": 1e-2, "int8": float(residuals[rank].abs().max()) / 127}[dtype]
        torch.testing.assert_close(got["residual"].double(), residuals[rank], rtol=tol, atol=tol)
        per_rank = {"float32": 4 * world * N, "bfloat16": 2 * world * N,
                    "int8": world * SymmetricCodec(8, spec[2]).wire_bytes(N)}[dtype]
        assert got["memory"] == per_rank
        assert f"beta {beta:g}" in got["describe"] and dtype in got["describe"]


def test_classic_error_feedback_telescopes(results):
    """beta = 0: sum over calls of the AVG outputs = mean over ranks of (sum of gradients - final residual)."""
    world, outs = results
    final = torch.stack([out["classic"]["residual"].double() for out in outs])  # [W, W * N]
    grads = sum(torch.stack([_grad(r, c, world).double() for r in range(world)]) for c in range(CALLS))
    expected = ((grads - final).sum(0) / world).view(world, N)
    for rank, out in enumerate(outs):
        got = sum(o.double() for o in out["classic"]["outputs"])
        torch.testing.assert_close(got, expected[rank], rtol=1e-5, atol=1e-5)
    assert final.abs().max() > 0  # there was an error to feed back


def test_loco_state_resets_nan_and_misuse(results):
    world, outs = results
    for rank, out in enumerate(outs):
        wire_bytes = world * SymmetricCodec(8, 16).wire_bytes(N)
        for dtype, numel in (("float32", world * N), ("int8", wire_bytes)):
            assert out[f"resume_equal_{dtype}"] is True and out[f"resume_calls_{dtype}"] == 3 + (CALLS - 3)
            assert out[f"save_collectives_{dtype}"] == []  # each rank's piece is its own: saving communicates nothing
            assert out[f"piece_{dtype}"] == ("DTensor", (world, numel), (1, numel), True)
        assert out["other_world_starts_at_zero"] and out["no_piece_starts_at_zero"]
        for key, saved, now in (("float_into_int8", "float32", "int8"), ("int8_into_float", "int8", "float32")):
            assert out[f"{key}_starts_at_zero"] and len(out[f"{key}_warnings"]) == 1
            assert f"saved as {saved} and this run stores them as {now}" in out[f"{key}_warnings"][0]
        assert len(out["other_world_warnings"]) == 1
        assert f"saved by {world + 1} ranks and this run has {world}" in out["other_world_warnings"][0]
        assert len(out["no_piece_warnings"]) == 1 and "piece was never loaded" in out["no_piece_warnings"][0]
        assert f"shape (2, {world * N}); this state needs (1, {world * N})" in out["wrong_piece"]
        assert all(out[f"kept_after_one_{d}"] and out[f"zero_after_two_{d}"] for d in ("float32", "int8"))
        assert out["residual_finite"]
    assert outs[0]["nan_output"] is True


def test_a_new_gradient_layout_restarts_the_residual_as_a_fresh_scheme(results):
    """Calls of N, N, N + 5, N + 5, N elements per chunk: the calls that change the size warn once each and compute
    what a fresh scheme computes (a zero residual of the new layout); the second call of a size carries feedback."""
    world, outs = results
    for out in outs:
        for dtype in ("float32", "int8"):
            calls = [out[f"layout_{dtype}_{call}"] for call in range(5)]
            assert [len(c["warnings"]) for c in calls] == [0, 0, 1, 0, 1]
            assert [c["as_fresh"] for c in calls] == [True, False, True, False, True]
            for call, held, now in ((2, N, N + 5), (4, N + 5, N)):
                said = f"holds {world * held} elements and this reduce-scatter feeds back {world * now}"
                assert said in calls[call]["warnings"][0]
            assert "parameters with gradients changed" in calls[2]["warnings"][0]


@pytest.mark.parametrize("options, match", [
    ({"beta": 1.0}, "beta=1.0 is invalid"),
    ({"beta": -0.1}, "beta=-0.1 is invalid"),
    ({"beta": True}, "beta=True is invalid"),
    ({"reset_every": -1}, "reset_every=-1"),
    ({"residual_dtype": "float16"}, "residual_dtype='float16' is not supported; allowed: float32, bfloat16"),
    ({"err_beta": 0.8}, "invalid option for the grad scheme 'loco'"),
])
def test_loco_rejects_bad_options(options, match):
    with pytest.raises(ValueError, match=match):
        make_grad_scheme("loco", make_codec("minmax", bits=2), **options)


def test_loco_needs_a_codec_and_a_fitting_residual():
    with pytest.raises(ValueError, match="needs a codec"):
        make_grad_scheme("loco", None)
    with pytest.raises(ValueError, match="grads scheme 'locco'.*did you mean|unknown grad scheme 'locco'"):
        from_preset("qwd-w4g4", grad_scheme="locco")
    config = from_preset("qwd-w4g4", grad_scheme="loco", grad_bits=2, grad_scheme_options={"beta": 0.5})
    scheme = build_scheme("grads", config.grads, 2)
    assert isinstance(scheme, LoCoReduceScatter) and scheme.beta == 0.5
    assert build_scheme("grads", config.grads, None).name == "flat"  # unquantized units keep the plain reduce-scatter


def _bad_residual(info: RankInfo) -> list[str]:
    codec, errors = make_codec("minmax", bits=2), []
    for residual, beta in ((torch.zeros(3), 0.0), (torch.zeros(2 * N, dtype=torch.float16), 0.0),
                           (torch.zeros(2 * N), 1.5)):
        try:
            quantized_reduce_scatter(torch.empty(N), torch.zeros(2 * N), codec, dist.group.WORLD, dist.ReduceOp.SUM,
                                     0, residual=residual, residual_beta=beta)
        except ValueError as err:
            errors.append(str(err))
    return errors


def test_collective_rejects_a_bad_residual():
    errors = run_ranks(_bad_residual, 2)[0]
    assert "contiguous tensor of 74 elements" in errors[0]
    assert "float32 or bfloat16" in errors[1]
    assert "residual_beta=1.5 is invalid" in errors[2]


# ------------------------------------------------------------------------------------- FSDP2, accumulation, resume
def _fsdp2_resume(info: RankInfo, ckpt_dir: str, residual_dtype: str) -> dict:
    adapter = Adapter("fsdp2")
    config = from_preset("w8g8", bucket_size=64, seed=7, grad_bits=2, grad_scheme="loco",
                         grad_scheme_options={"beta": 0.5, "residual_dtype": residual_dtype})

    def fresh():
        model = adapter.shard(info)
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
        return model, opt, adapter.apply(model, config, optimizers=opt)

    model, opt, handle = fresh()
    _train(info, model, 3, opt, microbatches=2, grads=False)
    save_sharded(model, opt, handle, ckpt_dir)
    residuals = [_values(u.grads.residual) for u in handle.units if u.grads.name == "loco"]
    continued = _train(info, model, 3, opt, first_step=3, microbatches=2, grads=False)

    model, opt, handle = fresh()
    load_sharded(model, opt, handle, ckpt_dir)
    resumed = _train(info, model, 3, opt, first_step=3, microbatches=2, grads=False)
    return {"continued": continued["losses"], "resumed": resumed["losses"], "params": continued["params"],
            "params_resumed": resumed["params"], "residuals": len(residuals),
            "residual_numel": [r.numel() for r in residuals], "calls": handle.traffic().grads.calls}


@pytest.mark.parametrize("residual_dtype", ["float32", "int8"])
def test_fsdp2_uneven_accumulation_resume_is_exact(tmp_path, residual_dtype):
    outs = run_ranks(_fsdp2_resume, 2, os.fspath(tmp_path), residual_dtype)
    for out in outs:
        assert out["residuals"] >= 3  # every layer (the 67-row one included) feeds its errors back
        assert out["resumed"] == out["continued"]
        for name, p in out["params"].items():
            assert torch.equal(p, out["params_resumed"][name]), name
