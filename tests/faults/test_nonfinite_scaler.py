"""Non-finite gradients under mixed precision with a gradient scaler (issue 16), on CPU: FSDP2 with bf16 weights and
fp32 gradient reduction, ``torch.amp.GradScaler("cpu")``, an Inf in one rank's batch at one step. The scaler must
skip that step on every rank (FSDP2's DTensor gradients make its Inf check a collective), the weights stay finite,
QSDP's step-bound state does not advance (seed schedule, weight-difference reference), and training then goes on as
the exact reference that skips the same step (tests/sharded_mlp.py).

W8G8, qWD (weight differences) and two-level gradients (tlq-hs on two virtual nodes of 2 ranks, world 4).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from dist_spawn import RankInfo, run_ranks
from sharded_mlp import LR, Adapter, batch, full_tensors, local_shard, reference_training
from test_resume_settings import QWD, W8G8

from composer_qsdp.config import from_preset

pytestmark = pytest.mark.requires_custom_comm

STEPS, POISONED_STEP, POISONED_RANK = 5, 2, 0
TLQ = from_preset("tlq-hs", ranks_per_node=2, seed=7)
CONFIGS = {"w8g8": W8G8, "qwd": QWD, "tlq-hs": TLQ}


def _scaled_training(info: RankInfo, name: str) -> dict:
    adapter = Adapter("fsdp2")
    model = adapter.shard(info, mixed_precision=True)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    handle = adapter.apply(model, CONFIGS[name], optimizers=opt)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    steps = []
    for step in range(STEPS):
        x, y = batch(info.rank, step)
        if (info.rank, step) == (POISONED_RANK, POISONED_STEP):
            x[0, 0] = float("inf")
        before = [local_shard(p).detach().clone() for p in model.parameters()]
        scaler.scale(nn.functional.mse_loss(model(x).float(), y)).backward()
        scaler.step(opt)
        scale = scaler.get_scale()
        scaler.update()
        opt.zero_grad()
        after = [local_shard(p).detach() for p in model.parameters()]
        steps.append({"unchanged": all(torch.equal(a, b) for a, b in zip(after, before)), "scale": scale,
                      "next_scale": scaler.get_scale(), "finite": all(bool(a.isfinite().all()) for a in after),
                      "optimizer_step": handle.seeds.optimizer_step})
    with torch.no_grad():  # one more gather: the difference scheme's reference catches up with the last step
        model(batch(info.rank, STEPS)[0])
    references = {}
    for unit in handle.units:  # what every rank computes with, as the difference scheme keeps it
        if getattr(unit.weights, "reference", None) is not None:
            references.update({f"{unit.name}.{k}": v.float() for k, v in
                               unit.weights.layout.split(unit.weights.reference).items()})
    return {"steps": steps, "params": full_tensors(model), "references": references}


def _check(results: list[dict], name: str, world: int) -> None:
    ref, _ = reference_training(world, STEPS, skip={POISONED_STEP})
    for rank, out in enumerate(results):
        steps = out["steps"]
        skipped = [s["unchanged"] for s in steps]
        # Only the poisoned step is skipped, on every rank (not only on the rank whose gradient overflowed).
        assert skipped == [step == POISONED_STEP for step in range(STEPS)], (rank, skipped)
        assert steps[POISONED_STEP]["next_scale"] == steps[POISONED_STEP]["scale"] / 2  # the scaler backed off
        assert all(s["finite"] for s in steps), rank
        # QSDP's step boundary is the optimizer's step: a skipped step does not advance the seed schedule.
        assert [s["optimizer_step"] for s in steps] == [1, 2, 2, 3, 4], rank
        for n, expected in ref.items():
            assert torch.equal(out["params"][n], results[0]["params"][n]), (rank, n)
            rel = ((out["params"][n] - expected).norm() / expected.norm()).item()
            assert rel < 3e-2, (name, rank, n, rel)  # bf16 weights plus quantization noise
        for key, reference in out["references"].items():  # the kept reference tracks the (finite) weights
            layer, _, param = key.partition(".")
            weights = out["params"][f"{layer}.{param}"]
            assert reference.isfinite().all(), key
            assert ((reference - weights).norm() / weights.norm()).item() < 3e-2, key
    assert (name != "qwd") or results[0]["references"], "the difference scheme kept no reference"


def _both(info: RankInfo) -> dict:
    return {name: _scaled_training(info, name) for name in ("w8g8", "qwd")}


def test_a_non_finite_step_is_skipped_everywhere_with_w8g8_and_qwd():
    results = run_ranks(_both, 2, timeout_s=240)
    for name in ("w8g8", "qwd"):
        _check([r[name] for r in results], name, 2)


@pytest.mark.slow  # 4 ranks on 2 cores
def test_a_non_finite_step_is_skipped_everywhere_with_two_level_gradients():
    _check(run_ranks(_scaled_training, 4, "tlq-hs", timeout_s=240), "tlq-hs", 4)
