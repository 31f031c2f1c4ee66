"""Segmented all-gather: every quantized piece in buckets of its own, raw pieces exact, against one process."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from dist_spawn import RankInfo, run_ranks

from composer_qsdp.comm import Segments, mix_seed, quantized_all_gather
from composer_qsdp.quant import make_codec

# A unit's shard as FSDP lays it out: a norm gain near 1, weights of scale 0.02, a bias.
SIZES, BUCKET = (100, 300, 50), 64


def _chunk(rank: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(rank)
    gain = 1 + 0.01 * torch.randn(SIZES[0], generator=gen)
    weight = 0.02 * torch.randn(SIZES[1], generator=gen)
    bias = 0.001 * torch.randn(SIZES[2], generator=gen)
    return torch.cat([gain, weight, bias]).to(dtype)


def _side(info: RankInfo) -> dict:
    return {dtype: _one_dtype(info, dtype) for dtype in (torch.float32, torch.bfloat16)}


def _one_dtype(info: RankInfo, dtype: torch.dtype) -> dict:
    codec = make_codec("minmax", bits=4, bucket_size=BUCKET)
    n = sum(SIZES)
    out = {}
    for name, segments in (("plain", None), ("aligned", Segments(SIZES, (True, True, True))),
                           ("raw_bias", Segments(SIZES, (True, True, False)))):
        gathered = torch.empty(info.world_size * n, dtype=dtype)
        traffic = quantized_all_gather(gathered, _chunk(info.rank, dtype), codec, dist.group.WORLD, seed=3,
                                       measure_error=True, segments=segments)
        out[name] = (gathered, traffic.sent, traffic.rel_error.item())
    return out


def _reference(world: int, dtype: torch.dtype, quantize: tuple[bool, ...]) -> tuple[torch.Tensor, int]:
    """Each rank's chunk: its quantized pieces padded with their first element to whole buckets, encoded as one
    row, decoded, unpadded; raw pieces copied."""
    codec = make_codec("minmax", bits=4, bucket_size=BUCKET)
    rows, wire_bytes = [], 0
    for rank in range(world):
        pieces = _chunk(rank, dtype).split(SIZES)
        padded = [torch.cat([p, p[:1].expand(-(-len(p) // BUCKET) * BUCKET - len(p))])
                  for p, q in zip(pieces, quantize) if q]
        wire = codec.encode(torch.cat(padded), seed=mix_seed(3, rank))
        decoded = codec.decode(wire, sum(len(p) for p in padded), dtype).split([len(p) for p in padded])
        it = iter(decoded)
        rows.append(torch.cat([next(it)[:len(p)] if q else p for p, q in zip(pieces, quantize)]))
        wire_bytes = wire.numel() + sum(len(p) * p.element_size() for p, q in zip(pieces, quantize) if not q)
    return torch.cat(rows), wire_bytes


def test_segments_quantize_each_piece_in_its_own_buckets():
    results = run_ranks(_side, 2)
    for dtype in (torch.float32, torch.bfloat16):
        _check(dtype, [res[dtype] for res in results])


def _check(dtype: torch.dtype, results: list[dict]) -> None:
    for name, flags in (("aligned", (True, True, True)), ("raw_bias", (True, True, False))):
        expected, wire = _reference(2, dtype, flags)
        for res in results:
            assert torch.equal(res[name][0], expected), name
            assert res[name][1] == wire  # one peer: codes (+ raw bytes)
    for res in results:
        bias = slice(2 * sum(SIZES) - SIZES[2], 2 * sum(SIZES))  # rank 1's bias: exact when raw
        assert torch.equal(res["raw_bias"][0][bias], _chunk(1, dtype)[-SIZES[2]:])
        # The gain's range no longer widens the weights' buckets: a smaller error (sampled on rank's own chunk).
        assert res["aligned"][2] < 0.5 * res["plain"][2]


def test_bad_segments_are_rejected():
    with pytest.raises(ValueError, match="one quantize flag per piece and positive sizes"):
        Segments((3, 0), (True, True))
    with pytest.raises(ValueError, match="one quantize flag per piece"):
        Segments((3,), (True, False))
