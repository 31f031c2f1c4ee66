"""Quantized all-gather / reduce-scatter on real process groups vs exact single-process references.

One spawn per (backend, world size) runs every case; the tests below check its results. Two references:
the same codec applied in one process (the collective must reproduce it bit for bit: same seeds, same fp32
decode-sum order) and the exact float64 collective (the result must lie within the codec's error bound).
"""

from __future__ import annotations

import zlib

import pytest
import torch
import torch.distributed as dist
from dist_spawn import RankInfo, run_ranks, skip_unless_backend, spawn_params

from composer_qsdp.comm import mix_seed, quantized_all_gather, quantized_reduce_scatter
from composer_qsdp.quant import make_codec

SEED = 1234
WORLD_SIZES = (2, 4)

# (name, dtype, bits, rounding, chunk numel, bucket): chunks not a multiple of the bucket, and smaller than it.
AG_CASES = [
    ("ag_fp32_8b", torch.float32, 8, "stochastic", 1000, 64),
    ("ag_bf16_4b", torch.bfloat16, 4, "stochastic", 257, 64),
    ("ag_fp16_8b_nearest", torch.float16, 8, "nearest", 130, 32),
    ("ag_fp32_2b_tiny", torch.float32, 2, "nearest", 5, 64),
]
# (name, dtype, bits, rounding, op, chunk numel, bucket)
RS_CASES = [
    ("rs_fp32_8b_sum", torch.float32, 8, "stochastic", "SUM", 1000, 64),
    ("rs_fp32_8b_avg", torch.float32, 8, "stochastic", "AVG", 1000, 64),
    ("rs_bf16_4b_avg", torch.bfloat16, 4, "nearest", "AVG", 300, 128),
    ("rs_fp32_2b_tiny", torch.float32, 2, "stochastic", "SUM", 7, 64),
]
OPS = {"SUM": dist.ReduceOp.SUM, "AVG": dist.ReduceOp.AVG}


def _input(name: str, rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(zlib.crc32(f"{name}/{rank}".encode()))
    return (torch.randn(numel, generator=gen, dtype=torch.float64) * (1 + rank)).to(dtype)


def _codec(bits: int, rounding: str, bucket: int):
    return make_codec("minmax", bits=bits, bucket_size=bucket, rounding=rounding)


def _worker(info: RankInfo) -> dict:
    rank, world, dev = info.rank, info.world_size, info.device
    group = dist.group.WORLD
    out: dict = {}
    for name, dtype, bits, rounding, n, bucket in AG_CASES:
        codec = _codec(bits, rounding, bucket)
        output = torch.full((world * n,), float("nan"), dtype=dtype, device=dev)
        inp = output[rank * n : (rank + 1) * n]  # FSDP2 gathers in place: the input aliases our slot
        inp.copy_(_input(name, rank, n, dtype))
        traffic = quantized_all_gather(output, inp, codec, group, SEED, measure_error=True)
        out[name] = (output, traffic)
    for name, dtype, bits, rounding, op, n, bucket in RS_CASES:
        codec = _codec(bits, rounding, bucket)
        inp = _input(name, rank, world * n, dtype).to(dev)
        output = torch.empty(n, dtype=dtype, device=dev)
        traffic = quantized_reduce_scatter(output, inp, codec, group, OPS[op], SEED, measure_error=True)
        out[name] = (output, traffic)

    # fp32 accumulation: 1 + 3 * 2**-8 is a bf16 tie that fp32 sums resolve and bf16 sums lose.
    if world == 4:
        value = 1.0 if rank == 0 else 2.0**-8
        inp = torch.full((world * 64,), value, dtype=torch.bfloat16, device=dev)
        output = torch.empty(64, dtype=torch.bfloat16, device=dev)
        quantized_reduce_scatter(output, inp, _codec(8, "stochastic", 32), group, dist.ReduceOp.SUM, SEED)
        out["fp32_accumulation"] = output

    # HSDP-like layout: shard groups {0, 1} and {2, 3}; rank r and r + 2 are replicas holding the same data.
    if world == 4:
        shard_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        shard_group = shard_groups[rank // 2]
        replica_data = _input("replica", rank % 2, 2 * 512, torch.float32).to(dev)
        gathered = torch.empty(2 * 512, dtype=torch.float32, device=dev)
        quantized_all_gather(gathered, replica_data[:512], _codec(8, "stochastic", 64), shard_group, SEED)
        reduced = torch.empty(512, dtype=torch.float32, device=dev)
        quantized_reduce_scatter(reduced, replica_data, _codec(8, "stochastic", 64), shard_group,
                                 dist.ReduceOp.SUM, SEED)
        out["replicas"] = (gathered, reduced)

    # Identical inputs on every rank: independent per-rank noise averages out, a shared stream would not.
    same = _input("same", 0, world * 4096, torch.float32).to(dev)
    output = torch.empty(4096, dtype=torch.float32, device=dev)
    quantized_reduce_scatter(output, same, _codec(8, "stochastic", 1024), group, dist.ReduceOp.AVG, SEED)
    out["same_inputs_avg"] = output

    # Non-finite values: rank 1 sends a NaN to rank 0 (element 3) and an Inf to rank 1 (element 5).
    n = 256
    inp = _input("nonfinite", rank, world * n, torch.float32).to(dev)
    if rank == 1:
        inp[3] = float("nan")
        inp[n + 5] = float("inf")
    output = torch.empty(n, dtype=torch.float32, device=dev)
    quantized_reduce_scatter(output, inp, _codec(8, "stochastic", 64), group, dist.ReduceOp.SUM, SEED)
    out["nonfinite_rs"] = output
    shard = _input("nonfinite_ag", rank, n, torch.float32).to(dev)
    if rank == 1:
        shard[7] = float("-inf")
    output = torch.empty(world * n, dtype=torch.float32, device=dev)
    quantized_all_gather(output, shard, _codec(8, "nearest", 64), group, SEED)
    out["nonfinite_ag"] = output

    # Pass-through: uint8 buffers (FSDP2's mixed-dtype path) and codec=None travel unquantized.
    raw = torch.arange(rank, rank + 10, dtype=torch.uint8, device=dev)
    output = torch.empty(world * 10, dtype=torch.uint8, device=dev)
    out["uint8_ag"] = (output, quantized_all_gather(output, raw, _codec(8, "nearest", 64), group, SEED))
    inp = _input("plain_rs", rank, world * 33, torch.float32).to(dev)
    output = torch.empty(33, dtype=torch.float32, device=dev)
    out["plain_rs"] = (output, quantized_reduce_scatter(output, inp, None, group, dist.ReduceOp.SUM, SEED))

    # Invalid calls raise before communicating, identically on every rank (so nobody hangs).
    errors = {}
    for label, call in {
        "max": lambda: quantized_reduce_scatter(
            torch.empty(8, device=dev), torch.zeros(world * 8, device=dev), _codec(8, "nearest", 8), group,
            dist.ReduceOp.MAX, SEED),
        "premul_sum": lambda: quantized_reduce_scatter(
            torch.empty(8, device=dev), torch.zeros(world * 8, device=dev), _codec(8, "nearest", 8), group,
            dist._make_nccl_premul_sum(0.5), SEED),
        "ag_size": lambda: quantized_all_gather(
            torch.empty(world * 8 + 1, device=dev), torch.zeros(8, device=dev), _codec(8, "nearest", 8), group,
            SEED),
        "rs_dtype": lambda: quantized_reduce_scatter(
            torch.empty(8, device=dev, dtype=torch.bfloat16), torch.zeros(world * 8, device=dev),
            _codec(8, "nearest", 8), group, dist.ReduceOp.SUM, SEED),
    }.items():
        try:
            call()
            errors[label] = None
        except ValueError as err:
            errors[label] = str(err)
    out["errors"] = errors
    dist.barrier()  # every rank still in step after the refused calls
    return out


pytestmark = pytest.mark.parametrize("run", spawn_params(WORLD_SIZES), indirect=True, scope="module")


@pytest.fixture(scope="module")
def run(request):
    backend, world = request.param
    skip_unless_backend(backend, world)
    return world, run_ranks(_worker, world, backend=backend)


def _bucket_step(x: torch.Tensor, bucket: int, bits: int) -> torch.Tensor:
    """Per-element quantization step (bucket range / (2**bits - 1)) in float64."""
    x64 = x.double()
    step = torch.empty_like(x64)
    for start in range(0, x64.numel(), bucket):
        chunk = x64[start : start + bucket]
        step[start : start + bucket] = (chunk.max() - chunk.min()) / (2**bits - 1)
    return step


def _out_rounding(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bound on the error of casting ``values`` (float64) to ``dtype``: half an ulp, plus fp32 slack."""
    eps = torch.finfo(dtype).eps
    return values.abs() * eps + 1e-6


@pytest.mark.parametrize("case", AG_CASES, ids=lambda c: c[0])
def test_all_gather_matches_single_process_codec_bit_for_bit(run, case):
    world, results = run
    name, dtype, bits, rounding, n, bucket = case
    codec = _codec(bits, rounding, bucket)
    expected = torch.cat([
        codec.decode(codec.encode(_input(name, r, n, dtype), seed=mix_seed(SEED, r)), n, dtype) for r in range(world)
    ])
    for rank in range(world):  # every rank, the owner of each chunk included, holds the same decoded weights
        torch.testing.assert_close(results[rank][name][0], expected, rtol=0, atol=0)


@pytest.mark.parametrize("case", AG_CASES, ids=lambda c: c[0])
def test_all_gather_within_codec_error_of_exact_gather(run, case):
    world, results = run
    name, dtype, bits, rounding, n, bucket = case
    exact = [_input(name, r, n, dtype).double() for r in range(world)]
    bound = torch.cat([_bucket_step(x, bucket, bits) * (1.0 if rounding == "stochastic" else 0.5) for x in exact])
    exact = torch.cat(exact)
    bound = bound * (1 + 1e-5) + _out_rounding(exact.abs() + bound, dtype)
    err = (results[0][name][0].double() - exact).abs()
    assert (err <= bound).all(), f"max excess {(err - bound).max().item():.3e}"


@pytest.mark.parametrize("case", RS_CASES, ids=lambda c: c[0])
def test_reduce_scatter_matches_single_process_codec_bit_for_bit(run, case):
    world, results = run
    name, dtype, bits, rounding, op, n, bucket = case
    codec = _codec(bits, rounding, bucket)
    wires = [codec.encode_rows(_input(name, r, world * n, dtype).view(world, n), seed=mix_seed(SEED, r))
             for r in range(world)]
    for dest in range(world):
        total = codec.decode_sum(torch.stack([wires[r][dest] for r in range(world)]), n)
        if op == "AVG":
            total = total / world
        torch.testing.assert_close(results[dest][name][0], total.to(dtype), rtol=0, atol=0)


@pytest.mark.parametrize("case", RS_CASES, ids=lambda c: c[0])
def test_reduce_scatter_within_codec_error_of_exact_reduction(run, case):
    world, results = run
    name, dtype, bits, rounding, op, n, bucket = case
    rows = [_input(name, r, world * n, dtype).double().view(world, n) for r in range(world)]
    divisor = world if op == "AVG" else 1
    per_step = 1.0 if rounding == "stochastic" else 0.5
    for dest in range(world):
        exact = sum(rows[r][dest] for r in range(world)) / divisor
        bound = sum(_bucket_step(rows[r][dest], bucket, bits) for r in range(world)) * per_step / divisor
        bound = bound * (1 + 1e-5) + _out_rounding(exact.abs() + bound, dtype)
        err = (results[dest][name][0].double() - exact).abs()
        assert (err <= bound).all(), f"rank {dest}: max excess {(err - bound).max().item():.3e}"


@pytest.mark.parametrize("case", AG_CASES + RS_CASES, ids=lambda c: c[0])
def test_bytes_counted_like_nccl(run, case):
    world, results = run
    name, dtype, bits, rounding, n, bucket = case[0], case[1], case[2], case[3], case[-2], case[-1]
    traffic = results[0][name][1]
    wire = _codec(bits, rounding, bucket).wire_bytes(n)
    assert (traffic.sent, traffic.bf16, traffic.native) == (
        (world - 1) * wire, (world - 1) * n * 2, (world - 1) * n * torch.empty(0, dtype=dtype).element_size()
    )
    assert traffic.sent < traffic.native


def test_measured_error_is_the_chunks_relative_error(run):
    world, results = run
    name, dtype, bits, rounding, n, bucket = AG_CASES[0]
    codec = _codec(bits, rounding, bucket)
    for rank in range(world):
        x = _input(name, rank, n, dtype)
        approx = codec.decode(codec.encode(x, seed=mix_seed(SEED, rank)), n, torch.float32)
        expected = (approx.double() - x.double()).norm() / x.double().norm()
        assert results[rank][name][1].rel_error.item() == pytest.approx(expected.item(), rel=1e-4)
        assert expected > 0


def test_reduce_scatter_accumulates_in_fp32(run):
    world, results = run
    if world != 4:
        pytest.skip("needs 4 ranks: three 2**-8 terms after a 1.0")
    # Exact sum 1 + 3/256 rounds to bf16 1.015625; accumulating in bf16 would stall at 1.0.
    assert torch.equal(results[0]["fp32_accumulation"], torch.full((64,), 1.015625, dtype=torch.bfloat16))


def test_ranks_draw_independent_rounding_noise(run):
    world, results = run
    x = _input("same", 0, world * 4096, torch.float32).view(world, 4096)
    codec = _codec(8, "stochastic", 1024)
    single = codec.decode(codec.encode(x[0], seed=1), 4096)
    single_mse = (single - x[0]).square().mean()
    averaged_mse = (results[0]["same_inputs_avg"] - x[0]).square().mean()
    # W independent roundings average to 1/W of the variance; one shared stream would keep all of it.
    assert averaged_mse < 0.75 * single_mse, (averaged_mse.item(), single_mse.item())


def test_replicas_gather_identical_weights_but_round_gradients_independently(run):
    world, results = run
    if world != 4:
        pytest.skip("needs 2 shard groups of 2 ranks")
    for rank in (0, 1):
        gathered, reduced = results[rank]["replicas"]
        replica_gathered, replica_reduced = results[rank + 2]["replicas"]
        assert torch.equal(gathered, replica_gathered)  # every process computes with the same weights
        assert not torch.equal(reduced, replica_reduced)  # replica gradients carry independent noise


def test_non_finite_values_stay_non_finite(run):
    world, results = run
    assert not torch.isfinite(results[0]["nonfinite_rs"][3])
    assert not torch.isfinite(results[1]["nonfinite_rs"][5])
    assert torch.isfinite(results[0]["nonfinite_rs"][64:]).all()  # other buckets unaffected
    for rank in range(world):
        gathered = results[rank]["nonfinite_ag"]
        assert not torch.isfinite(gathered[256 + 7])
        assert torch.isfinite(gathered[:256]).all()


def test_non_float_and_unquantized_traffic_pass_through(run):
    world, results = run
    output, traffic = results[0]["uint8_ag"]
    expected = torch.cat([torch.arange(r, r + 10, dtype=torch.uint8) for r in range(world)])
    assert torch.equal(output, expected)
    assert traffic.sent == traffic.native == (world - 1) * 10
    for dest in range(world):
        output, traffic = results[dest]["plain_rs"]
        exact = sum(_input("plain_rs", r, world * 33, torch.float32).double().view(world, 33)[dest]
                    for r in range(world))
        torch.testing.assert_close(output.double(), exact, rtol=1e-6, atol=1e-6)
        assert traffic.sent == traffic.native == (world - 1) * 33 * 4


def test_invalid_calls_raise_clear_errors_on_every_rank(run):
    world, results = run
    for rank in range(world):
        errors = results[rank]["errors"]
        assert "supports ReduceOp SUM and AVG, got MAX" in errors["max"]
        assert "PREMUL_SUM" in errors["premul_sum"] and "set_force_sum_reduction_for_comms" in errors["premul_sum"]
        assert f"needs exactly {world * 8}" in errors["ag_size"]
        assert "dtype" in errors["rs_dtype"]
