"""LoCo's residual in host memory (``residual_on_host``) against the same scheme with its residual on the device, bit
for bit, on real process groups: ``loco`` on 2 and 4 ranks, ``two_level_loco`` on 4 ranks as 2 virtual nodes x 2;
fp32 and int8-coded residuals; gloo on CPU tensors and (``-m gpu``) CUDA tensors.

* Every reduce-scatter's output and the residual after it are the device residual's, over calls, optimizer steps and
  a ``reset_every`` zeroing.
* Memory: ``memory_bytes()`` (device) is 0 and ``host_memory_bytes()`` what the device residual takes; with CUDA
  tensors the residual is in pinned host memory.
* Checkpoints: the state dict holds the same residual, and a state of either resumes the other exactly.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from dist_spawn import RankInfo, run_ranks, spawn_params

from composer_qsdp.comm import Topology
from composer_qsdp.quant import CodedResidual, make_codec
from composer_qsdp.schemes import GradScheme, make_grad_scheme

N = 37  # elements per rank's chunk: no bucket divides it
CALLS, PER_STEP, SAVE_AT, RESET_EVERY = 8, 2, 5, 3
# name: (scheme, residual dtype); two_level_loco runs on 2 nodes (of 2 ranks, or of 1: then it is loco)
CASES = {"loco-fp32": ("loco", "float32"), "loco-int8": ("loco", "int8"),
         "two-level-fp32": ("two_level_loco", "float32"), "two-level-int8": ("two_level_loco", "int8")}


def _scheme(info: RankInfo, case: str, on_host: bool) -> GradScheme:
    name, dtype = CASES[case]
    scheme = make_grad_scheme(name, make_codec("minmax", bits=2, bucket_size=16, rounding="nearest"), 0, beta=0.5,
                              reset_every=RESET_EVERY, residual_dtype=dtype, residual_on_host=on_host)
    scheme.setup(dist.group.WORLD, Topology(info.world_size // 2))
    return scheme


def _residual(scheme: GradScheme) -> torch.Tensor:
    residual = scheme.residual
    assert residual is not None
    stored = residual.wire if isinstance(residual, CodedResidual) else residual
    return stored.detach().cpu().clone()


def _calls(info: RankInfo, scheme: GradScheme, first: int, last: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Reduce-scatters ``[first, last)`` (an optimizer step after every ``PER_STEP``): each output and the residual
    after it."""
    world = info.world_size
    out = []
    for call in range(first, last):
        if call and call % PER_STEP == 0:
            scheme.on_optimizer_step()
        gen = torch.Generator().manual_seed(1000 * call + info.rank)
        grad = torch.randn(world * N, generator=gen).to(info.device)
        output = torch.empty(N, device=info.device)
        scheme.reduce_scatter(output, grad, dist.ReduceOp.AVG, seed=7 + call)
        out.append((output.cpu(), _residual(scheme)))
    return out


def _same(a: list, b: list) -> bool:
    return all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b, strict=True))


def _worker(info: RankInfo) -> dict:
    results = {}
    for case in CASES:
        host, device = _scheme(info, case, True), _scheme(info, case, False)
        first_h, first_d = _calls(info, host, 0, SAVE_AT), _calls(info, device, 0, SAVE_AT)
        assert host.residual is not None and device.residual is not None
        stored = host.residual.wire if isinstance(host.residual, CodedResidual) else host.residual
        res = {"memory": (host.memory_bytes(), host.host_memory_bytes(), device.memory_bytes(),
                          device.host_memory_bytes()),
               "where": (stored.device.type, stored.is_pinned()), "describe": host.describe()}
        states = {"host": host.state_dict(), "device": device.state_dict()}
        # the saved pieces view the live residuals: keep copies, as a checkpoint does
        pieces = {k: v["residual"].to_local().cpu().clone() for k, v in states.items()}
        rest_h, rest_d = _calls(info, host, SAVE_AT, CALLS), _calls(info, device, SAVE_AT, CALLS)
        res["same"] = _same(first_h, first_d) and _same(rest_h, rest_d)
        res["states_equal"] = torch.equal(pieces["host"], pieces["device"])
        res["resumed"] = {}
        for source, state in states.items():
            for target in ("host", "device"):
                scheme = _scheme(info, case, target == "host")
                scheme.load_state_dict(state)
                piece = scheme.state_dict()["residual"]
                piece.to_local().copy_(pieces[source])  # what a checkpoint loader does in place
                scheme.load_state_dict({**state, "residual": piece})
                res["resumed"][source, target] = _same(_calls(info, scheme, SAVE_AT, CALLS), rest_d)
        results[case] = res
    return results


@pytest.fixture(scope="module", params=spawn_params((2, 4)))
def results(request):
    backend, world = request.param
    return backend, run_ranks(_worker, world, backend=backend)


def test_every_call_equals_the_device_residual_bit_for_bit(results):
    _, ranks = results
    for rank, cases in enumerate(ranks):
        for case, res in cases.items():
            assert res["same"], (rank, case)


def test_the_residual_leaves_the_device(results):
    backend, ranks = results
    for cases in ranks:
        for case, res in cases.items():
            device_bytes, host_bytes, resident_device, resident_host = res["memory"]
            assert (device_bytes, resident_host) == (0, 0), case
            assert host_bytes == resident_device > 0, case
            assert res["where"] == ("cpu", backend == "nccl"), case
            assert "residual in host memory" in res["describe"], case


def test_checkpoints_hold_the_same_residual_and_resume_either_way(results):
    _, ranks = results
    for cases in ranks:
        for case, res in cases.items():
            assert res["states_equal"], case
            assert all(res["resumed"].values()), (case, res["resumed"])


def test_a_non_bool_option_is_a_clear_error():
    codec = make_codec("minmax", bits=2, bucket_size=16, rounding="nearest")
    for name in ("loco", "two_level_loco"):
        with pytest.raises(ValueError, match="residual_on_host='yes' is invalid; it must be True or False"):
            make_grad_scheme(name, codec, residual_on_host="yes")
