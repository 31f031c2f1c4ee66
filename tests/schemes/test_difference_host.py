"""The difference scheme with ``reference_on_host`` against the same scheme with its reference on the gathers'
device, bit for bit, on real process groups: 2 ranks (one node of 2 and 2 nodes of 1) and 4 ranks as 2 virtual nodes
x 2, the reference replicated and sharded, fp32 and bf16, gloo on CPU tensors and (``-m gpu``) CUDA tensors.

* Every gather (keyframes: the first, ``keyframe_every``, after ``on_weights_changed``; updates; the gathers served
  from the reference; FSDP2's in-place input) gives the device reference's output, and the sampled errors are the same.
* Memory: with CUDA tensors the reference is in pinned host memory; ``memory_bytes()`` (device) is 0 and
  ``host_memory_bytes()`` is what the device reference takes on the device.
* Host link: a gather reads the host reference once at most (an update too, whose own row the encoding needs first),
  and a keyframe not at all.
* Checkpoints: the state dict is the device reference's, value for value, and a state of either resumes the other,
  continuing exactly as the uninterrupted run.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist
from difference_unit import EDIT_AT, P, Padded, walk_weights
from dist_spawn import RankInfo, run_ranks, spawn_params

from composer_qsdp.comm import Topology
from composer_qsdp.quant import make_codec
from composer_qsdp.schemes import DifferenceAllGather, make_weight_scheme
from composer_qsdp.schemes.host_copies import HostCopies

STEPS = 9
SAVE_AT = 5  # the state is saved after this many steps
GATHERS = 3  # per step: the forward's (in place), the backward re-gather, an evaluation's
KEYFRAME_EVERY = 4
DTYPES = (torch.float32, torch.bfloat16)


def _scheme(info: RankInfo, per_node: int, sharded: bool, on_host: bool) -> DifferenceAllGather:
    codec = make_codec("symmetric", bits=4, bucket_size=64)
    scheme = make_weight_scheme("difference", codec, 2, keyframe_every=KEYFRAME_EVERY, sharded_reference=sharded,
                                reference_on_host=on_host)
    scheme.setup(dist.group.WORLD, Topology(per_node), Padded(info.world_size))
    return scheme


@contextlib.contextmanager
def _reference_reads(scheme: DifferenceAllGather):
    """Counts the bytes each ``all_gather`` of ``scheme`` copies out of its host reference (a list, one per call)."""
    reads: list[int] = []
    copy, gather = HostCopies.copy, scheme.all_gather

    def counting_copy(self, dst, src):
        ref = scheme.reference
        if ref is not None and src.untyped_storage().data_ptr() == ref.untyped_storage().data_ptr():
            reads[-1] += src.numel() * src.element_size()
        copy(self, dst, src)

    def counting_gather(*args, **kwargs):
        reads.append(0)
        return gather(*args, **kwargs)

    HostCopies.copy, scheme.all_gather = counting_copy, counting_gather
    try:
        yield reads
    finally:
        HostCopies.copy = copy
        del scheme.all_gather


def _steps(info: RankInfo, scheme: DifferenceAllGather, dtype: torch.dtype, first: int, last: int) -> dict:
    """The gathers of steps ``[first, last)`` (an optimizer step before each but the first step of the run): each
    call's output and each step's sampled error, on the CPU."""
    world, rank, device = info.world_size, info.rank, info.device
    n = -(-P // world)
    outputs, errors = [], []
    for step in range(first, last):
        if step:
            scheme.on_optimizer_step()
        if step == EDIT_AT:
            scheme.on_weights_changed()
        full = walk_weights(step, world, dtype, device)
        for call in range(GATHERS):
            out = torch.full((world * n,), float("nan"), dtype=dtype, device=device)
            if call == 0:  # FSDP2 gathers in place: the input aliases this rank's slot
                out[rank * n:(rank + 1) * n] = full[rank * n:(rank + 1) * n]
                shard = out[rank * n:(rank + 1) * n]
            else:
                shard = full[rank * n:(rank + 1) * n].clone()
            scheme.all_gather(out, shard, seed=100 + step)
            outputs.append(out.cpu())
        error = scheme.take_error()
        errors.append(None if error is None else error.cpu())
    return {"outputs": outputs, "errors": errors}


def _same(a: dict, b: dict) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a["outputs"], b["outputs"], strict=True)) and all(
        (x is None and y is None) or torch.equal(x, y) for x, y in zip(a["errors"], b["errors"], strict=True))


def _layout(info: RankInfo, per_node: int, sharded: bool, dtype: torch.dtype) -> dict:
    host, device = _scheme(info, per_node, sharded, True), _scheme(info, per_node, sharded, False)
    with _reference_reads(host) as reads:
        first_h = _steps(info, host, dtype, 0, SAVE_AT)
    first_d = _steps(info, device, dtype, 0, SAVE_AT)
    assert host.reference is not None and device.reference is not None
    res = {"memory": (host.memory_bytes(), host.host_memory_bytes(), device.memory_bytes(),
                      device.host_memory_bytes()),
           "where": (host.reference.device.type, host.reference.is_pinned(), device.reference.device.type),
           "describe": host.describe(),
           "reads": (reads, host.host_memory_bytes())}
    states = {"host": host.state_dict(), "device": device.state_dict()}
    rest_h, rest_d = _steps(info, host, dtype, SAVE_AT, STEPS), _steps(info, device, dtype, SAVE_AT, STEPS)
    res["same"] = _same(first_h, first_d) and _same(rest_h, rest_d)
    res["keyframes"] = (host.keyframes, device.keyframes)
    res["states_equal"] = all(
        torch.equal(states["host"]["reference"]["w"], states["device"]["reference"]["w"]) if key == "reference"
        else states["host"][key] == states["device"][key]
        for key in states["host"] if key != "traffic")
    res["resumed"] = {}
    for source, state in states.items():
        for target in ("host", "device"):
            scheme = _scheme(info, per_node, sharded, target == "host")
            scheme.load_state_dict(state)
            res["resumed"][source, target] = _same(_steps(info, scheme, dtype, SAVE_AT, STEPS), rest_d)
    return res


def _all_layouts(info: RankInfo) -> dict:
    per_nodes = (2,) if info.world_size == 4 else (2, 1)
    return {(per_node, sharded, dtype): _layout(info, per_node, sharded, dtype)
            for per_node in per_nodes for sharded in (False, True) for dtype in DTYPES}


@pytest.fixture(scope="module", params=spawn_params((2, 4)))
def results(request):
    backend, world = request.param
    return backend, run_ranks(_all_layouts, world, backend=backend)


def test_every_gather_equals_the_device_reference_bit_for_bit(results):
    _, ranks = results
    for rank, layouts in enumerate(ranks):
        for key, res in layouts.items():
            assert res["same"], (rank, key)
            assert res["keyframes"][0] == res["keyframes"][1] == 3  # steps 0, 4 (keyframe_every), 7 (the edit)


def test_the_reference_leaves_the_device(results):
    backend, ranks = results
    for layouts in ranks:
        for key, res in layouts.items():
            device_bytes, host_bytes, resident_device, resident_host = res["memory"]
            assert (device_bytes, resident_host) == (0, 0), key
            assert host_bytes == resident_device > 0, key
            where, pinned, resident = res["where"]
            assert where == "cpu", key
            assert resident == ("cuda" if backend == "nccl" else "cpu"), key
            assert pinned == (backend == "nccl"), key
            assert res["describe"].endswith(", reference in host memory"), key


def test_a_gather_reads_the_host_reference_once_at_most(results):
    _, ranks = results
    for layouts in ranks:
        for key, res in layouts.items():
            reads, reference = res["reads"]
            assert len(reads) == SAVE_AT * GATHERS, key
            # Step 0's first gather and step 4's (keyframe_every) are keyframes: nothing read; every other reads it all.
            keyframes = {0, KEYFRAME_EVERY * GATHERS}
            assert reads == [0 if call in keyframes else reference for call in range(len(reads))], key


def test_checkpoints_are_the_device_references_and_resume_either_way(results):
    _, ranks = results
    for layouts in ranks:
        for key, res in layouts.items():
            assert res["states_equal"], key
            assert all(res["resumed"].values()), (key, res["resumed"])


def test_a_non_bool_option_is_a_clear_error():
    with pytest.raises(ValueError, match="reference_on_host='yes' is invalid; it must be True or False"):
        make_weight_scheme("difference", make_codec("symmetric", bits=4, bucket_size=64), reference_on_host="yes")
