"""The per-unit plan on real FSDP2 units, apply_qsdp / remove_qsdp, the step boundary and the handle's state, mostly
in one process (a 1-rank gloo group); a second mesh on two spawned ranks."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from dist_spawn import RankInfo, run_ranks
from torch.distributed.fsdp import fully_shard

from composer_qsdp.fsdp2 import compat, find_units, shard_group
from composer_qsdp.config import QSDPConfig, SideConfig
from composer_qsdp.engine import plan_units
from composer_qsdp.fsdp2 import apply_qsdp, remove_qsdp


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, 16)
        self.blocks = nn.ModuleList([nn.Linear(16, 16) for _ in range(3)])
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 100)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.embed(idx)
        for block in self.blocks:
            h = torch.relu(block(h))
        return self.head(self.norm(h))


def _sharded() -> Net:
    from torch.distributed.device_mesh import init_device_mesh

    net = Net()
    mesh = init_device_mesh("cpu", (1,))
    for module in (net.embed, *net.blocks, net.head):
        fully_shard(module, mesh=mesh)
    fully_shard(net, mesh=mesh)  # the root manages what is left: the norm
    return net


# ------------------------------------------------------------------------------------------------ policy
def test_policy_applies_exclude_filter_min_numel_and_overrides(one_rank):
    net = _sharded()
    config = QSDPConfig(exclude=["embed"], min_numel=100,
                        module_filter=lambda module, name: not isinstance(module, nn.LayerNorm),
                        weights=SideConfig(bits_overrides={"blocks.2": 4, "head": None}),
                        grads=SideConfig(bits_overrides={"blocks.*": 6}))
    plans = {p.name: p for p in plan_units(find_units(net), config)}
    assert list(plans) == ["", "embed", "blocks.0", "blocks.1", "blocks.2", "head"]
    assert plans["embed"].weights.codec is None and plans["embed"].grads.codec is None
    assert "excluded by 'embed'" in plans["embed"].note and not plans["embed"].quantized
    assert plans[""].numel == 32 and plans[""].weights.codec is None  # the norm: below min_numel
    assert "min_numel=100" in plans[""].note
    assert plans["blocks.0"].weights.codec.bits == 8 and plans["blocks.0"].grads.codec.bits == 6
    assert plans["blocks.2"].weights.codec.bits == 4
    assert plans["head"].weights.codec is None and plans["head"].grads.codec.bits == 8
    assert plans["head"].numel == 16 * 100 + 100
    assert plans["blocks.1"].weights.codec is not plans["blocks.0"].weights.codec  # one codec per unit
    assert "head (1700 elements): weights=unquantized" in plans["head"].describe()


def test_patterns_that_match_no_unit_are_reported_with_the_unit_names(one_rank):
    net = _sharded()
    config = QSDPConfig(exclude=["embed", "embedding"], grads=SideConfig(bits_overrides={"block.*": 4}))
    with pytest.warns(UserWarning) as caught:
        plan_units(find_units(net), config)
    messages = [str(w.message) for w in caught]
    assert any("exclude pattern(s) ['embedding'] match no unit; the units are ['', 'embed', 'blocks.0'" in m
               for m in messages), messages
    assert any("grad_bits_overrides pattern(s) ['block.*'] match no unit" in m for m in messages), messages


def test_module_filter_sees_module_and_name(one_rank):
    net = _sharded()
    seen = []
    config = QSDPConfig(module_filter=lambda module, name: seen.append((module, name)) or "head" != name)
    plans = {p.name: p for p in plan_units(find_units(net), config)}
    assert (net.head, "head") in seen and (net.embed, "embed") in seen and len(seen) == 6
    assert plans["head"].note == "excluded by module_filter" and plans["blocks.0"].quantized


def test_shard_group_is_the_group_fsdp_uses(one_rank):
    net = _sharded()
    for unit in find_units(net):
        assert shard_group(unit.module) is unit.module._get_fsdp_state()._fsdp_param_group.mesh_info.shard_process_group


def _second_mesh_worker(info: RankInfo) -> tuple[bool, int, int]:
    from torch.distributed.device_mesh import DeviceMesh

    groups = [dist.new_group(list(range(info.world_size))) for _ in range(2)]
    nets = []
    for group in groups:
        net, mesh = Net(), DeviceMesh.from_group(group, "cpu")
        for module in (net.embed, *net.blocks, net.head):
            fully_shard(module, mesh=mesh)
        fully_shard(net, mesh=mesh)
        nets.append(net)
    bound = all(shard_group(u.module) is groups[1] for u in find_units(nets[1]))
    handle = apply_qsdp(nets[1])
    nets[1](torch.randint(0, 100, (2, 4))).sum().backward()
    traffic = handle.traffic()
    return bound, traffic.weights.calls, traffic.grads.calls


def test_a_second_mesh_of_the_same_shape_keeps_its_own_group():
    """DTensor gives the second model's parameters the first mesh (equal shape): QSDP must still bind the
    group FSDP2 passes, or the first all-gather fails the scheme's group check (as on a GPU host, where each
    ``init_device_mesh`` over a gloo group makes a new group)."""
    for bound, gathers, reduces in run_ranks(_second_mesh_worker, 2):
        assert bound and gathers > 0 and reduces > 0


@pytest.mark.requires_custom_comm
def test_apply_and_remove_install_and_restore_the_comms(one_rank):
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

    net = _sharded()
    handle = apply_qsdp(net)
    group = net.head._get_fsdp_state()._fsdp_param_group
    assert group._all_gather_comm.handle is handle and group._all_gather_comm.unit_index == 5
    with pytest.raises(ValueError, match="already applied"):
        apply_qsdp(net)
    net(torch.tensor([[1, 2, 3]])).sum().backward()  # world size 1: FSDP sends nothing to quantize
    assert handle.seeds.microbatch == 1 and handle.traffic().total.calls == 0
    remove_qsdp(net)
    assert isinstance(group._all_gather_comm, DefaultAllGather)
    assert isinstance(group._reduce_scatter_comm, DefaultReduceScatter)
    with pytest.raises(ValueError, match="not applied"):
        remove_qsdp(net)
    apply_qsdp(net)  # applicable again after removal


def test_apply_rejects_models_without_fsdp2():
    with pytest.raises(ValueError, match="has no FSDP2 module: apply torch.distributed.fsdp.fully_shard"):
        apply_qsdp(Net())


def test_the_comm_path_is_checked_before_anything_is_installed(one_rank, monkeypatch):
    net = _sharded()
    with pytest.raises(ValueError, match=r"comm_path='nccl' is invalid; allowed: 'custom', 'proxy' or None"):
        apply_qsdp(net, comm_path="nccl")
    monkeypatch.setattr(compat, "HAS_CUSTOM_COMM_API", False)  # torch 2.6-2.8
    with pytest.raises(RuntimeError, match=r"custom-collective path needs .*torch 2.9; this is torch"):
        apply_qsdp(net, comm_path="custom")
    assert apply_qsdp(net).comm_path == "proxy"  # the default there
    remove_qsdp(net)


def test_the_proxy_path_marks_each_unit_and_restores_fsdp(one_rank):
    import torch.distributed.fsdp._fully_shard._fsdp_collectives as collectives

    net, other = _sharded(), _sharded()
    handle = apply_qsdp(net, comm_path="proxy")
    assert handle.describe().startswith("fsdp2 (proxy: a proxy for torch.distributed in FSDP2's _fsdp_collectives")
    groups = [u.module._get_fsdp_state()._fsdp_param_group for u in handle.units]
    assert all({"unshard", "post_backward"} <= vars(g).keys() for g in groups)  # on the instances only
    assert collectives.dist is not dist and collectives.dist.ReduceOp is dist.ReduceOp
    for model in (net, other):  # world size 1: nothing to quantize, and `other` has no QSDP
        model(torch.tensor([[1, 2, 3]])).sum().backward()
    assert handle.seeds.microbatch == 1 and handle.traffic().total.calls == 0
    remove_qsdp(net)
    assert collectives.dist is dist
    assert not any({"unshard", "post_backward"} & vars(g).keys() for g in groups)


def test_optimizer_steps_are_the_step_boundary(one_rank):
    net = _sharded()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    handle = apply_qsdp(net, optimizers=opt)
    for _ in range(2):  # two microbatches of gradient accumulation, then the step
        net(torch.tensor([[1, 2, 3]])).sum().backward()
    assert (handle.seeds.optimizer_step, handle.seeds.microbatch) == (0, 2)
    opt.step()
    assert (handle.seeds.optimizer_step, handle.seeds.microbatch) == (1, 0)
    remove_qsdp(net)
    opt.step()  # removed: the optimizer hook is gone too
    assert handle.seeds.optimizer_step == 1
    with pytest.raises(ValueError, match="must be torch.optim.Optimizer objects, got str"):
        apply_qsdp(_sharded(), optimizers=["sgd"])


def test_without_named_optimizers_the_models_optimizer_steps_are_the_boundary(one_rank):
    """A ``foreach`` step (torch's default on CUDA) of FSDP2's DTensor parameters bumps no version counter, so
    qWD served its first reference for ever when no optimizer was named (found on GPU): the global step hook
    makes any optimizer holding the model's parameters the step boundary, and only such optimizers."""
    net = _sharded()
    handle = apply_qsdp(net, QSDPConfig.from_preset("qwd-w4g4"))
    opt = torch.optim.SGD(net.parameters(), lr=0.5, foreach=True)
    unrelated = torch.optim.SGD([nn.Parameter(torch.zeros(3))], lr=0.1)
    seen: list[torch.Tensor] = []
    net.blocks[0].register_forward_pre_hook(lambda module, _: seen.append(module.weight.detach().clone()))
    initial = net.blocks[0].weight.full_tensor().detach().clone()
    for step in range(3):
        net(torch.tensor([[1, 2, 3]])).sum().backward()
        opt.step()
        opt.zero_grad()
        unrelated.step()
        assert handle.seeds.optimizer_step == step + 1
    net(torch.tensor([[1, 2, 3]]))
    exact = net.blocks[0].weight.full_tensor().detach()
    moved = (exact - initial).norm()
    assert moved > 0.05 * initial.norm()
    assert (seen[-1] - exact).norm() < 0.05 * moved  # the forward computes with this step's weights
    handle.attach_optimizer(opt)  # named later: its own hook replaces the global one, one boundary per step
    opt.step()
    assert handle.seeds.optimizer_step == 4
    remove_qsdp(net)
    opt.step()
    assert handle.seeds.optimizer_step == 4
    dropped = apply_qsdp(_sharded())  # never removed: the global hook must not keep it alive
    alive = weakref.ref(dropped)
    del dropped
    gc.collect()
    assert alive() is None
    opt.step()


def _in_place_edit_worker(info: RankInfo) -> tuple[list[str], list[str], list[str], bool]:
    from torch.distributed.device_mesh import init_device_mesh

    net, mesh = Net(), init_device_mesh("cpu", (info.world_size,))
    for module in (net.embed, *net.blocks, net.head):
        fully_shard(module, mesh=mesh)
    fully_shard(net, mesh=mesh)
    handle = apply_qsdp(net, QSDPConfig.from_preset("qwd-w4g4"))
    changed: list[str] = []
    for unit in handle.units:
        unit.weights.on_weights_changed = lambda name=unit.name: changed.append(name)
    unit = next(u for u in handle.units if u.name == "blocks.1")
    readers_agree = (handle.weight_versions(unit.params) == compat.weight_versions(unit.params)
                     and len(handle.weight_versions(unit.params)) == len(unit.params) == 2)
    x = torch.randint(0, 100, (2, 3))
    net(x).sum().backward()
    untouched = list(changed)
    with torch.no_grad():
        net.blocks[1].weight.mul_(0.5)
        net.blocks[1](torch.randn(2, 16))  # the unit alone, as an evaluation that bypasses the model's hooks
    seen_alone = list(changed)
    net(x).sum().backward()  # nothing new since that gather
    return untouched, seen_alone, changed, readers_agree


def test_an_in_place_weight_change_outside_a_step_is_seen_through_the_version_counters():
    """FSDP2's handle reads its units' version counters (fsdp2/compat.py) at each quantized gather: an in-place edit
    between two steps' gathers, no optimizer step, tells that unit's weight-difference scheme to rebuild its
    reference, once, and only that unit's, also where the gather runs outside the model's forward (the unit called
    alone, as Composer's ``eval_forward`` calls the inner model). Two ranks: on one, FSDP2 gathers nothing."""
    for untouched, seen_alone, changed, readers_agree in run_ranks(_in_place_edit_worker, 2):
        assert readers_agree
        assert untouched == [] and seen_alone == changed == ["blocks.1"]


def test_state_dict_round_trips_and_rejects_other_models(one_rank):
    handle = apply_qsdp(_sharded())
    handle.seeds.optimizer_step, handle.seeds.microbatch = 41, 3
    handle.units[2].grads.traffic.sent = 99
    state = handle.state_dict()
    other = apply_qsdp(_sharded())
    other.load_state_dict(state)
    assert (other.seeds.optimizer_step, other.seeds.microbatch) == (41, 3)
    assert other.units[2].grads.traffic.sent == 99 and other.state_dict() == state
    state["units"] = state["units"][:2]
    with pytest.raises(ValueError, match="QSDP state has 2 units but this model has 6"):
        other.load_state_dict(state)


def test_loads_the_first_state_format(one_rank):
    handle = apply_qsdp(_sharded())
    counters = [{"calls": 2, "sent": 10 * i, "bf16": 20, "native": 40} for i in range(6)]
    handle.load_state_dict({"step": 7, "weights": counters, "grads": counters})
    assert (handle.seeds.optimizer_step, handle.seeds.microbatch) == (0, 7)
    assert handle.units[3].weights.traffic.sent == 30 and handle.units[3].grads.traffic.inter_node == 0
