"""QSDPConfig validation, the per-unit policy and apply_qsdp's errors, in one process (a 1-rank gloo group)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FSDPModule, fully_shard

from composer_qsdp.fsdp import QSDPConfig, apply_qsdp, plan_units, remove_qsdp
from composer_qsdp.fsdp.seeding import StepSeeds


@pytest.fixture
def one_rank():
    """A real single-rank gloo group for fully_shard.

    In-process Composer tests leave their 1-rank default group behind (Composer never destroys it), so an
    existing 1-rank group is reused; a group this fixture created is torn down after the test.
    """
    if dist.is_initialized():
        assert dist.get_world_size() == 1, "a multi-rank default group leaked into an in-process test"
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


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


# ------------------------------------------------------------------------------------------------ config
def test_defaults_are_the_paper_headline_setting():
    config = QSDPConfig()
    assert (config.weight_bits, config.grad_bits, config.bucket_size) == (8, 8, 1024)
    for side in ("weights", "grads"):  # rounding=None: the min-max codec's default, stochastic (unbiased)
        codec = config.make_codec(side, 8)
        assert codec.name == "minmax" and codec.rounding == "stochastic" and codec.unbiased


@pytest.mark.parametrize("kwargs,message", [
    (dict(weight_bits=9), r"weight codec 'minmax'.*bits=9 is not supported"),
    (dict(grad_bits=0), r"grad codec 'minmax'.*bits=0"),
    (dict(weight_bits=8.0), r"weight_bits has bits=8.0"),
    (dict(grad_codec="nope"), r"unknown codec 'nope'"),
    (dict(weight_rounding="up"), r"rounding='up' is not supported"),
    (dict(bucket_size=0), r"bucket_size=0 is invalid"),
    (dict(min_numel=-5), r"min_numel=-5 is invalid"),
    (dict(error_sample_interval=1.5), r"error_sample_interval=1.5 is invalid"),
    (dict(exclude="*.wte"), r"exclude='\*.wte' is invalid; it must be a list"),
    (dict(exclude=[3]), r"exclude contains 3"),
    (dict(grad_bits_overrides={"head": 12}), r"grad codec .*bits=12"),
    (dict(weight_bits_overrides=["head"]), r"weight_bits_overrides=\['head'\] is invalid; it must be a mapping"),
    (dict(seed=-1), r"seed=-1 is invalid"),
    (dict(check_finite="yes"), r"check_finite='yes' is invalid"),
    (dict(grad_codec_options={"colour": 1}), r"invalid option for codec 'minmax'"),
    (dict(weight_codec_options={"bits": 4}), r"weight_codec_options sets \['bits'\]; use the QSDPConfig fields"),
    (dict(grad_codec="symmetric", grad_rounding="nearest"), r"invalid option for codec 'symmetric'"),
])
def test_bad_options_raise_value_errors_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        QSDPConfig(**kwargs)


@pytest.mark.parametrize("codec", ["symmetric", "random_shift", "learned"])
def test_codecs_without_a_rounding_option_work_with_the_defaults(codec):
    config = QSDPConfig(weight_codec=codec, grad_codec=codec, weight_codec_options={"hadamard": True})
    assert config.make_codec("grads", 4).bits == 4


def test_yaml_containers_are_normalized():
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"exclude": ["embed"], "weight_bits_overrides": {"head": 4}})
    config = QSDPConfig(exclude=cfg.exclude, weight_bits_overrides=cfg.weight_bits_overrides)
    assert config.exclude == ("embed",) and config.weight_bits_overrides == {"head": 4}


def test_step_seeds_differ_by_step_unit_and_side_and_repeat_within_a_step():
    seeds = StepSeeds(7)
    first = seeds.seed(0, "weights")
    assert seeds.seed(0, "weights") == first  # forward and backward of one step
    assert len({first, seeds.seed(1, "weights"), seeds.seed(0, "grads")}) == 3
    seeds.advance()
    assert seeds.seed(0, "weights") != first


# ------------------------------------------------------------------------------------------------ policy
def test_policy_applies_exclude_min_numel_and_overrides(one_rank):
    net = _sharded()
    config = QSDPConfig(exclude=["embed"], min_numel=100, weight_bits_overrides={"blocks.2": 4, "head": None},
                        grad_bits_overrides={"blocks.*": 6})
    plans = {p.name: p for p in plan_units(net, config)}
    assert list(plans) == ["", "embed", "blocks.0", "blocks.1", "blocks.2", "head"]
    assert plans["embed"].weight_codec is None and plans["embed"].grad_codec is None
    assert "excluded by 'embed'" in plans["embed"].note
    assert plans[""].numel == 32 and plans[""].weight_codec is None  # the norm: below min_numel
    assert "min_numel=100" in plans[""].note
    assert plans["blocks.0"].weight_codec.bits == 8 and plans["blocks.0"].grad_codec.bits == 6
    assert plans["blocks.2"].weight_codec.bits == 4
    assert plans["head"].weight_codec is None and plans["head"].grad_codec.bits == 8
    assert plans["head"].numel == 16 * 100 + 100
    assert plans["blocks.1"].weight_codec is not plans["blocks.0"].weight_codec  # one codec per unit
    assert "head (1700 elements): weights=unquantized" in plans["head"].describe()


@pytest.mark.requires_custom_comm
def test_apply_and_remove_install_and_restore_the_comms(one_rank):
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

    net = _sharded()
    handle = apply_qsdp(net)
    group = net.head._get_fsdp_state()._fsdp_param_group
    assert group._all_gather_comm is handle._all_gathers[-1]
    with pytest.raises(ValueError, match="already applied"):
        apply_qsdp(net)
    net(torch.tensor([[1, 2, 3]])).sum().backward()  # world size 1: FSDP sends nothing to quantize
    assert handle.seeds.step == 1 and handle.traffic().total.calls == 0
    remove_qsdp(net)
    assert isinstance(group._all_gather_comm, DefaultAllGather)
    assert isinstance(group._reduce_scatter_comm, DefaultReduceScatter)
    with pytest.raises(ValueError, match="not applied"):
        remove_qsdp(net)
    apply_qsdp(net)  # applicable again after removal


@pytest.mark.requires_custom_comm
def test_apply_rejects_models_without_fsdp2():
    with pytest.raises(ValueError, match="has no FSDP2 module: apply torch.distributed.fsdp.fully_shard"):
        apply_qsdp(Net())


@pytest.mark.requires_custom_comm
def test_apply_rejects_torch_without_custom_collectives(monkeypatch):
    monkeypatch.delattr(FSDPModule, "set_custom_all_gather")
    with pytest.raises(RuntimeError, match=r"torch 2.9"):
        apply_qsdp(Net())


@pytest.mark.requires_custom_comm
def test_state_dict_round_trips_and_rejects_other_models(one_rank):
    handle = apply_qsdp(_sharded())
    handle.seeds.step = 41
    state = handle.state_dict()
    other = apply_qsdp(_sharded())
    other.load_state_dict(state)
    assert other.seeds.step == 41
    state["grads"] = state["grads"][:2]
    with pytest.raises(ValueError, match="counters for 2 FSDP units but this model has 6"):
        other.load_state_dict(state)
