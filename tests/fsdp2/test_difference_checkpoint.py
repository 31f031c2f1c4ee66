"""The weight-difference scheme's checkpoint across a world-size change: saved on 2 ranks, loaded on 4, on FSDP2 and
on FSDP1 (whose flat parameters pad differently for 2 and 4 ranks); and across the reference's variants on FSDP2:
saved sharded within the node on 4 ranks as 2 nodes x 2, loaded replicated on 2."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from dist_spawn import RankInfo, run_ranks
from sharded_mlp import Adapter
from test_fsdp_training import LR, QWD, Capture, _train, batch

from composer_qsdp.config import from_preset

# QWD with the reference sharded over 2 ranks per node
QWD_SHARDED = from_preset("w8g8", weight_scheme="difference", weight_bits=4, weight_codec="symmetric", bucket_size=64,
                          seed=7, ranks_per_node=2, weight_scheme_options={"sharded_reference": True})


def _world_change_side(info: RankInfo, ckpt_dir: str, mode: str, adapter: Adapter, config=QWD) -> dict:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    model = adapter.shard(info)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    handle = adapter.apply(model, config, optimizers=opt)
    state = {"model": get_model_state_dict(model), "qsdp": handle.state_dict()}
    if mode == "save":  # two steps, then a forward and backward: the reference is the current step's weights
        _train(info, model, 2, opt)
        x, y = batch(info.rank, 2)
        nn.functional.mse_loss(model(x), y).backward()
        state = {"model": get_model_state_dict(model), "qsdp": handle.state_dict()}
        dcp.save(state, checkpoint_id=ckpt_dir)
        return {u.name: s["weights"]["reference"] for u, s in zip(handle.units, state["qsdp"]["units"])}
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


@pytest.mark.slow  # 4 then 2 spawned ranks: about a minute on 2 cores
def test_a_sharded_reference_resumes_replicated_on_another_world_size(tmp_path):
    adapter = Adapter("fsdp2")
    saved = run_ranks(_world_change_side, 4, str(tmp_path), "save", adapter, QWD_SHARDED)
    for name in ("l1", "l2", "l3"):  # the whole reference, gathered within each node, the same on every rank
        for rank in range(1, 4):
            assert torch.equal(saved[rank][name]["weight"], saved[0][name]["weight"]), (name, rank)
    for res in run_ranks(_world_change_side, 2, str(tmp_path), "load", adapter):
        assert res["sent"] == res["saved_sent"]  # current: served from the restored replica
        for name in ("l1", "l2", "l3"):
            assert torch.equal(res["forward"][name], saved[0][name]["weight"]), name
            assert torch.equal(res["forward"][f"{name}.bias"], saved[0][name]["bias"]), name
