"""The difference scheme with ``sharded_reference`` (ZeRO++ hpZ's secondary copy for qWD's reference) on real gloo
groups, against the replicated reference of today's scheme, bit for bit: 4 ranks as 2 virtual nodes x 2, and 2 ranks
as one node of 2 and as 2 nodes of 1.

* Every gather (keyframes: the first, ``keyframe_every``, after ``on_weights_changed``; updates; the gathers the
  replicated reference serves locally; fp32 and bf16; FSDP2's in-place input) gives the replicated scheme's output,
  and the sampled quantization errors are the same.
* Memory: the reference is ``1 / g`` of the replicated one (``g`` ranks per node); with one rank per node it is the
  whole unit and the scheme is the replicated one, byte counts included.
* Bytes per hop of each call: the codes (or, at a keyframe, the shards) to the ``N - 1`` same-index ranks of the other
  nodes, the reference slices to the node's ``g - 1`` others in the gather dtype; nothing across nodes for the
  gathers the replicated reference serves locally; on one node a warning and nothing across nodes.
* Checkpoints: the state dict is the replicated scheme's, value for value; a state of either variant resumes the
  other, continuing exactly as the uninterrupted run on the same ranks, and on 2 ranks (one node of 2, two nodes of
  1) from a 4-rank state (a padded parameter whose shards differ between the world sizes).
* Misuse: a non-bool option is a ValueError naming it.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist
from difference_unit import EDIT_AT, P, Padded, walk_weights
from dist_spawn import RankInfo, run_ranks

from composer_qsdp.comm import Topology
from composer_qsdp.quant import make_codec
from composer_qsdp.schemes import DifferenceAllGather, ShardedReferenceWarning, make_weight_scheme

STEPS = 10
SAVE_AT = 6  # the state is saved after this many steps
GATHERS = 3  # per step: the forward's, the backward re-gather, an evaluation's
KEYFRAME_EVERY = 4
CODEC = dict(name="symmetric", bits=4, bucket_size=64)
DTYPES = (torch.float32, torch.bfloat16)


def _codec():
    options = dict(CODEC)
    return make_codec(options.pop("name"), **options)


def _scheme(info: RankInfo, per_node: int, sharded: bool, error_sample_interval: int = 2) -> DifferenceAllGather:
    scheme = make_weight_scheme("difference", _codec(), error_sample_interval, keyframe_every=KEYFRAME_EVERY,
                                sharded_reference=sharded)
    scheme.setup(dist.group.WORLD, Topology(per_node), Padded(info.world_size))
    return scheme


def _steps(info: RankInfo, scheme: DifferenceAllGather, dtype: torch.dtype, first: int, last: int,
           step_first: bool = True) -> dict:
    """Gathers of steps ``[first, last)``: each call's output, bytes (sent, inter-node), served locally, and
    each step's sampled error; ``step_first=False``: no optimizer step before ``first``'s gathers (they are the
    re-gathers of a step whose first gather ran before a checkpoint)."""
    world, rank = info.world_size, info.rank
    n = -(-P // world)
    outputs, calls, errors = [], [], []
    for step in range(first, last):
        if step and (step_first or step > first):
            scheme.on_optimizer_step()
        if step == EDIT_AT:
            scheme.on_weights_changed()
        full = walk_weights(step, world, dtype)
        for call in range(GATHERS):
            out = torch.full((world * n,), float("nan"), dtype=dtype)
            if call == 0:  # FSDP2 gathers in place: the input aliases this rank's slot
                out[rank * n:(rank + 1) * n] = full[rank * n:(rank + 1) * n]
                shard = out[rank * n:(rank + 1) * n]
            else:
                shard = full[rank * n:(rank + 1) * n].clone()
            before = (scheme.traffic.sent, scheme.traffic.inter_node, scheme.traffic.served_locally)
            scheme.all_gather(out, shard, seed=100 + step)
            t = scheme.traffic
            calls.append((t.sent - before[0], t.inter_node - before[1], t.served_locally - before[2]))
            outputs.append(out)
        errors.append(scheme.take_error())
    return {"outputs": outputs, "calls": calls, "errors": errors}


def _compare(a: dict, b: dict) -> dict:
    return {"outputs": all(torch.equal(x, y) for x, y in zip(a["outputs"], b["outputs"], strict=True)),
            "errors": all((x is None and y is None) or torch.equal(x, y)
                          for x, y in zip(a["errors"], b["errors"], strict=True))}


def _layouts(info: RankInfo, per_node: int, saved: dict | None) -> dict:
    """One layout: both variants over all steps (and their states at SAVE_AT, resumed both ways)."""
    out = {}
    for dtype in DTYPES:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sharded, replicated = _scheme(info, per_node, True), _scheme(info, per_node, False)
        res = {"warnings": [str(w.message) for w in caught if w.category is ShardedReferenceWarning],
               "describe": sharded.describe()}
        first_s, first_r = _steps(info, sharded, dtype, 0, SAVE_AT), _steps(info, replicated, dtype, 0, SAVE_AT)
        res["memory"] = (sharded.memory_bytes(), replicated.memory_bytes())
        states = {"sharded": sharded.state_dict(), "replicated": replicated.state_dict()}
        res["states"] = states
        rest_s, rest_r = _steps(info, sharded, dtype, SAVE_AT, STEPS), _steps(info, replicated, dtype, SAVE_AT, STEPS)
        whole_s = {k: first_s[k] + rest_s[k] for k in first_s}
        whole_r = {k: first_r[k] + rest_r[k] for k in first_r}
        res["same"] = _compare(whole_s, whole_r)
        res["calls"] = {"sharded": whole_s["calls"], "replicated": whole_r["calls"]}
        res["keyframes"] = (sharded.keyframes, replicated.keyframes)
        # Resume each variant from each variant's state: the uninterrupted run's gathers, exactly.
        res["resumed"] = {}
        for source, state in states.items():
            for target in ("sharded", "replicated"):
                scheme = _scheme(info, per_node, target == "sharded")
                scheme.load_state_dict(state)
                resumed = _steps(info, scheme, dtype, SAVE_AT, STEPS)
                res["resumed"][source, target] = _compare(resumed, rest_r)["outputs"]
        # A state saved on another world size (4 ranks): both variants continue alike from the saved reference.
        if saved is not None:
            continued = {}
            for target in ("sharded", "replicated"):
                scheme = _scheme(info, per_node, target == "sharded")
                scheme.load_state_dict(saved[dtype])
                # the saved step's re-gathers first (no optimizer step yet), then the next steps
                continued[target] = _steps(info, scheme, dtype, SAVE_AT - 1, STEPS, step_first=False)
            first_out = continued["sharded"]["outputs"][0]
            res["other_world"] = {
                "same": _compare(continued["sharded"], continued["replicated"])["outputs"],
                "restored": torch.equal(first_out[:P], saved[dtype]["reference"]["w"].to(dtype))
                and bool((first_out[P:] == 0).all()),
                "calls": continued["sharded"]["calls"][:GATHERS],
            }
        out[dtype] = res
    return out


def _four_ranks(info: RankInfo) -> dict:
    return _layouts(info, 2, None)


def _two_ranks(info: RankInfo, saved: dict) -> dict:
    return {per_node: _layouts(info, per_node, saved) for per_node in (2, 1)}


@pytest.fixture(scope="module")
def four():
    return run_ranks(_four_ranks, 4)


@pytest.fixture(scope="module")
def two(four):
    saved = {dtype: four[0][dtype]["states"]["sharded"] for dtype in DTYPES}
    return run_ranks(_two_ranks, 2, saved)


def _layout_results(four, two):
    """(nodes, per node, per-rank results) of each layout."""
    return [(2, 2, four), (1, 2, [r[2] for r in two]), (2, 1, [r[1] for r in two])]


def test_every_gather_equals_the_replicated_reference_bit_for_bit(four, two):
    for nodes, per_node, results in _layout_results(four, two):
        for rank, res in enumerate(results):
            for dtype in DTYPES:
                assert res[dtype]["same"] == {"outputs": True, "errors": True}, (nodes, per_node, rank, dtype)
                # keyframes at steps 0, 4 (keyframe_every) and 7 (the edit)
                assert res[dtype]["keyframes"] == (3, 3)
        outputs = [r[torch.float32]["states"]["sharded"]["reference"]["w"] for r in results]
        assert all(torch.equal(o, outputs[0]) for o in outputs)  # one reference on every rank


def test_the_reference_is_one_over_g_of_the_replicated_one(four, two):
    for nodes, per_node, results in _layout_results(four, two):
        world = nodes * per_node
        for res in results:
            for dtype in DTYPES:
                sharded, replicated = res[dtype]["memory"]
                assert replicated == world * -(-P // world) * dtype.itemsize
                assert sharded * per_node == replicated, (nodes, per_node)


def _expected_calls(nodes: int, per_node: int, dtype: torch.dtype) -> list[tuple[int, int, int]]:
    """(sent, inter-node, served locally) of every call of the sharded scheme."""
    world = nodes * per_node
    n = -(-P // world)
    e, codes = dtype.itemsize, _codec().wire_bytes(n)
    spread = (per_node - 1) * nodes * n * e  # the node's other ranks' slices, within the node
    calls = []
    for step in range(STEPS):
        keyframe = step in (0, KEYFRAME_EVERY, EDIT_AT)
        first = (nodes - 1) * (n * e if keyframe else codes)  # to the same-index rank of every other node
        calls.append((first + spread, first, 0))
        later = (spread, 0, 0) if per_node > 1 else (0, 0, 1)  # one rank per node: the replicated scheme's
        calls += [later] * (GATHERS - 1)
    return calls


def test_bytes_per_hop(four, two):
    for nodes, per_node, results in _layout_results(four, two):
        for res in results:
            for dtype in DTYPES:
                calls = res[dtype]["calls"]
                assert calls["sharded"] == _expected_calls(nodes, per_node, dtype), (nodes, per_node, dtype)
                if per_node == 1:  # one rank per node: the replicated scheme, its byte counts included
                    assert calls["sharded"] == calls["replicated"]
                else:  # fewer codes cross nodes than with the replicated reference: one rank per node gets them
                    inter = [sum(c[1] for c in calls[k]) for k in ("sharded", "replicated")]
                    assert inter[0] * per_node == inter[1] or nodes == 1


def test_one_node_warns_and_one_rank_per_node_does_not(four, two):
    for nodes, per_node, results in _layout_results(four, two):
        res = results[0][torch.float32]
        if nodes == 1:
            (message,) = set(res["warnings"])
            assert "one node of 2 ranks" in message and "weight codec saves no bytes" in message
        else:
            assert res["warnings"] == []
        assert f"reference sharded within the node on {nodes} nodes x {per_node}" in res["describe"]


def test_checkpoints_are_interchangeable_and_resume_exactly(four, two):
    for nodes, per_node, results in _layout_results(four, two):
        for res in results:
            for dtype in DTYPES:
                states = res[dtype]["states"]
                sharded, replicated = states["sharded"], states["replicated"]
                assert sharded.keys() == replicated.keys() and sharded["reference_valid"]
                for key in sharded:  # the same format and values (bytes sent apart): either variant's state is the
                    if key not in ("reference", "traffic"):  # other's
                        assert sharded[key] == replicated[key], key
                assert torch.equal(sharded["reference"]["w"], replicated["reference"]["w"])
                assert all(res[dtype]["resumed"].values()), res[dtype]["resumed"]


def test_a_four_rank_state_resumes_on_two_ranks_in_both_layouts(two):
    for per_node in (2, 1):
        for rank, res in enumerate(r[per_node] for r in two):
            for dtype in DTYPES:
                other = res[dtype]["other_world"]
                assert other["same"] and other["restored"], (per_node, rank, dtype)
                # the restored reference is current: the first step's gathers only spread it within the node
                n = -(-P // 2)
                spread = (0, 0, 1) if per_node == 1 else ((per_node - 1) * n * dtype.itemsize, 0, 0)
                assert other["calls"] == [spread] * GATHERS


def test_a_non_bool_option_is_a_clear_error():
    with pytest.raises(ValueError, match="sharded_reference='yes' is invalid; it must be True or False"):
        DifferenceAllGather(_codec(), sharded_reference="yes")
