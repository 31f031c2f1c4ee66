"""On CUDA the quantized collectives and the non-finite weight check never make the host wait for the device.

One NCCL rank runs each codec's all-gather and reduce-scatter (Triton kernels) and the check's record / poll cycle
under ``torch.cuda.set_sync_debug_mode("error")``, which raises at any synchronizing CUDA call (a value read, a
blocking copy, ``nonzero``); a first round outside it compiles the kernels and fills the caches. Each collective
and each forward of the check is a named step, and a failure names the step and shows where it synced.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.distributed as dist
from dist_spawn import RankInfo, run_ranks

from composer_qsdp.comm import quantized_all_gather, quantized_reduce_scatter
from composer_qsdp.engine import NonFiniteWeightError
from composer_qsdp.engine.finite_check import WeightFiniteMonitor
from composer_qsdp.quant import Codec, make_codec

pytestmark = pytest.mark.gpu

#: (name, make_codec arguments): the presets' codecs.
CODECS = [
    ("minmax8", {"name": "minmax", "bits": 8, "bucket_size": 1024}),
    ("minmax4", {"name": "minmax", "bits": 4, "bucket_size": 1024}),
    ("minmax4_hadamard", {"name": "minmax", "bits": 4, "bucket_size": 1024, "hadamard": True}),
    ("symmetric4", {"name": "symmetric", "bits": 4, "bucket_size": 128}),
]
N = 1 << 16  # elements per chunk
FORWARDS = 3

Steps = Iterator[tuple[str, Callable[[], None]]]


def _collectives(codecs: list[tuple[str, Codec]], device: torch.device) -> Steps:
    """Each codec's all-gather and reduce-scatter in bf16 and fp32, as named steps."""
    group = dist.group.WORLD
    for name, codec in codecs:
        for dtype in (torch.bfloat16, torch.float32):
            label = f"{name} {str(dtype).removeprefix('torch.')}"
            gathered = torch.empty(N, dtype=dtype, device=device)
            gathered.normal_()
            reduced = torch.empty(N, dtype=dtype, device=device)
            yield f"all-gather {label}", lambda c=codec, g=gathered: quantized_all_gather(g, g, c, group, 7)
            yield f"reduce-scatter {label}", lambda c=codec, g=gathered, r=reduced: quantized_reduce_scatter(
                r, g, c, group, dist.ReduceOp.AVG, 7)


def _forwards(monitor: WeightFiniteMonitor, weights: torch.Tensor, reports: list[str]) -> Steps:
    """Forwards of the check: record every unit's gather, poll at the next forward. A poll raises once the copy of
    an earlier forward's flags has arrived, which on a fast device may be within these forwards."""

    def forward() -> None:
        monitor.record(0, torch.ones(N, device=weights.device))
        monitor.record(1, weights)
        try:
            monitor.poll()
        except NonFiniteWeightError as err:
            reports.append(str(err))

    for i in range(FORWARDS):
        yield f"finite check, forward {i + 1}", forward


def _run_unsynced(steps: Steps) -> str | None:
    """Run ``steps`` under sync-debug mode "error": ``None``, or the first failing step's name and traceback."""
    for name, step in steps:
        torch.cuda.set_sync_debug_mode("error")
        try:
            step()
        except RuntimeError:
            return f"step {name!r} raised:\n{traceback.format_exc()}"
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return None


def _worker(info: RankInfo) -> dict:
    codecs = [(name, make_codec(**options)) for name, options in CODECS]
    for _, step in _collectives(codecs, info.device):  # compiles the kernels
        step()
    monitor = WeightFiniteMonitor(["a", "b"])
    weights = torch.ones(N, device=info.device)
    monitor.record(0, weights)
    monitor.poll()
    # Before the checked steps: assigning one element of a CUDA tensor copies the number from pageable host memory
    # and waits for the copy (torch 2.11), a sync of the test's own, not of the check, which only reads weights.
    weights[5] = float("nan")
    torch.cuda.synchronize()
    reports: list[str] = []
    out = {"sync": _run_unsynced(_collectives(codecs, info.device))}
    if out["sync"] is None:
        out["sync"] = _run_unsynced(_forwards(monitor, weights, reports))
    torch.cuda.synchronize()
    try:  # the device has finished every copy: the next poll reads the flag
        monitor.poll()
        monitor.poll()
        reports.append("no error")
    except NonFiniteWeightError as err:
        reports.append(str(err))
    out["reports"] = reports
    return out


def test_quantized_collectives_and_the_finite_check_never_sync_the_host():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    (result,) = run_ranks(_worker, 1, backend="nccl")
    assert result["sync"] is None, result["sync"]
    reports = result["reports"]
    assert reports[-1] != "no error", "the NaN in unit 'b' was never reported"
    assert all("['b']" in report for report in reports), reports
