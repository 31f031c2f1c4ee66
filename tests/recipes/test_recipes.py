"""Every recipe in yamls/ parses, validates and builds its model (on the meta device), and the paper recipes carry
the paper's hyperparameters."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from composer_qsdp.config import from_preset
from composer_qsdp.recipes.models import ComposerGPT, HFCausalLMConfig, build_hf_causal_lm
from composer_qsdp.auto import AutoOptions
from composer_qsdp.recipes.loader import build_algorithm
from composer_qsdp.recipes.train import RecipeError, load_recipe

ROOT = Path(__file__).resolve().parents[2]
# yamls/base/ holds partial settings that recipes extend; they are not recipes themselves. yamls/llm-foundry/ holds
# llm-foundry's yamls, trained by llm-foundry (tests/integrations/test_llm_foundry.py).
RECIPES = sorted(p for p in (ROOT / "yamls").rglob("*.yaml") if p.parent.name not in ("base", "llm-foundry"))
PAPER_C4 = ["data.remote=s3://bucket/c4-gpt2-t2048"]
# Paper-family recipes that train with DDP (no sharding) instead of FSDP.
DDP_RECIPES = {"ddp-baseline", "zero-one-adam"}

# model dir -> (preset, d_model, layers, heads, global batch, lr, nominal parameters): the GPT-3 sizes (Brown et
# al., 2020, Table 2.1) that QSDP's experiments train.
PAPER = {
    "gpt-125m": ("125m", 768, 12, 12, 256, 6e-4, 125e6),
    "gpt-350m": ("350m", 1024, 24, 16, 256, 3e-4, 350e6),
    "gpt-1.3b": ("1.3b", 2048, 24, 16, 512, 2e-4, 1.3e9),
    "gpt-6.7b": ("6.7b", 4096, 32, 32, 1024, 1.2e-4, 6.7e9),
    "gpt-13b": ("13b", 5120, 40, 40, 1024, 1.0e-4, 13e9),
}


def test_recipes_cover_the_paper_grid():
    names = {p.relative_to(ROOT / "yamls").as_posix() for p in RECIPES}
    for model in PAPER:
        assert {f"{model}/baseline.yaml", f"{model}/qsdp-w8g8.yaml", f"{model}/qsdp-w4g4.yaml"} <= names
    assert {"cpu/gpt-tiny-baseline.yaml", "cpu/gpt-tiny-qsdp.yaml", "cpu/hf-gpt2-tiny-qsdp.yaml"} <= names


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.relative_to(ROOT / "yamls").as_posix())
def test_recipe_validates_and_builds_its_model(path):
    paper = PAPER.get(path.parent.name)
    recipe = load_recipe(path, PAPER_C4 if paper else [])
    cfg, config = recipe.cfg, recipe.model_config
    with torch.device("meta"):
        model = build_hf_causal_lm(config) if isinstance(config, HFCausalLMConfig) else ComposerGPT(config)
    n_params = sum(p.numel() for p in model.parameters())

    if paper:
        preset, d_model, n_layers, n_heads, batch, lr, nominal = paper
        assert (config.d_model, config.n_layers, config.n_heads) == (d_model, n_layers, n_heads)
        assert config.max_seq_len == 2048 and config.padded_vocab_size == 50304
        assert abs(n_params - nominal) / nominal < 0.05
        assert cfg.global_train_batch_size == batch and cfg.optimizer.lr == lr
        assert list(cfg.optimizer.betas) == [0.9, 0.95] and cfg.optimizer.weight_decay == 0.0
        assert cfg.scheduler.t_warmup == "100ba" and cfg.scheduler.alpha_f == 0.1
        assert cfg.grad_clip_norm == 1.0 and cfg.precision == "amp_bf16" and cfg.device == "gpu"
        assert (cfg.fsdp is None) == (path.stem in DDP_RECIPES) and cfg.data.remote == PAPER_C4[0].split("=", 1)[1]
        assert cfg.run_name == f"{path.parent.name}-{path.stem}"
        assert "memory_monitor" in recipe.callback_kwargs  # the benchmarks' peak memory (the metrics file)
    else:
        assert cfg.device == "cpu" and cfg.precision == "fp32" and cfg.fsdp is not None
        assert n_params < 5e6  # a CPU model
        # The main job builds data/wiki-gpt2-t<seq> for exactly this context length.
        assert cfg.data.local == f"data/wiki-gpt2-t{config.max_seq_len}"
    # The large GPTs initialise each shard on its GPU; DDP cannot, and the smaller recipes keep the CPU init that
    # their convergence records used.
    meta = path.parent.name in ("gpt-1.3b", "gpt-6.7b", "gpt-13b") and cfg.fsdp is not None
    assert recipe.init_device == ("meta" if meta else "cpu")
    # The benchmarks' and the notebook's step times are the speed monitor's time/train.
    assert recipe.callback_kwargs["speed_monitor"] == {"window_size": 10}

    bits = re.fullmatch(r".*qsdp-w(\d)g(\d)", path.stem)
    if bits:
        config = build_algorithm("qsdp", recipe.algorithm_kwargs["qsdp"]).config
        assert (config.weights.bits, config.grads.bits) == (int(bits[1]), int(bits[2]))
        if path.stem == "qsdp-w8g4":  # the preset's LoCo gradients, not the paper's w8g4-paper
            assert recipe.algorithm_kwargs == {"qsdp": {"preset": "w8g4"}} and config == from_preset("w8g4")
    elif path.stem.endswith("qsdp"):
        assert recipe.algorithm_kwargs["qsdp"]["weight_bits"] == 8
    elif path.stem in ("sdp4bit", "qwd-w4g4", "qwd-w4g2-loco", "qwd-w4g3-loco", "qwd-w3g3-loco", "qwd-w3g2-loco",
                       "zeropp"):
        assert recipe.algorithm_kwargs == {"qsdp": {"preset": path.stem}}
        assert build_algorithm("qsdp", recipe.algorithm_kwargs["qsdp"]).config == from_preset(path.stem)
    elif path.stem == "qwd-w3g3-loco-lean":  # the preset with its reference and residual divided by the node
        lean = from_preset("qwd-w3g3-loco", grad_scheme="two_level_loco",
                           weight_scheme_options={"sharded_reference": True})
        assert build_algorithm("qsdp", recipe.algorithm_kwargs["qsdp"]).config == lean
    elif path.stem == "qsdp-auto":  # the policy's recipe value, built into the algorithm at validation
        qsdp = build_algorithm("qsdp", recipe.algorithm_kwargs["qsdp"])
        assert qsdp.policy == "auto" and qsdp.config.auto_options == AutoOptions(**recipe.algorithm_kwargs["qsdp"]
                                                                                  ["auto_options"])
    elif path.stem == "zero-one-adam":  # a dense 8-bit variance phase for a quarter of the run, local steps up to 4
        zoa = recipe.algorithm_kwargs["zero_one_adam"]
        assert zoa["var_freeze_step"] == "0.25dur" and zoa["var_update_scaler"] > 1000
        assert zoa["variance_codec"] == "symmetric" and zoa["local_step_clipper"] == 4
    else:
        assert recipe.algorithm_kwargs == {}


def test_recipe_with_an_unknown_policy_names_the_allowed_ones():
    with pytest.raises(RecipeError, match="algorithms.qsdp' is invalid: .*unknown policy 'autoo'; did you mean "
                                          "'auto'\\?; allowed: auto, fixed"):
        load_recipe(ROOT / "yamls" / "gpt-1.3b" / "qsdp-auto.yaml", [*PAPER_C4, "algorithms.qsdp.policy=autoo"])
    with pytest.raises(RecipeError, match="policy='auto' chooses .*'weight_bits'"):
        load_recipe(ROOT / "yamls" / "gpt-1.3b" / "qsdp-auto.yaml", [*PAPER_C4, "algorithms.qsdp.weight_bits=8"])


def test_paper_recipe_demands_a_data_location():
    with pytest.raises(RecipeError, match="missing required key\\(s\\): data.remote"):
        load_recipe(ROOT / "yamls" / "gpt-125m" / "baseline.yaml")


def test_benchmark_style_overrides_apply():
    recipe = load_recipe(ROOT / "yamls" / "gpt-1.3b" / "qsdp-w8g8.yaml",
                         ["max_duration=20ba", "model.max_seq_len=1024", "data.remote=null", "data.local=/data/c4",
                          "algorithms.qsdp.weight_bits=6", "run_name=bench"])
    assert recipe.cfg.max_duration == "20ba" and recipe.model_config.max_seq_len == 1024
    assert recipe.cfg.data.remote is None and recipe.algorithm_kwargs["qsdp"]["weight_bits"] == 6
    assert recipe.cfg.save_folder == "runs/bench/checkpoints"  # interpolations follow the overridden run_name
