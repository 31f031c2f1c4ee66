"""The scheme life cycle on real gloo groups: setup first and once, one group per scheme, results equal to the
collective core, bytes counted per hop, errors sampled at the configured interval, state round trips."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from dist_spawn import RankInfo, run_ranks

from composer_qsdp.comm import Topology, quantized_all_gather, quantized_reduce_scatter
from composer_qsdp.quant import make_codec
from composer_qsdp.schemes import make_grad_scheme, make_weight_scheme

N = 300  # elements per rank's chunk


def _rank_side(info: RankInfo) -> dict:
    codec = make_codec("minmax", bits=4, bucket_size=64)
    world = dist.group.WORLD
    out: dict = {}
    weights = make_weight_scheme("direct", codec, error_sample_interval=2)
    try:
        weights.all_gather(torch.empty(2 * N), torch.zeros(N), seed=1)
    except RuntimeError as err:
        out["before_setup"] = str(err)
    weights.setup(world, Topology(1))  # every rank its own node: all traffic is inter-node
    try:
        weights.setup(world, Topology(1))
    except RuntimeError as err:
        out["setup_twice"] = str(err)
    try:
        weights.all_gather(torch.empty(2 * N), torch.zeros(N), seed=1, group=dist.new_group([0, 1]))
    except RuntimeError as err:
        out["other_group"] = str(err)

    gen = torch.Generator().manual_seed(info.rank)
    shard = torch.randn(N, generator=gen)
    gathered, expected = torch.empty(2 * N), torch.empty(2 * N)
    errors = []
    for call in range(3):
        weights.all_gather(gathered, shard, seed=10 + call, group=world)
        errors.append(weights.take_error())
    quantized_all_gather(expected, shard, codec, world, seed=12)
    out["gather_equal"] = torch.equal(gathered, expected)
    out["errors"] = [e is not None for e in errors]
    out["weights_traffic"] = weights.traffic

    grads = make_grad_scheme("flat", codec)
    grads.setup(world, Topology(2))  # one node: nothing crosses nodes
    full = torch.randn(2 * N, generator=gen)
    reduced, expected_rs = torch.empty(N), torch.empty(N)
    grads.reduce_scatter(reduced, full, dist.ReduceOp.AVG, seed=5)
    quantized_reduce_scatter(expected_rs, full, codec, world, dist.ReduceOp.AVG, seed=5)
    out["reduce_equal"] = torch.equal(reduced, expected_rs)
    out["grads_traffic"] = grads.traffic

    restored = make_grad_scheme("flat", codec)
    restored.setup(world, Topology(2))
    restored.load_state_dict(grads.state_dict())
    out["restored"] = restored.traffic == grads.traffic
    return out


def test_scheme_life_cycle_and_equivalence():
    results = run_ranks(_rank_side, 2)
    wire = make_codec("minmax", bits=4, bucket_size=64).wire_bytes(N)
    for res in results:
        assert "called before setup(group, topology)" in res["before_setup"]
        assert "already set up" in res["setup_twice"]
        assert "called with another group" in res["other_group"]
        assert res["gather_equal"] and res["reduce_equal"] and res["restored"]
        assert res["errors"] == [True, False, True]  # calls 0 and 2 of an interval of 2
        traffic = res["weights_traffic"]
        assert (traffic.calls, traffic.sent, traffic.inter_node) == (3, 3 * wire, 3 * wire)
        assert (res["grads_traffic"].sent, res["grads_traffic"].inter_node) == (wire, 0)


def test_unknown_schemes_and_options_are_value_errors():
    with pytest.raises(ValueError, match=r"unknown weight scheme 'delta'; allowed: difference, direct"):
        make_weight_scheme("delta", None)
    with pytest.raises(ValueError, match=r"unknown grad scheme None"):
        make_grad_scheme(None, None)
    with pytest.raises(ValueError, match=r"invalid option for the weight scheme 'direct'"):
        make_weight_scheme("direct", None, 0, keyframe_every=3)
