"""GPT initialisation: ``GPT.param_init_fn`` module by module (the order Composer's meta-device initialisation
visits them: children before parents), the CPU init that runs it over the whole model, and Composer's real
``meta_init`` on a model built on the meta device and sharded by FSDP2, activation checkpointing included."""

from __future__ import annotations

import dataclasses
import math
import os

import pytest
import torch
from composer.core import Precision
from composer.distributed.prepare_distributed import parallelize_composer_model
from composer.utils import FSDP2Config
from torch import nn
from torch.distributed.tensor import DTensor

from composer_qsdp.recipes.models import GPT, ComposerGPT, gpt_config
from composer_qsdp.recipes.models.alibi import alibi_slopes

# Four layers: the residual projections' std, 0.02 / sqrt(8), is far from init_std at these sample sizes.
CONFIGS = {
    "tied-learned": gpt_config("tiny", n_layers=4, vocab_size=1000),
    "untied-alibi": gpt_config("tiny", n_layers=4, vocab_size=1000, tie_word_embeddings=False,
                               position_embedding="alibi"),
}


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _assert_normal(name: str, t: torch.Tensor, std: float) -> None:
    """``t`` looks like i.i.d. normal(0, std) draws: its sample mean and std within 6 standard errors (a false
    failure about once in 10**8 tensors): std/sqrt(n) for the mean, std/sqrt(2n) for the sample std."""
    n = t.numel()
    assert abs(t.mean().item()) < 6 * std / math.sqrt(n), f"{name}: mean {t.mean().item():.3g}"
    assert abs(t.std().item() - std) < 6 * std / math.sqrt(2 * n), f"{name}: std {t.std().item():.4g} != {std:.4g}"


def assert_follows_the_init_rules(gpt: GPT) -> None:
    """Every parameter of ``gpt`` initialised by the rules, checked by name against the model's layout (the
    reference: not the residual flag that the model itself reads)."""
    config = gpt.config
    std, residual_std = config.init_std, config.init_std / math.sqrt(2 * config.n_layers)
    params = {name.replace("_checkpoint_wrapped_module.", ""): _full(p.detach())
              for name, p in gpt.named_parameters()}
    assert all(torch.isfinite(p).all() for p in params.values()), "a parameter was left uninitialised"
    expected_names = {"wte.weight", "ln_f.weight", "ln_f.bias"}
    expected_names |= {"wpe.weight"} if config.position_embedding == "learned" else set()
    expected_names |= set() if config.tie_word_embeddings else {"lm_head.weight"}
    for i in range(config.n_layers):
        expected_names |= {f"blocks.{i}.{m}.{p}" for m in ("ln_attn", "ln_mlp") for p in ("weight", "bias")}
        expected_names |= {f"blocks.{i}.{m}.{p}" for m in ("attn.qkv", "attn.out_proj", "mlp.fc_in", "mlp.fc_out")
                           for p in ("weight", "bias")}
    assert set(params) == expected_names
    for name, p in params.items():
        if ".ln_" in name or name.startswith("ln_f."):
            assert torch.equal(p, torch.ones_like(p) if name.endswith("weight") else torch.zeros_like(p)), name
        elif name.endswith("bias"):
            assert torch.equal(p, torch.zeros_like(p)), name
        elif name.endswith(("attn.out_proj.weight", "mlp.fc_out.weight")):
            _assert_normal(name, p, residual_std)
        else:
            _assert_normal(name, p, std)
    if config.position_embedding == "alibi":
        assert torch.equal(gpt.alibi_slopes.cpu(), alibi_slopes(config.n_heads))


def _children_first(module: nn.Module) -> list[nn.Module]:
    """``module`` and its descendants in the order of Composer's ``meta_init``: children before their parent."""
    return [m for child in module.children() for m in _children_first(child)] + [module]


# Captured before any test patches it.
_TO_EMPTY = nn.Module.to_empty


def _allocate_as_nan(module: nn.Module) -> None:
    """Allocate ``module``'s own meta parameters and buffers on the CPU, as NaN: a tensor that the init skips then
    shows as NaN instead of plausible leftover memory."""
    _TO_EMPTY(module, device="cpu", recurse=False)
    with torch.no_grad():
        for t in (*module.parameters(recurse=False), *module.buffers(recurse=False)):
            if t.is_floating_point():
                t.fill_(float("nan"))


def _cuda_to_cpu_as_nan(module: nn.Module, *, device: str, recurse: bool = True) -> nn.Module:
    """``nn.Module.to_empty`` as Composer's meta_init calls it (``device='cuda'``, one module at a time), allocating
    on the CPU as NaN instead, so that CPU tests run the real meta_init."""
    assert str(device) == "cuda" and not recurse
    _allocate_as_nan(module)
    return module


@pytest.mark.parametrize("name", CONFIGS)
def test_param_init_fn_module_by_module_follows_the_rules(name):
    torch.manual_seed(0)
    with torch.device("meta"):
        gpt = GPT(CONFIGS[name])
    for module in _children_first(gpt):
        _allocate_as_nan(module)
        gpt.param_init_fn(module)
    assert_follows_the_init_rules(gpt)


@pytest.mark.parametrize("name", CONFIGS)
def test_cpu_init_follows_the_rules(name):
    torch.manual_seed(0)
    assert_follows_the_init_rules(GPT(CONFIGS[name]))


def test_param_init_fn_refuses_a_module_it_has_no_rule_for():
    gpt = GPT(CONFIGS["tied-learned"])
    with pytest.raises(TypeError, match="no initialisation for the parameters of Conv1d"):
        gpt.param_init_fn(nn.Conv1d(2, 2, 1))


@pytest.mark.parametrize("name", CONFIGS)
def test_composer_meta_init_of_the_sharded_model_follows_the_rules(name, one_rank, monkeypatch):
    # Composer's meta_init allocates on device 'cuda' (hard-coded); this CPU test allocates on the CPU instead.
    monkeypatch.setattr(nn.Module, "to_empty", _cuda_to_cpu_as_nan)
    torch.manual_seed(0)
    with torch.device("meta"):
        model = ComposerGPT(CONFIGS[name])
    # Activation checkpointing wraps every block, so the residual projections' names change.
    parallelize_composer_model(model, None, FSDP2Config(activation_checkpointing=True), Precision.FP32)
    gpt = model.model
    assert isinstance(gpt.wte.weight, DTensor) and not any(p.is_meta for p in model.parameters())
    assert any("_checkpoint_wrapped_module" in n for n, _ in gpt.named_parameters())
    assert_follows_the_init_rules(gpt)
    if gpt.config.tie_word_embeddings:  # the head is the embedding matrix itself, not a copy of it
        assert gpt.lm_head is None
    tokens = torch.randint(0, gpt.config.vocab_size, (2, 16))
    assert torch.isfinite(model(tokens)).all()


# ------------------------------------------------------------------------------- through the recipe entrypoint
def _checking_meta_init(monkeypatch) -> list[GPT]:
    """Make Composer's FSDP2 preparation check the GPT right after its real ``meta_init``; returns the list of the
    GPTs it checked."""
    import composer.distributed.prepare_distributed as prepare_distributed

    real, checked = prepare_distributed.meta_init, []

    def meta_init_then_check(module: nn.Module, *args, **kwargs) -> None:
        real(module, *args, **kwargs)
        assert_follows_the_init_rules(module.model)
        checked.append(module.model)

    monkeypatch.setattr(prepare_distributed, "meta_init", meta_init_then_check)
    return checked


def test_a_recipe_trains_from_a_meta_model_on_the_cpu(tmp_path, monkeypatch):
    """The recipe path of ``model.init_device: meta`` (the model built on meta, the optimizer set up on it, Composer's
    FSDP2 preparation materialising both) on one CPU process. The recipe refuses meta on the CPU because Composer's
    meta_init allocates on CUDA; this test sets it on the checked recipe and allocates those tensors on the CPU."""
    from test_train import BASELINE, synthetic_shards, tiny_overrides, train_losses

    from composer_qsdp.recipes.train import load_recipe, train

    monkeypatch.setattr(nn.Module, "to_empty", _cuda_to_cpu_as_nan)
    checked = _checking_meta_init(monkeypatch)
    shards = synthetic_shards(tmp_path / "shards", 32)
    recipe = load_recipe(BASELINE, tiny_overrides(shards, tmp_path, "max_duration=2ba", "data.eval_split=null",
                                                  "save_folder=null"))
    train(dataclasses.replace(recipe, init_device="meta"))
    assert len(checked) == 1
    losses = train_losses(tmp_path)
    assert sorted(losses) == [0, 1] and all(math.isfinite(loss) for loss in losses.values())


@pytest.mark.gpu
def test_gpu_recipe_with_meta_init_trains_from_weights_that_follow_the_rules(tmp_path, monkeypatch):
    from test_train import BASELINE, synthetic_shards, tiny_overrides, train_losses

    from composer_qsdp.recipes.train import main

    checked = _checking_meta_init(monkeypatch)
    shards = synthetic_shards(tmp_path / "shards", 32)
    assert main([str(BASELINE), *tiny_overrides(shards, tmp_path, "max_duration=2ba", "data.eval_split=null",
                                                "save_folder=null", "device=gpu", "precision=amp_bf16",
                                                "model.init_device=meta")]) == 0
    assert len(checked) == 1 and checked[0].wte.weight.device.type == "cuda"
    losses = train_losses(tmp_path)
    assert sorted(losses) == [0, 1] and all(math.isfinite(loss) for loss in losses.values())


def _meta_init_on_each_rank(info, name: str) -> torch.Tensor:
    """Rank body: Composer's FSDP2 preparation of a meta-built GPT over the ranks' GPUs; checks the gathered weights
    against the rules and returns this rank's shard of the token embedding."""
    # Composer's get_device() picks the GPU by LOCAL_RANK; ranks sharing one GPU (over gloo) both use its index.
    os.environ["LOCAL_RANK"] = str(info.device.index)
    torch.manual_seed(0)
    with torch.device("meta"):
        model = ComposerGPT(CONFIGS[name])
    parallelize_composer_model(model, None, FSDP2Config(), Precision.FP32)
    assert_follows_the_init_rules(model.model)  # gathers every weight: all ranks call it
    return model.model.wte.weight.to_local().detach().cpu()


@pytest.mark.gpu
def test_gpu_meta_init_draws_each_shard_once_over_two_ranks():
    """Each rank draws its own shard: identical generators on both ranks would give the full matrix two copies of
    one half, which no per-rank check sees."""
    from dist_spawn import run_ranks

    first, second = run_ranks(_meta_init_on_each_rank, 2, "untied-alibi", backend="nccl")
    assert first.shape == second.shape and not torch.equal(first, second)
