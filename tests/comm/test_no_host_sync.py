"""On CUDA the quantized collectives and the non-finite weight check never make the host wait for the device.

One NCCL rank runs each codec's all-gather and reduce-scatter (Triton kernels) and the check's record / poll cycle
under ``torch.cuda.set_sync_debug_mode("error")``, which raises at any synchronizing CUDA call (a value read, a
blocking copy, ``nonzero``); a first round outside it compiles the kernels and fills the caches.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from dist_spawn import RankInfo, run_ranks

from composer_qsdp.comm import quantized_all_gather, quantized_reduce_scatter
from composer_qsdp.engine import NonFiniteWeightError
from composer_qsdp.engine.finite_check import WeightFiniteMonitor
from composer_qsdp.quant import make_codec

pytestmark = pytest.mark.gpu

#: (name, make_codec arguments): the presets' codecs.
CODECS = [
    ("minmax8", {"name": "minmax", "bits": 8, "bucket_size": 1024}),
    ("minmax4", {"name": "minmax", "bits": 4, "bucket_size": 1024}),
    ("minmax4_hadamard", {"name": "minmax", "bits": 4, "bucket_size": 1024, "hadamard": True}),
    ("symmetric4", {"name": "symmetric", "bits": 4, "bucket_size": 128}),
]
N = 1 << 16  # elements per chunk


def _collectives(codecs: list, device: torch.device) -> None:
    group = dist.group.WORLD
    for codec in codecs:
        for dtype in (torch.bfloat16, torch.float32):
            gathered = torch.empty(N, dtype=dtype, device=device)
            gathered.normal_()
            quantized_all_gather(gathered, gathered, codec, group, 7)
            reduced = torch.empty(N, dtype=dtype, device=device)
            quantized_reduce_scatter(reduced, gathered, codec, group, dist.ReduceOp.AVG, 7)


def _worker(info: RankInfo) -> dict:
    codecs = [make_codec(**options) for _, options in CODECS]
    _collectives(codecs, info.device)  # compiles the kernels
    monitor = WeightFiniteMonitor(["a", "b"])
    weights = torch.ones(N, device=info.device)
    monitor.record(0, weights)
    monitor.poll()
    torch.cuda.synchronize()
    out = {}
    torch.cuda.set_sync_debug_mode("error")
    try:
        _collectives(codecs, info.device)
        weights[5] = float("nan")
        for _ in range(3):  # forwards: record every unit's gather, poll at the next forward
            monitor.record(0, torch.ones(N, device=info.device))
            monitor.record(1, weights)
            monitor.poll()
        out["without_sync"] = "ok"
    except RuntimeError as err:
        out["without_sync"] = str(err)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    try:  # the device has finished every copy: the next poll reads the flag
        monitor.poll()
        monitor.poll()
        out["reported"] = "no error"
    except NonFiniteWeightError as err:
        out["reported"] = str(err)
    return out


def test_quantized_collectives_and_the_finite_check_never_sync_the_host():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    (result,) = run_ranks(_worker, 1, backend="nccl")
    assert result["without_sync"] == "ok"
    assert "['b']" in result["reported"], result["reported"]
