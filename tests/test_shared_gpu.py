"""Shared-GPU ranks: the device and backend each local rank gets for every ``shared_gpu`` setting and GPU count
(pure functions, a fake GPU count), the recipe key's checks, and on a GPU the Composer device it builds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from composer_qsdp.recipes.loader import RecipeError
from composer_qsdp.recipes.train import _device, load_recipe
from composer_qsdp.shared_gpu import (check_shared_gpu, check_shared_gpu_transport, check_state_dict_type,
                                      composer_device, gpu_placement, this_process_gpu)

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "yamls" / "cpu" / "gpt-tiny-baseline.yaml"


@pytest.mark.parametrize("setting", ["auto", False, "false"])
@pytest.mark.parametrize("ranks,gpus", [(1, 1), (2, 2), (4, 4), (2, 8)])
def test_enough_gpus_change_nothing_unless_forced(setting, ranks, gpus):
    for rank in range(ranks):
        placement = gpu_placement(setting, rank, ranks, gpus)
        assert (placement.device_id, placement.backend, placement.shared) == (rank, "nccl", False)
        assert placement.ranks_per_gpu == 1
        assert composer_device(placement) == "gpu"  # Composer's own device choice, as without the key


@pytest.mark.parametrize("setting", ["auto", True, "true", "TRUE"])
@pytest.mark.parametrize("ranks,gpus,per_gpu", [(2, 1, 2), (4, 1, 4), (4, 2, 2), (3, 2, 2), (8, 3, 3)])
def test_too_few_gpus_share_them_round_robin_over_gloo(setting, ranks, gpus, per_gpu):
    placements = [gpu_placement(setting, rank, ranks, gpus) for rank in range(ranks)]
    assert [p.device_id for p in placements] == [rank % gpus for rank in range(ranks)]
    assert {(p.backend, p.shared, p.ranks_per_gpu) for p in placements} == {("gloo", True, per_gpu)}
    # Every GPU serves ranks, and no GPU more than ranks_per_gpu.
    load = [sum(p.device_id == g for p in placements) for g in range(gpus)]
    assert min(load) >= 1 and max(load) == per_gpu
    assert placements[0].hyperparameters() == {"shared_gpu": True, "ranks_per_gpu": per_gpu, "dist_backend": "gloo",
                                               "visible_gpus": gpus}
    assert "not network measurements" in placements[0].describe()


def test_true_shares_even_with_a_gpu_per_rank():
    placements = [gpu_placement(True, rank, 2, 2) for rank in range(2)]
    assert [(p.device_id, p.backend, p.ranks_per_gpu) for p in placements] == [(0, "gloo", 1), (1, "gloo", 1)]


def test_the_transport_joins_shared_ranks_only():
    shared = [gpu_placement("auto", rank, 2, 1, "samedev") for rank in range(2)]
    assert {(p.backend, p.device_id) for p in shared} == {("samedev", 0)}
    assert "2 rank(s) on 1 GPU(s), up to 2 per GPU, samedev" in shared[0].describe()
    assert shared[0].hyperparameters()["dist_backend"] == "samedev"
    assert gpu_placement("auto", 1, 2, 2, "samedev").backend == "nccl"  # a GPU per rank: NCCL, whatever the key


@pytest.mark.parametrize("setting,ranks,gpus,world,message", [
    ("auto", 4, 2, 4, r"4 ranks on 2 visible GPUs share 2 of them \(rank r on cuda:r % 2\); make one GPU visible"),
    (True, 2, 2, 2, r"2 ranks on 2 visible GPUs share 2 of them"),
    ("auto", 2, 1, 4, r"the job has 4 ranks, 2 on this host; set shared_gpu_transport=gloo"),
])
def test_samedev_is_refused_where_shared_ranks_would_span_devices(setting, ranks, gpus, world, message):
    with pytest.raises(ValueError, match=r"shared_gpu_transport = samedev joins the ranks of one GPU, but " + message):
        gpu_placement(setting, 0, ranks, gpus, "samedev", world)
    for rank in range(ranks):  # gloo carries the same placements
        assert gpu_placement(setting, rank, ranks, gpus, "gloo", world).backend == "gloo"
    assert gpu_placement("auto", 0, 4, 1, "samedev", 4).device_id == 0  # one GPU, one host: allowed


def test_an_unregistered_transport_is_refused_naming_the_call_that_registers_it(monkeypatch):
    import composer_qsdp.shared_gpu as shared_gpu

    monkeypatch.setattr(shared_gpu, "dist_backends", lambda: ["gloo", "nccl"])  # a process that registered nothing
    with pytest.raises(ValueError, match=r"'samedev' is not a torch.distributed backend in this process yet: call "
                                         r"composer_qsdp.comm.register_same_device_backend\(\) first"):
        composer_device(gpu_placement(True, 1, 2, 1, "samedev"))


@pytest.mark.parametrize("value,hint", [("samedevice", "; did you mean 'samedev'?"), ("nccl", ""), (None, "")])
def test_bad_transports_are_refused_with_the_allowed_ones(value, hint):
    with pytest.raises(ValueError, match=rf"shared_gpu_transport = {value!r} is invalid; allowed: gloo .*, samedev "
                                         rf"\(.*\){hint.replace('?', '[?]')}$"):
        check_shared_gpu_transport(value)
    with pytest.raises(ValueError, match="shared_gpu_transport"):
        gpu_placement("auto", 0, 2, 1, value)


def test_recipe_transport_key_defaults_to_gloo_and_refuses_others_naming_the_key():
    assert load_recipe(BASELINE, ["data.local=unused"]).cfg.shared_gpu_transport == "gloo"
    assert load_recipe(BASELINE, ["data.local=unused", "shared_gpu_transport=samedev"]).cfg.shared_gpu_transport \
        == "samedev"
    with pytest.raises(RecipeError, match=r"recipe key 'shared_gpu_transport': shared_gpu_transport = 'ipc' is "
                                          r"invalid; allowed: gloo"):
        load_recipe(BASELINE, ["data.local=unused", "shared_gpu_transport=ipc"])


def test_false_with_too_few_gpus_is_refused_naming_the_switch():
    with pytest.raises(ValueError, match=r"shared_gpu = false needs a GPU per rank: 4 ranks .* 1 GPU.*shared_gpu=auto"):
        gpu_placement(False, 0, 4, 1)


@pytest.mark.parametrize("setting", ["auto", True, False])
def test_no_gpu_is_refused(setting):
    with pytest.raises(ValueError, match="needs a visible CUDA GPU, found none"):
        gpu_placement(setting, 0, 2, 0)


@pytest.mark.parametrize("value", ["yes", "sometimes", 1, 0, None, 2.0])
def test_bad_settings_are_refused_with_the_allowed_values(value):
    with pytest.raises(ValueError, match=rf"shared_gpu = {value!r} is invalid; allowed: auto .* true .* false"):
        check_shared_gpu(value)


def test_local_rank_outside_the_host_is_refused():
    with pytest.raises(ValueError, match=r"local rank 2 is outside \[0, 2\)"):
        gpu_placement("auto", 2, 2, 1)


@pytest.mark.parametrize("value,expected", [("auto", "auto"), ("false", False), ("FALSE", False)])
def test_recipe_key_takes_its_settings(value, expected):  # true: below (it needs device: gpu)
    recipe = load_recipe(BASELINE, ["data.local=unused", f"shared_gpu={value}"])
    assert check_shared_gpu(recipe.cfg.shared_gpu) == expected


def test_recipe_key_default_is_auto():
    assert load_recipe(BASELINE, ["data.local=unused"]).cfg.shared_gpu == "auto"


def test_recipe_refuses_a_bad_value_naming_the_key():
    with pytest.raises(RecipeError, match=r"recipe key 'shared_gpu': shared_gpu = 'sometimes' is invalid; allowed"):
        load_recipe(BASELINE, ["data.local=unused", "shared_gpu=sometimes"])


def test_recipe_refuses_forced_sharing_on_cpu():
    with pytest.raises(RecipeError, match=r"recipe key 'shared_gpu' = True is invalid; .* needs device: gpu"):
        load_recipe(BASELINE, ["data.local=unused", "shared_gpu=true"])


#: What the refusal of full FSDP2 checkpoints on shared GPUs says: both keys, why, and what works.
FULL_REFUSED = (r"fsdp.state_dict_type = 'full' cannot be saved with shared_gpu .* functional all-gather .* gloo "
                r"cannot run on CUDA tensors .*pytorch/pytorch#152645.* use fsdp.state_dict_type=sharded")


def test_full_checkpoints_are_refused_only_when_ranks_share_gpus():
    with pytest.raises(ValueError, match=FULL_REFUSED):
        check_state_dict_type(True, "full")
    for shared, kind in [(True, "sharded"), (True, None), (False, "full"), (False, "sharded")]:
        check_state_dict_type(shared, kind)  # nothing to refuse


def _one_gpu_two_ranks(monkeypatch):
    """This process as local rank 1 of 2 on a host that shows one GPU (shared_gpu=auto shares it)."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")


def test_this_process_gpu_refuses_full_checkpoints_before_building_a_device(monkeypatch):
    _one_gpu_two_ranks(monkeypatch)  # no CUDA needed: the refusal comes before any device exists
    with pytest.raises(ValueError, match=FULL_REFUSED):
        this_process_gpu("auto", "full")


def test_recipe_with_forced_sharing_refuses_full_checkpoints_when_loaded():
    with pytest.raises(RecipeError, match=FULL_REFUSED):
        load_recipe(BASELINE, ["data.local=unused", "device=gpu", "precision=amp_bf16", "shared_gpu=true",
                               "fsdp.state_dict_type=full"])


def test_recipe_refuses_full_checkpoints_where_auto_shares_the_gpus(monkeypatch):
    # shared_gpu=auto cannot know at load time whether the GPUs are too few: the recipe loads, the run refuses.
    recipe = load_recipe(BASELINE, ["data.local=unused", "device=gpu", "precision=amp_bf16",
                                    "fsdp.state_dict_type=full"])
    _one_gpu_two_ranks(monkeypatch)
    with pytest.raises(RecipeError, match="recipe key 'device' = 'gpu': " + FULL_REFUSED):
        _device(recipe)


@pytest.mark.gpu
def test_shared_device_is_composers_gpu_device_with_its_shared_transport(monkeypatch):
    import composer.devices
    from composer.devices import DeviceGPU
    from composer.utils import get_device

    monkeypatch.setattr(composer.devices, "DeviceGPU", DeviceGPU)  # restored after the test
    monkeypatch.setenv("LOCAL_RANK", "1")  # rank 1 of 2 on one GPU: Composer's own default would be cuda:1
    device = composer_device(gpu_placement(True, 1, 2, 1))
    assert isinstance(device, DeviceGPU) and device.dist_backend == "gloo"
    from composer_qsdp.comm import register_same_device_backend

    register_same_device_backend()
    device = composer_device(gpu_placement(True, 1, 2, 1, "samedev"))
    assert isinstance(device, DeviceGPU) and device.dist_backend == "samedev"
    assert device._device == torch.device("cuda", 0) and torch.cuda.current_device() == 0
    # Where Composer builds "this rank's device" itself, it gets the shared one too, with its transport.
    again = get_device(None)
    assert isinstance(again, DeviceGPU) and again.dist_backend == "samedev" and again._device == torch.device("cuda", 0)
    assert DeviceGPU.dist_backend == "nccl"  # the class itself keeps NCCL
