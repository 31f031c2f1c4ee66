"""The onebit all-reduce scheme on a real gloo group: it carries the error buffers of the stateless collective
across calls, its exact path is a plain all-reduce, its state round-trips so that a restored scheme continues bit for
bit, bytes are counted per hop, and misuse raises naming the problem."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from dist_spawn import RankInfo, run_ranks

from composer_qsdp.comm import Topology, compressed_all_reduce, error_feedback_chunk_numel
from composer_qsdp.quant import make_codec
from composer_qsdp.schemes import OneBitAllReduce, make_all_reduce_scheme

N = 333


def _data(rank: int, call: int) -> torch.Tensor:
    return torch.randn(N, generator=torch.Generator().manual_seed(100 * rank + call))


def _rank_side(info: RankInfo) -> dict:
    world = dist.group.WORLD
    codec = make_codec("sign", bucket_size=64)
    out: dict = {}
    scheme = make_all_reduce_scheme("onebit", codec)
    try:
        scheme.all_reduce(torch.zeros(N))
    except RuntimeError as err:
        out["before_setup"] = str(err)
    scheme.setup(world, Topology(1))  # every rank its own node: all traffic is inter-node

    chunk = error_feedback_chunk_numel(N, 2, make_codec("sign", bucket_size=64))
    errors = torch.zeros(2 * chunk), torch.zeros(chunk)
    same = []
    for call in range(3):
        got, expected = _data(info.rank, call), _data(info.rank, call)
        scheme.all_reduce(got, group=world)
        compressed_all_reduce(expected, *errors, codec, world)
        same.append(torch.equal(got, expected))
    out["carries_errors"] = same
    out["buffers_equal"] = torch.equal(scheme.worker_error, errors[0]) and torch.equal(scheme.server_error, errors[1])

    saved = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in scheme.state_dict().items()}
    exact = _data(info.rank, 9)
    plain = exact.clone()
    scheme.all_reduce(exact, exact=True)
    dist.all_reduce(plain)
    out["exact_equal"] = torch.equal(exact, plain / 2)
    out["exact_kept_errors"] = torch.equal(scheme.worker_error, errors[0])
    out["traffic"] = scheme.traffic

    restored = OneBitAllReduce(codec)
    restored.setup(world, Topology(1))
    restored.load_state_dict(saved)
    continued, reference = _data(info.rank, 3), _data(info.rank, 3)
    restored.all_reduce(continued)
    compressed_all_reduce(reference, *errors, codec, world)
    out["restored_continues"] = torch.equal(continued, reference)
    out["restored_calls"] = restored.traffic.calls

    try:
        scheme.all_reduce(torch.zeros(N + 100))
    except ValueError as err:
        out["other_size"] = str(err)
    scheme.reset_errors()
    out["reset"] = not scheme.worker_error.any() and not scheme.server_error.any()
    out["memory"] = scheme.memory_bytes()

    # Without error feedback every call is the collective with zero residues, and no buffers are kept.
    int8 = make_codec("symmetric", bucket_size=64)
    stateless = make_all_reduce_scheme("onebit", int8, error_feedback=False)
    stateless.setup(world, Topology(1))
    same = []
    for call in range(3):
        got, expected = _data(info.rank, call), _data(info.rank, call)
        stateless.all_reduce(got)
        compressed_all_reduce(expected, torch.zeros(2 * chunk), torch.zeros(chunk), int8, world)
        same.append(torch.equal(got, expected))
    out["stateless"] = same, stateless.worker_error, stateless.memory_bytes(), stateless.traffic.calls
    return out


def test_onebit_scheme_life_cycle():
    outs = run_ranks(_rank_side, 2)
    chunk = error_feedback_chunk_numel(N, 2, make_codec("sign", bucket_size=64))
    wire = make_codec("sign", bucket_size=64).wire_bytes(chunk)
    for out in outs:
        assert "before setup" in out["before_setup"]
        assert out["carries_errors"] == [True, True, True] and out["buffers_equal"]
        assert out["exact_equal"] and out["exact_kept_errors"]
        traffic = out["traffic"]
        assert traffic.calls == 4
        assert traffic.sent == 3 * 2 * wire + 2 * chunk * 4  # three compressed calls, one fp32 all-reduce
        assert traffic.native == 4 * 2 * chunk * 4 and traffic.inter_node == traffic.sent
        assert out["restored_continues"] and out["restored_calls"] == 4
        assert f"chunks of {chunk} elements" in out["other_size"]
        assert out["reset"] and out["memory"] == 3 * chunk * 4
        assert out["stateless"] == ([True, True, True], None, 0, 3)


@pytest.mark.parametrize("make, match", [
    (lambda: make_all_reduce_scheme("ring", None), "unknown all-reduce scheme 'ring'; allowed: onebit"),
    (lambda: OneBitAllReduce(make_codec("minmax", bits=2)), "deterministic codec"),
    (lambda: OneBitAllReduce(None, error_sample_interval=5), "error_sample_interval=5"),
    (lambda: make_all_reduce_scheme("onebit", None, error_feedback="no"), "error_feedback='no' is invalid"),
])
def test_bad_construction_is_named(make, match):
    with pytest.raises(ValueError, match=match):
        make()
