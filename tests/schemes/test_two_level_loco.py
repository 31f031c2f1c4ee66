"""The two_level_loco gradient scheme (LoCo's error feedback on the inter-node hop of the two-level reduce-scatter)
on real gloo groups: 4 ranks as 2 virtual nodes x 2, and the same ranks as one node and as 4 nodes of one rank.

* Against an exact reference: a single-process float64 simulation of both hops over several calls (two per
  optimizer step), the intra hop with its codec and no feedback, the inter hop with LoCo's recursion on each rank's
  partial sums ``c = p + e; send encode(c); e <- beta e + (1 - beta)(c - decode(encode(c)))`` (same codecs, same
  noise keys), the residual rounded to the scheme's storage after every call: the outputs and the final residuals
  match; with beta 0, 0.5 and 0.8, fp32, bf16 and int8-coded residuals, nearest and stochastic rounding, an intra hop
  of 8 bits, of the side's codec and unquantized, with and without a Hadamard rotation, SUM and AVG.
* Size: the residual is ``W * n / L`` elements per rank (``M`` rows of ``n``), ``memory_bytes`` its storage; on one
  node there is none (0 bytes, and the output is ``two_level``'s bit for bit); with one rank per node the one hop is
  the inter-node one and the scheme is ``loco`` bit for bit (its ``W * n`` residual included). The sampled
  quantization error is the reference's (over the chunks and the compensated partial sums a rank encoded) and
  sampling it changes no output and no residual.
* Its state survives a save -> load into a new scheme bit for bit (fp32 and int8), each rank's piece its own
  ``Shard(0)`` DTensor; a state of another world size, of another split into nodes (a real one: the same ranks as 4
  nodes) or of another rotation block restarts the residual from zero with one ``LoCoResidualWarning`` naming why.
* Misuse: bad options are ValueErrors naming the value and what is allowed; the collective refuses a residual on
  one node and a bad ``inter_beta``.
* On an FSDP2 model with an uneven layer, 2 virtual nodes x 2, with gradient accumulation: every unit keeps a
  residual of ``P / L`` elements (``P``: its padded gradient), ``memory_bytes`` adds them up, and a
  ``torch.distributed.checkpoint`` resume continues exactly as the uninterrupted run.
"""

from __future__ import annotations

import math
import os
import warnings

import pytest
import torch
import torch.distributed as dist
from dist_spawn import RankInfo, run_ranks
from sharded_mlp import LR, Adapter, _train, load_sharded, save_sharded

from composer_qsdp.comm import Topology, mix_seed, node_groups, two_level_reduce_scatter
from composer_qsdp.comm.two_level import INTER_HOP
from composer_qsdp.config import TwoLevelLoCoOptions, from_preset
from composer_qsdp.quant import CodedResidual, MinMaxCodec, SymmetricCodec, hadamard_rows, make_codec
from composer_qsdp.registry import GRAD_SCHEMES
from composer_qsdp.schemes import (GradScheme, LoCoResidualWarning, TwoLevelLoCoReduceScatter, build_scheme,
                                   make_grad_scheme)
from composer_qsdp.schemes.two_level_loco import INTRA_CODEC

WORLD, PER_NODE = 4, 2
NODES = WORLD // PER_NODE
N = 37  # elements per rank's chunk: no bucket or rotation block divides it
CALLS, PER_STEP = 6, 2  # reduce-scatter calls, and calls per optimizer step
SEED = 11
OPS = {"SUM": dist.ReduceOp.SUM, "AVG": dist.ReduceOp.AVG}
# name: (side codec, intra codec option, rotation block, beta, residual dtype, op); codecs: (name, bits, bucket,
# rounding or None)
CASES = {
    "tlq_like": (("minmax", 2, 16, "nearest"), ("symmetric", 8, 16, None), None, 0.8, "float32", "AVG"),
    "classic_unquantized_intra": (("symmetric", 3, 8, None), None, None, 0.0, "float32", "SUM"),
    "int8_residual": (("minmax", 2, 16, "nearest"), ("symmetric", 8, 16, None), None, 0.5, "int8", "AVG"),
    "stochastic_rotated": (("minmax", 2, 16, "stochastic"), "same", 16, 0.5, "float32", "SUM"),
    # nearest rounding: a bf16 residual differs from the fp64 one by its rounding, which could flip a stochastic draw
    "bf16_residual": (("minmax", 3, 16, "nearest"), ("minmax", 8, 16, "stochastic"), 16, 0.8, "bfloat16", "AVG"),
}
RESUME = CASES["int8_residual"][:3]  # codecs and rotation of the resume checks


def _codec(spec):
    name, bits, bucket, rounding = spec
    return make_codec(name, bits=bits, bucket_size=bucket, **({} if rounding is None else {"rounding": rounding}))


def _intra_option(spec):
    """The scheme's ``intra_codec`` option for a case's spec."""
    if spec is None or spec == "same":
        return spec
    name, bits, bucket, _ = spec
    return {"name": name, "bits": bits, "bucket_size": bucket}


def _scheme(case: str, topology: Topology, error_sample_interval: int = 0, **changes) -> TwoLevelLoCoReduceScatter:
    side, intra, block, beta, dtype, _ = CASES[case]
    options = {"intra_codec": _intra_option(intra), "rotation_block": block, "beta": beta, "residual_dtype": dtype}
    scheme = make_grad_scheme("two_level_loco", _codec(side), error_sample_interval, **{**options, **changes})
    scheme.setup(dist.group.WORLD, topology)
    return scheme


def _grad(rank: int, call: int) -> torch.Tensor:
    return torch.randn(WORLD * N, generator=torch.Generator().manual_seed(1000 * call + rank))


def _values(residual: torch.Tensor | CodedResidual) -> torch.Tensor:
    """A residual's values as a new 1-D float tensor, whatever its storage."""
    return residual.decode().reshape(-1) if isinstance(residual, CodedResidual) else residual.float().clone()


def _stored(residual: torch.Tensor, dtype: str, bucket: int) -> torch.Tensor:
    """float64 ``[rows, m]`` ``residual`` as the scheme stores it between calls, read back as float64."""
    if dtype != "int8":
        return residual.to(getattr(torch, dtype)).double()
    storage = SymmetricCodec(8, bucket)
    return storage.decode_rows(storage.encode_rows(residual.float()), residual.shape[1]).double()


# ---------------------------------------------------------------------------------------------- reference
def _reference(case: str, nodes: int, per_node: int, errors: list[float] | None = None,
               ) -> tuple[list[list[torch.Tensor]], list[torch.Tensor]]:
    """float64 simulation of every rank (group rank ``g = a * per_node + l`` at node ``a``, local ``l``): the
    outputs of each call (``[call][g]``, ``N`` elements) and each rank's final residual (``[nodes, m]``).
    ``errors``, a list, receives each rank's relative error of the last call over what it encoded on both hops (its
    chunks on the intra hop, its compensated partial sums on the inter hop)."""
    side_spec, intra_spec, block, beta, dtype, op = CASES[case]
    side = _codec(side_spec)
    intra = side if intra_spec == "same" else None if intra_spec is None else _codec(intra_spec)
    two_hops = per_node > 1
    m = N if block is None else -(-N // block) * block
    residuals = [torch.zeros(nodes, m, dtype=torch.float64) for _ in range(WORLD)]
    outputs = []
    for call in range(CALLS):
        seed = SEED + call
        rows = [_grad(g, call).view(WORLD, N) for g in range(WORLD)]
        if block is not None:
            rows = [hadamard_rows(r, block, m, torch.float32) for r in rows]
        decoded = rows
        if two_hops and intra is not None:  # hop 1's decoded chunks; with one rank per node there is no hop 1
            decoded = [intra.decode_rows(intra.encode_rows(r, seed=mix_seed(seed, g)), m) for g, r in enumerate(rows)]
        sent = []  # [g]: the decoded [nodes, m] that rank g sent on the inter-node hop
        for g in range(WORLD):
            a, l = divmod(g, per_node)
            # row b: node a's sum of chunk (b, l), the chunk this rank forwards to node b
            partial = torch.stack([sum(decoded[a * per_node + s][b * per_node + l].double() for s in range(per_node))
                                   for b in range(nodes)])  # fmt: skip
            c = partial + residuals[g]
            key = mix_seed(seed, g, INTER_HOP) if two_hops else mix_seed(seed, g)
            q = side.decode_rows(side.encode_rows(c.float(), seed=key), m).double()
            residuals[g] = _stored(beta * residuals[g] + (1 - beta) * (c - q), dtype, side.bucket_size)
            sent.append(q)
            if errors is not None and call == CALLS - 1:
                exact = torch.cat([rows[g].double().flatten(), c.flatten()])
                got = torch.cat([decoded[g].double().flatten(), q.flatten()])
                errors.append(float((got - exact).norm() / exact.norm()))
        call_out = []
        for g in range(WORLD):
            b, l = divmod(g, per_node)
            total = sum(sent[a * per_node + l][b] for a in range(nodes))
            total = total / WORLD if op == "AVG" else total
            if block is not None:
                total = hadamard_rows(total.view(1, -1), block, N, torch.float64)[0]
            call_out.append(total)
        outputs.append(call_out)
    return outputs, residuals


# ---------------------------------------------------------------------------------------------- rank side
def _calls(scheme: GradScheme, rank: int, op: str, first: int = 0, last: int = CALLS) -> list[torch.Tensor]:
    outputs = []
    for call in range(first, last):
        o = torch.empty(N)
        scheme.reduce_scatter(o, _grad(rank, call), OPS[op], SEED + call, dist.group.WORLD)
        outputs.append(o)
        if (call + 1) % PER_STEP == 0:
            scheme.on_optimizer_step()
    return outputs


def _rank_side(info: RankInfo) -> dict:
    rank, out = info.rank, {}
    two_level = Topology(PER_NODE)
    for case in CASES:
        scheme = _scheme(case, two_level)
        out[case] = {"outputs": _calls(scheme, rank, CASES[case][5]), "residual": _values(scheme.residual),
                     "rows": getattr(scheme.residual, "rows", None), "memory": scheme.memory_bytes(),
                     "describe": scheme.describe()}

    # sampling the quantization error (of the compensated partial sums on the inter hop) changes nothing
    sampled = _scheme("tlq_like", two_level, error_sample_interval=1)
    outputs = _calls(sampled, rank, "AVG")
    out["sampled"] = {"equal": all(torch.equal(a, b) for a, b in zip(outputs, out["tlq_like"]["outputs"]))
                      and torch.equal(_values(sampled.residual), out["tlq_like"]["residual"]),
                      "error": sampled.take_error()}

    # one node: no inter-node hop, no residual, the two_level scheme's output bit for bit
    one_node = _scheme("tlq_like", Topology(WORLD))
    plain = make_grad_scheme("two_level", _codec(CASES["tlq_like"][0]),
                             intra_codec=_intra_option(CASES["tlq_like"][1]))
    plain.setup(dist.group.WORLD, Topology(WORLD))
    ours, theirs = _calls(one_node, rank, "AVG"), _calls(plain, rank, "AVG")
    out["one_node"] = {"equal": all(torch.equal(a, b) for a, b in zip(ours, theirs)), "residual": one_node.residual,
                       "memory": one_node.memory_bytes(), "state": one_node.state_dict(),
                       "describe": one_node.describe()}

    # one rank per node: the single hop crosses nodes and the scheme is loco's, residual included
    per_rank = _scheme("tlq_like", Topology(1))
    side, _, _, beta, dtype, _ = CASES["tlq_like"]
    loco = make_grad_scheme("loco", _codec(side), beta=beta, residual_dtype=dtype)
    loco.setup(dist.group.WORLD, Topology(1))
    ours, theirs = _calls(per_rank, rank, "AVG"), _calls(loco, rank, "AVG")
    out["one_rank_per_node"] = {"equal": all(torch.equal(a, b) for a, b in zip(ours, theirs)),
                                "residual_equal": torch.equal(per_rank.residual, loco.residual),
                                "memory": per_rank.memory_bytes()}

    # save after 3 calls -> a new scheme continues exactly as the first one does
    for dtype in ("float32", "int8"):
        first = _scheme("int8_residual", two_level, residual_dtype=dtype)
        _calls(first, rank, "AVG", 0, 3)
        saved = first.state_dict()
        piece, storage = saved["residual"], getattr(first.residual, "wire", first.residual)
        out[f"piece_{dtype}"] = (type(piece).__name__, tuple(piece.shape), tuple(piece.to_local().shape),
                                 torch.equal(piece.to_local().view(storage.shape), storage),
                                 saved["residual_ranks"], saved["residual_nodes"])
        second = _scheme("int8_residual", two_level, residual_dtype=dtype)
        second.load_state_dict(saved)
        a, b = _calls(first, rank, "AVG", 3, CALLS), _calls(second, rank, "AVG", 3, CALLS)
        out[f"resume_equal_{dtype}"] = (all(torch.equal(x, y) for x, y in zip(a, b))
                                        and torch.equal(_values(first.residual), _values(second.residual)))
        if dtype == "int8":
            out["saved"] = saved

    # resumes that restart from zero: another world size, another split of the same ranks, another rotation block
    saved = out.pop("saved")
    zero_after_one = _values(_run_one(_scheme("int8_residual", two_level), rank))
    restarts = {
        "other_world": (_scheme("int8_residual", two_level), dict(saved, residual_ranks=WORLD + 2)),
        "other_nodes": (_scheme("int8_residual", Topology(1)), saved),
        "other_rotation": (_scheme("int8_residual", two_level, rotation_block=16), saved),
    }
    for key, (scheme, state) in restarts.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            scheme.load_state_dict(state)
            _run_one(scheme, rank)
        out[f"{key}_warnings"] = [str(w.message) for w in caught if issubclass(w.category, LoCoResidualWarning)]
        fresh = _run_one(_scheme("int8_residual", scheme.topology, rotation_block=scheme.rotation_block), rank)
        out[f"{key}_starts_at_zero"] = torch.equal(_values(scheme.residual), _values(fresh))
    out["same_partition_restores"] = not torch.equal(_values(_restored_residual(saved, rank)), zero_after_one)

    # the collective's own checks
    split = node_groups(Topology(WORLD), dist.group.WORLD)
    errors = {}
    for key, call in {
        "one_node": lambda: two_level_reduce_scatter(
            torch.empty(N), _grad(rank, 0), None, _codec(CASES["tlq_like"][0]), dist.group.WORLD, split,
            dist.ReduceOp.SUM, SEED, inter_residual=torch.zeros(N)),
        "beta": lambda: two_level_reduce_scatter(
            torch.empty(N), _grad(rank, 0), None, _codec(CASES["tlq_like"][0]), dist.group.WORLD,
            node_groups(two_level, dist.group.WORLD), dist.ReduceOp.SUM, SEED, inter_residual=torch.zeros(NODES * N),
            inter_beta=1.0),
    }.items():
        try:
            call()
        except ValueError as err:
            errors[key] = str(err)
    out["errors"] = errors
    return out


def _run_one(scheme: TwoLevelLoCoReduceScatter, rank: int) -> torch.Tensor | CodedResidual:
    """The scheme's residual after call 0."""
    _calls(scheme, rank, "AVG", 0, 1)
    return scheme.residual


def _restored_residual(state: dict, rank: int) -> torch.Tensor | CodedResidual:
    """The residual of a scheme that loaded ``state`` (same partition) and ran call 0."""
    scheme = _scheme("int8_residual", Topology(PER_NODE))
    scheme.load_state_dict(state)
    return _run_one(scheme, rank)


@pytest.fixture(scope="module")
def results():
    return run_ranks(_rank_side, WORLD)


# ---------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("case", list(CASES))
def test_matches_a_float64_simulation_of_both_hops(results, case):
    expected, residuals = _reference(case, NODES, PER_NODE)
    dtype = CASES[case][4]
    for rank, out in enumerate(results):
        got = out[case]
        for call in range(CALLS):
            torch.testing.assert_close(got["outputs"][call].double(), expected[call][rank], rtol=1e-5, atol=1e-5,
                                       msg=f"{case}, rank {rank}, call {call}")  # fmt: skip
        # int8: a value the reference's fp64 puts on the other side of a rounding boundary moves one int8 step
        tol = {"float32": 1e-5, "bfloat16": 1e-2, "int8": float(residuals[rank].abs().max()) / 127}[dtype]
        torch.testing.assert_close(got["residual"].double(), residuals[rank].reshape(-1), rtol=tol, atol=tol)
        assert residuals[rank].abs().max() > 0  # there was an error to feed back
        assert "on the inter-node hop" in got["describe"] and f"beta {CASES[case][3]:g}" in got["describe"]


def test_sampled_error_covers_the_compensated_inter_hop_and_changes_nothing(results):
    expected: list[float] = []
    _reference("tlq_like", NODES, PER_NODE, errors=expected)
    for rank, out in enumerate(results):
        assert out["sampled"]["equal"]
        assert float(out["sampled"]["error"]) == pytest.approx(expected[rank], rel=1e-4)


def test_residual_is_one_node_share_of_the_gradient(results):
    for out in results:
        for case, (side, _, block, _, dtype, _) in CASES.items():
            m = N if block is None else -(-N // block) * block
            assert out[case]["residual"].numel() == NODES * m
            if block is None:
                assert NODES * m == WORLD * N // PER_NODE  # W n / L
            per_rank = {"float32": 4 * NODES * m, "bfloat16": 2 * NODES * m,
                        "int8": NODES * SymmetricCodec(8, side[2]).wire_bytes(m)}[dtype]
            assert out[case]["memory"] == per_rank
            assert out[case]["rows"] in (None, NODES)
        one_node = out["one_node"]
        assert one_node["equal"] and one_node["residual"] is None and one_node["memory"] == 0
        assert one_node["state"]["residual_numel"] == 0 and "residual" not in one_node["state"]
        assert "no error feedback (one node" in one_node["describe"]
        per_rank = out["one_rank_per_node"]  # L = 1: loco, its W n residual included
        assert per_rank["equal"] and per_rank["residual_equal"] and per_rank["memory"] == 4 * WORLD * N


def test_state_round_trip_and_restarts(results):
    numel = NODES * N
    for out in results:
        for dtype, stored in (("float32", numel), ("int8", NODES * SymmetricCodec(8, 16).wire_bytes(N))):
            assert out[f"resume_equal_{dtype}"] is True
            assert out[f"piece_{dtype}"] == ("DTensor", (WORLD, stored), (1, stored), True, WORLD, NODES)
        assert out["same_partition_restores"]
        for key, why in (("other_world", f"saved by {WORLD + 2} ranks on {NODES} nodes and this run has {WORLD} "
                                         f"ranks on {NODES} nodes"),
                         ("other_nodes", f"saved by {WORLD} ranks on {NODES} nodes and this run has {WORLD} ranks on "
                                         f"{WORLD} nodes"),
                         ("other_rotation", f"holds {numel} elements and this reduce-scatter feeds back "
                                            f"{NODES * 48}")):  # fmt: skip
            assert len(out[f"{key}_warnings"]) == 1 and why in out[f"{key}_warnings"][0], key
            assert "two_level_loco gradient scheme" in out[f"{key}_warnings"][0]
            assert out[f"{key}_starts_at_zero"], key


def test_collective_refuses_misuse(results):
    for out in results:
        assert "one node, which has no inter-node hop" in out["errors"]["one_node"]
        assert "inter_beta=1.0 is invalid; allowed: a number in [0, 1)" in out["errors"]["beta"]


@pytest.mark.parametrize("options, match", [
    ({"beta": 1.0}, r"beta=1.0 is invalid for the two_level_loco gradient scheme; allowed: a number in \[0, 1\)"),
    ({"beta": True}, r"beta=True is invalid"),
    ({"reset_every": -1}, r"reset_every=-1"),
    ({"residual_dtype": "float16"}, r"residual_dtype='float16' is not supported; allowed: float32, bfloat16, int8"),
    ({"rotation_block": 48}, r"rotation_block=48 is invalid; allowed: a power of two"),
    ({"intra_codec": "symmetric"}, r"intra_codec='symmetric' is invalid; allowed: 'same'"),
    ({"err_beta": 0.8}, r"invalid option for the grad scheme 'two_level_loco'"),
])
def test_bad_options_are_value_errors(options, match):
    with pytest.raises(ValueError, match=match):
        make_grad_scheme("two_level_loco", make_codec("minmax", bits=2), **options)


def test_registered_with_typed_options():
    assert GRAD_SCHEMES.lookup("two_level_loco") is TwoLevelLoCoReduceScatter
    with pytest.raises(ValueError, match="two_level_loco gradient scheme feeds back quantization errors and needs a "
                                         "codec"):
        make_grad_scheme("two_level_loco", None)
    tlq_hs = {"intra_codec": {"name": "symmetric", "bits": 8, "bucket_size": 128}, "rotation_block": 32}
    config = from_preset("tlq-hs", grad_scheme="two_level_loco",
                         grad_scheme_options={**tlq_hs, "beta": 0.5, "residual_dtype": "int8"})
    assert config.grads.scheme_options == TwoLevelLoCoOptions(**tlq_hs, beta=0.5, residual_dtype="int8")
    scheme = build_scheme("grads", config.grads, 4)
    assert isinstance(scheme, TwoLevelLoCoReduceScatter) and (scheme.beta, scheme.rotation_block) == (0.5, 32)
    assert (scheme.intra_codec.bits, scheme.codec.bits, scheme.residual_dtype) == (8, 4, torch.int8)
    with pytest.raises(ValueError, match=r"beta=1.5 is invalid for the two_level_loco gradient scheme"):
        from_preset("tlq-hs", grad_scheme="two_level_loco", grad_scheme_options={"beta": 1.5})
    with pytest.raises(ValueError, match=r"unknown option 'betta' of scheme 'two_level_loco'.*did you mean 'beta'"):
        from_preset("tlq-hs", grad_scheme="two_level_loco", grad_scheme_options={"betta": 0.5})


def test_the_unfed_intra_node_hop_defaults_to_unbiased_8_bit_codes():
    """No residual corrects the intra-node hop, so by default it does not inherit a LoCo preset's 3-bit
    round-to-nearest codec: built directly or from the preset, it sends 8-bit stochastic min-max codes; ``"same"``
    still selects the side's codec on both hops."""
    side = make_codec("minmax", bits=3, bucket_size=256, rounding="nearest", hadamard=True)
    direct = TwoLevelLoCoReduceScatter(side)
    lean = build_scheme("grads", from_preset("qwd-w3g3-loco", grad_scheme="two_level_loco").grads, 3)
    for scheme in (direct, lean):
        intra = scheme.intra_codec
        assert isinstance(intra, MinMaxCodec) and (intra.bits, intra.bucket_size, intra.unbiased) == (8, 1024, True)
    assert lean.codec.bits == 3 and not lean.codec.unbiased
    assert TwoLevelLoCoReduceScatter(side, intra_codec="same").intra_codec is side
    assert TwoLevelLoCoOptions().intra_codec == dict(INTRA_CODEC)


# ------------------------------------------------------------------------------------- FSDP2, accumulation, resume
def _fsdp2_resume(info: RankInfo, ckpt_dir: str) -> dict:
    adapter = Adapter("fsdp2")
    config = from_preset("w8g8", bucket_size=64, seed=7, grad_bits=3, ranks_per_node=PER_NODE,
                         grad_scheme="two_level_loco",
                         grad_scheme_options={"intra_codec": {"name": "symmetric", "bits": 8, "bucket_size": 64},
                                              "beta": 0.5, "residual_dtype": "int8"})

    def fresh():
        model = adapter.shard(info)
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
        return model, opt, adapter.apply(model, config, optimizers=opt)

    model, opt, handle = fresh()
    _train(info, model, 3, opt, microbatches=2, grads=False)
    save_sharded(model, opt, handle, ckpt_dir)
    units = [u for u in handle.units if u.grads.residual is not None]
    # P: the unit's gradient as FSDP2 reduce-scatters it, every parameter's dim 0 padded to a multiple of W
    padded = [sum(-(-p.shape[0] // WORLD) * WORLD * math.prod(p.shape[1:]) for p in u.params) for u in units]
    sizes = {"residual_numel": [_values(u.grads.residual).numel() for u in units], "padded": padded,
             "rows": [u.grads.residual.rows for u in units], "memory": handle.memory_bytes(),
             "residual_bytes": sum(u.grads.residual.nbytes for u in units)}
    continued = _train(info, model, 3, opt, first_step=3, microbatches=2, grads=False)

    model, opt, handle = fresh()
    load_sharded(model, opt, handle, ckpt_dir)
    resumed = _train(info, model, 3, opt, first_step=3, microbatches=2, grads=False)
    return {**sizes, "continued": continued["losses"], "resumed": resumed["losses"], "params": continued["params"],
            "params_resumed": resumed["params"]}


def test_fsdp2_on_two_nodes_keeps_a_node_share_and_resumes_exactly(tmp_path):
    outs = run_ranks(_fsdp2_resume, WORLD, os.fspath(tmp_path))
    for out in outs:
        assert len(out["residual_numel"]) >= 3  # every layer (the 67-row one included) feeds its errors back
        assert out["residual_numel"] == [p // PER_NODE for p in out["padded"]]  # P / L
        assert out["rows"] == [NODES] * len(out["padded"])
        assert out["memory"] == out["residual_bytes"] > 0
        assert out["resumed"] == out["continued"]
        for name, p in out["params"].items():
            assert torch.equal(p, out["params_resumed"][name]), name
