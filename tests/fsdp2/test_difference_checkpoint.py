"""The weight-difference scheme's checkpoint across a world-size change: saved on 2 ranks, loaded on 4, on FSDP2 and
on FSDP1 (whose flat parameters pad differently for 2 and 4 ranks)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from dist_spawn import RankInfo, run_ranks
from sharded_mlp import Adapter
from test_fsdp_training import LR, QWD, Capture, _train, batch



def _world_change_side(info: RankInfo, ckpt_dir: str, mode: str, adapter: Adapter) -> dict:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    model = adapter.shard(info)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    handle = adapter.apply(model, QWD, optimizers=opt)
    state = {"model": get_model_state_dict(model), "qsdp": handle.state_dict()}
    if mode == "save":  # two steps, then a forward and backward: the reference is the current step's weights
        _train(info, model, 2, opt)
        x, y = batch(info.rank, 2)
        nn.functional.mse_loss(model(x), y).backward()
        state = {"model": get_model_state_dict(model), "qsdp": handle.state_dict()}
        dcp.save(state, checkpoint_id=ckpt_dir)
        return {u.name: u.weights.layout.split(u.weights.reference) for u in handle.units}
    dcp.load(state, checkpoint_id=ckpt_dir)
    set_model_state_dict(model, state["model"])
    handle.load_state_dict(state["qsdp"])
    capture = Capture(model)
    model(batch(info.rank, 2)[0])
    return {"forward": dict(capture.forward), "sent": handle.traffic().weights.sent,
            "saved_sent": sum(u["weights"]["traffic"]["sent"] for u in state["qsdp"]["units"])}


@pytest.mark.slow  # 2 then 4 spawned ranks: about a minute on 2 cores
@pytest.mark.parametrize("adapter", ["fsdp2", "fsdp1"])
def test_weight_difference_reference_survives_a_world_size_change(tmp_path, adapter):
    saved = run_ranks(_world_change_side, 2, str(tmp_path), "save", Adapter(adapter))[0]
    for res in run_ranks(_world_change_side, 4, str(tmp_path), "load", Adapter(adapter)):
        assert res["sent"] == res["saved_sent"]  # the restored reference is current: the gathers send nothing
        for name in ("l1", "l2", "l3"):  # rebuilt for 4 ranks from the per-parameter checkpoint, exactly
            assert torch.equal(res["forward"][name], saved[name]["weight"]), name
            assert torch.equal(res["forward"][f"{name}.bias"], saved[name]["bias"]), name
