"""The error-feedback compressed all-reduce on real process groups against a single-process float64 reference of
the same algorithm (worker and server error carried across calls), its exact conservation law, the uncompressed
path against a plain all-reduce, the byte counts and the argument checks.

One spawn per (backend, world size) runs every case; the tests below check its results.
"""

from __future__ import annotations

import zlib

import pytest
import torch
import torch.distributed as dist
from dist_spawn import RankInfo, run_ranks, skip_unless_backend, spawn_params
from zero_one_reference import OneBitAllReduce

from composer_qsdp.comm import compressed_all_reduce, error_feedback_chunk_numel
from composer_qsdp.quant import make_codec

CALLS = 4
# (name, numel, bucket): a size the world divides into whole bytes, sizes it does not divide, one smaller than
# the world's padding, a bucket larger than the tensor, and gaps of absent elements inside the tensor ("gaps").
CASES = [("even", 512, 64), ("ragged", 1001, 48), ("tiny", 3, 2048), ("one_bucket", 300, 4096), ("gaps", 700, 32)]


def _valid(name: str, numel: int) -> torch.Tensor | None:
    """For "gaps": every fifth run of 10 elements carries no data (the gaps an optimizer leaves between tensors)."""
    return (torch.arange(numel) // 10) % 5 != 4 if name == "gaps" else None


def _input(name: str, call: int, rank: int, numel: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(zlib.crc32(f"{name}/{call}/{rank}".encode()))
    # Ranks differ in scale and sign pattern; a common offset makes the mean worth reducing.
    return (torch.randn(numel, generator=gen) * (1 + rank) + 0.5).to(torch.float32)


def _worker(info: RankInfo) -> dict:
    world, dev = info.world_size, info.device
    group = dist.group.WORLD
    out: dict = {}
    for name, numel, bucket in CASES:
        codec = make_codec("sign", bucket_size=bucket)
        chunk = error_feedback_chunk_numel(numel, world, codec)
        worker_error = torch.zeros(world * chunk, device=dev)
        server_error = torch.zeros(chunk, device=dev)
        results = []
        valid = _valid(name, numel)
        for call in range(CALLS):
            x = _input(name, call, info.rank, numel).to(dev)  # absent elements hold values too: ignored
            traffic = compressed_all_reduce(x, worker_error, server_error, codec, group, off_node_peers=world - 1,
                                            valid=None if valid is None else valid.to(dev))
            results.append(x.clone())
        out[name] = {"results": results, "worker_error": worker_error, "server_error": server_error,
                     "traffic": traffic}

    # Uncompressed: the exact mean. Multiples of 1/8 whose sums stay exact in fp32, so every summation order
    # (the all-reduce's and ours) gives the same bits.
    x = torch.randint(-1000, 1000, (999,), generator=torch.Generator().manual_seed(info.rank)).float().div(8).to(dev)
    expected = x.clone()
    dist.all_reduce(expected, group=group)
    expected /= world
    chunk = error_feedback_chunk_numel(999, world, None)
    errors = torch.zeros(world * chunk, device=dev), torch.zeros(chunk, device=dev)
    traffic = compressed_all_reduce(x, *errors, None, group)
    out["identity"] = {"result": x, "expected": expected, "errors_zero": all(not e.any() for e in errors),
                       "traffic": traffic}
    return out


# 4 ranks: 7 s on 2 cores with a bytecode cache, 30 s without; W=2 runs the same paths by default.
@pytest.fixture(scope="module", params=spawn_params((2, 4), slow_sizes=(4,)))
def runs(request):
    backend, world = request.param
    skip_unless_backend(backend, world)
    return world, run_ranks(_worker, world, backend=backend)


def _reference(name: str, numel: int, bucket: int, world: int) -> dict:
    """The float64 single-process reference over the same inputs, call after call."""
    reference = OneBitAllReduce(numel, world, bucket, _valid(name, numel))
    results = [reference([_input(name, call, rank, numel) for rank in range(world)]) for call in range(CALLS)]
    return {"results": results, "worker_errors": reference.worker, "server_errors": reference.server}


@pytest.mark.parametrize("name, numel, bucket", CASES)
def test_matches_the_float64_reference_across_calls(runs, name, numel, bucket):
    world, outs = runs
    ref = _reference(name, numel, bucket, world)
    for rank, out in enumerate(outs):
        got = out[name]
        for call in range(CALLS):
            # Every rank decodes the same server wires: bit-identical results.
            assert torch.equal(got["results"][call], outs[0][name]["results"][call])
            torch.testing.assert_close(got["results"][call].double(), ref["results"][call], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got["worker_error"].double(), ref["worker_errors"][rank], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got["server_error"].double(), ref["server_errors"][rank], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name, numel, bucket", CASES)
def test_error_feedback_conserves_the_sum_of_the_means(runs, name, numel, bucket):
    # out_k = mean_i(x_ik) + mean_i(e_i,k-1 - e_ik) + E_k-1 - E_k at every real element, so over all calls
    # sum_k out_k = sum_k mean_i(x_ik) - mean_i(e_iK) - E_K: nothing a call drops is lost, only delayed.
    # Absent elements come back as zeros and hold no error.
    world, outs = runs
    valid = _valid(name, numel)
    valid = torch.ones(numel, dtype=torch.bool) if valid is None else valid
    total_out = sum(r.double() for r in outs[0][name]["results"])
    total_in = sum(_input(name, call, rank, numel).double() for call in range(CALLS) for rank in range(world)) / world
    worker = sum(out[name]["worker_error"].double() for out in outs)[:numel] / world
    server = torch.cat([out[name]["server_error"].double() for out in outs])[:numel]
    expected = torch.where(valid, total_in - worker - server, 0.0)
    torch.testing.assert_close(total_out, expected, rtol=0, atol=1e-4)
    chunk = error_feedback_chunk_numel(numel, world, make_codec("sign", bucket_size=bucket))
    assert chunk % bucket == 0 and chunk * world >= numel
    for out in outs:
        assert not out[name]["worker_error"][numel:].any() and not out[name]["worker_error"][:numel][~valid].any()


def test_without_compression_it_is_the_plain_all_reduce_mean(runs):
    _, outs = runs
    for out in outs:
        assert torch.equal(out["identity"]["result"], out["identity"]["expected"])
        assert out["identity"]["errors_zero"]


def test_bytes_per_rank_follow_the_nccl_convention(runs):
    world, outs = runs
    codec = make_codec("sign", bucket_size=64)
    chunk = error_feedback_chunk_numel(512, world, codec)
    traffic = outs[0]["even"]["traffic"]
    # Both phases send one chunk's wire to each of the W - 1 peers; an all-reduce sends 2 (W - 1) chunks too.
    assert traffic.sent == 2 * (world - 1) * codec.wire_bytes(chunk)
    assert traffic.native == 2 * (world - 1) * chunk * 4 and traffic.bf16 == traffic.native // 2
    assert traffic.inter_node == traffic.sent  # every peer was declared off-node
    assert traffic.native / traffic.sent > 20  # 1 bit + a 32-bit scale per 64 elements against 32 bits
    plain = outs[0]["identity"]["traffic"]
    assert plain.sent == plain.native and plain.inter_node == 0


def test_bad_arguments_are_named():
    x = torch.zeros(10)
    with pytest.raises(ValueError, match="deterministic codec"):
        compressed_all_reduce(x, torch.zeros(16), torch.zeros(8), make_codec("minmax", bits=4), _FakeGroup(2))
    with pytest.raises(ValueError, match="worker_error has 10 elements"):
        compressed_all_reduce(x, torch.zeros(10), torch.zeros(8), None, _FakeGroup(2))
    with pytest.raises(ValueError, match="server_error must be a contiguous 1-D float32"):
        compressed_all_reduce(x, torch.zeros(16), torch.zeros(8, dtype=torch.float64), None, _FakeGroup(2))
    with pytest.raises(ValueError, match="tensor has 0 elements"):
        compressed_all_reduce(torch.zeros(0), torch.zeros(0), torch.zeros(0), None, _FakeGroup(2))


class _FakeGroup:
    """Just a size: the argument checks run before any communication."""

    def __init__(self, size: int) -> None:
        self._size = size

    def size(self) -> int:
        return self._size
