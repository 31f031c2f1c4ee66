"""The speculative update (``QSDPConfig.speculative_update``) on real FSDP2 units over gloo: the next step's
weight-difference codes sent during the backward leave training bit for bit what it is without them, with AdamW,
bf16 gathers and gradient accumulation; a step whose gradients change after the backward (global-norm clipping that
acts) is a miss that costs its bytes again; every other step is a hit whose gathers send nothing."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from dist_spawn import RankInfo, run_ranks, skip_unless_backend, spawn_params
from sharded_mlp import Adapter, batch, full_tensors, load_sharded, save_sharded

from composer_qsdp.config import QSDPConfig, from_preset

STEPS, MICROBATCHES = 7, 2
CLIPPED = (3, 5)  # steps whose gradients are clipped to a tiny norm after the backward
QWD = dict(weight_bits=4, bucket_size=64, seed=3)


def _config(speculative: bool) -> QSDPConfig:
    return from_preset("qwd-w3g3-loco", **QWD, speculative_update=speculative)


def _run(info: RankInfo, speculative: bool, corrupt: bool = False) -> dict:
    adapter = Adapter("fsdp2")
    model = adapter.shard(info, mixed_precision=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))  # the guess must read the step's LR
    handle = adapter.apply(model, _config(speculative), optimizers=opt)
    if corrupt:  # an adapter whose gather inputs are not the framework's
        build = handle.speculation.gather_input
        handle.speculation.gather_input = lambda *args: build(*args) * 0.5
    losses, sent_after = [], []
    for step in range(STEPS):
        x, y = (t.to(info.device) for t in batch(info.rank, step))
        for xm, ym in zip(x.chunk(MICROBATCHES), y.chunk(MICROBATCHES)):
            loss = nn.functional.mse_loss(model(xm).float(), ym) / MICROBATCHES
            loss.backward()
            losses.append(loss.item())
        if step in CLIPPED:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
        opt.step()
        sched.step()
        opt.zero_grad()
        sent_after.append({u.name: u.weights.traffic.sent for u in handle.units})
    stats = handle.speculation.stats if handle.speculation is not None else None
    return {"losses": losses, "params": full_tensors(model), "sent": sent_after,
            "stats": None if stats is None else (stats.sent, stats.hits, stats.misses, stats.paused),
            "units": len(handle.units)}


@pytest.mark.parametrize("spawn", spawn_params((2,)))
def test_speculative_update_trains_bit_for_bit_as_without_it(spawn):
    backend, world = spawn
    skip_unless_backend(backend, world)
    plain = run_ranks(_run, world, False, backend=backend)
    ahead = run_ranks(_run, world, True, backend=backend)
    for rank in range(world):
        assert ahead[rank]["losses"] == plain[rank]["losses"]
        for name, value in plain[rank]["params"].items():
            assert torch.equal(ahead[rank]["params"][name], value), name
    units = ahead[0]["units"]
    # Step 0 guesses nothing (no step before it to count microbatches). In the clipped steps (3 and 5) the units
    # guessed in the backward miss; the backward's last unit (l1) is guessed at the optimizer's pre-step hook, after
    # the clipping, and hits like every unit of the other steps. After a step with a miss the next 1, then 2 steps
    # guess nothing (the back-off): steps 1, 2, 3 and 5 guess, 4 and 6 pause.
    guessing, misses = 4, (units - 1) * len(CLIPPED)
    assert ahead[0]["stats"] == (units * guessing, units * guessing - misses, misses, 2)
    # A hit's bytes replace the update's; a miss's codes are sent again at the next gather.
    plain_sent, ahead_sent = plain[0]["sent"], ahead[0]["sent"]
    for name, last in ahead_sent[-1].items():
        update = plain_sent[2][name] - plain_sent[1][name]  # one update gather of the unit
        missed = 0 if name == "l1" else len(CLIPPED)
        assert last - plain_sent[-1][name] == missed * update, name
        assert ahead_sent[min(CLIPPED) - 1][name] == plain_sent[min(CLIPPED) - 1][name], name


def _resume(info: RankInfo, ckpt_dir: str, mode: str) -> dict:
    """``full``: 5 steps; ``save``: 3 steps, saved while a hit waits for its gather; ``load``: the last 2."""
    adapter = Adapter("fsdp2")
    model = adapter.shard(info, mixed_precision=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    handle = adapter.apply(model, _config(True), optimizers=opt)
    steps = {"full": range(5), "save": range(3), "load": range(3, 5)}[mode]
    if mode == "load":
        load_sharded(model, opt, handle, ckpt_dir)
    losses = []
    for step in steps:
        x, y = (t.to(info.device) for t in batch(info.rank, step))
        loss = nn.functional.mse_loss(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    if mode == "save":
        assert handle.speculation.stats.hits == 2 * len(handle.units)  # steps 1 and 2; step 2's waits
        save_sharded(model, opt, handle, ckpt_dir)
    return {"losses": losses, "params": full_tensors(model), "stats": handle.speculation.stats}


def test_a_checkpoint_written_while_a_speculation_waits_resumes_exactly_and_keeps_counting(tmp_path):
    full = run_ranks(_resume, 2, str(tmp_path), "full")
    run_ranks(_resume, 2, str(tmp_path), "save")
    resumed = run_ranks(_resume, 2, str(tmp_path), "load")
    for rank in range(2):
        assert resumed[rank]["losses"] == full[rank]["losses"][3:]
        assert resumed[rank]["stats"] == full[rank]["stats"]  # the counts go on from the checkpoint's
        for name, value in full[rank]["params"].items():
            assert torch.equal(resumed[rank]["params"][name], value), name


def test_a_speculation_applied_to_another_input_stops_the_run():
    with pytest.raises(RuntimeError, match="a speculative update was applied to a gather whose input differs"):
        run_ranks(_run, 2, True, True)


def test_speculative_update_needs_the_difference_scheme_and_a_fixed_policy():
    with pytest.raises(ValueError, match="no unit uses the 'difference' weight scheme"):
        from_preset("w8g8", speculative_update=True)
    with pytest.raises(ValueError, match="needs policy='fixed'"):
        from_preset("w8g8", policy="auto", speculative_update=True)
    with pytest.raises(ValueError, match="sharded_reference=True"):
        from_preset("qwd-w3g3-loco", speculative_update=True, weight_scheme_options={"sharded_reference": True})


def _fsdp1(info: RankInfo) -> str:
    model = Adapter("fsdp1").shard(info)
    opt = torch.optim.AdamW(model.parameters())
    try:
        Adapter("fsdp1").apply(model, _config(True), optimizers=opt)
    except ValueError as err:
        return str(err)
    return ""


def test_speculative_update_is_refused_where_the_adapter_cannot_build_gather_inputs():
    assert "speculative_update is not supported by fsdp1" in run_ranks(_fsdp1, 2)[0]
