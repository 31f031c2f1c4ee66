"""Hugging Face causal LMs for the recipes: the config checks name the bad key, a local pretrained directory loads
its own weights, and the Composer wrapper's loss is the next-token cross entropy of the shards' samples."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from composer_qsdp.recipes.models import build_hf_causal_lm, causal_lm_batch, hf_causal_lm_config

transformers = pytest.importorskip("transformers")

TINY = {"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32, "n_positions": 16, "vocab_size": 50257}


@pytest.mark.parametrize("kwargs,message", [
    ({}, "give exactly one of config"),
    ({"config": TINY, "pretrained_model_name_or_path": "/x"}, "give exactly one of config"),
    ({"config": {**TINY, "n_layers": 3}}, "GPT2Config has no field 'n_layers'; did you mean 'n_layer'?"),
    ({"config": {**TINY, "model_type": "gtp2"}}, "config.model_type='gtp2' is not a transformers model type; did you "
                                                 "mean 'gpt2'?"),
    ({"config": {"n_layer": 2}}, "config needs a model_type"),
    ({"config": TINY, "max_seq_len": 32}, "max_seq_len=32 exceeds the model's max_position_embeddings=16"),
    ({"config": TINY, "max_seq_len": 0}, "max_seq_len=0 is invalid"),
    ({"config": TINY, "pretrained": True}, "pretrained: true needs pretrained_model_name_or_path"),
    ({"config": TINY, "config_overrides": {"n_embed": 8}}, "config_overrides: GPT2Config has no field 'n_embed'; "
                                                            "did you mean 'n_embd'?"),
    ({"config": {"model_type": "t5"}}, "model_type 't5' has no causal-LM model"),
])
def test_bad_configs_name_the_key(kwargs, message):
    with pytest.raises(ValueError) as err:
        hf_causal_lm_config(**kwargs)
    assert message in str(err.value)


def test_directories_need_config_and_weights(tmp_path):
    with pytest.raises(ValueError, match="must be a local directory holding config.json .nothing is downloaded"):
        hf_causal_lm_config(pretrained_model_name_or_path=str(tmp_path / "gpt2"))
    transformers.AutoConfig.for_model(**TINY).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="holds no weights .* set pretrained: false"):
        hf_causal_lm_config(pretrained_model_name_or_path=str(tmp_path))
    spec = hf_causal_lm_config(pretrained_model_name_or_path=str(tmp_path), pretrained=False,
                               config_overrides={"num_hidden_layers": 3})  # a transformers alias of n_layer
    assert spec.weights is None and spec.config.n_layer == 3 and spec.max_seq_len == 16


def test_pretrained_directory_loads_its_weights(tmp_path):
    torch.manual_seed(0)
    saved = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**TINY))
    saved.save_pretrained(tmp_path)
    spec = hf_causal_lm_config(pretrained_model_name_or_path=str(tmp_path), max_seq_len=8)
    assert spec.weights == str(tmp_path) and spec.block_classes == ("GPT2Block",)
    torch.manual_seed(1)  # random initialisation would now give other weights
    model = build_hf_causal_lm(spec)
    for (name, loaded), expected in zip(model.model.state_dict().items(), saved.state_dict().values()):
        assert torch.equal(loaded, expected), name


def test_loss_is_next_token_cross_entropy():
    torch.manual_seed(0)
    model = build_hf_causal_lm(hf_causal_lm_config(config=TINY))
    samples = [torch.randint(0, 50257, (16,)) for _ in range(3)]
    batch = causal_lm_batch(samples)
    assert batch["labels"] is not batch["input_ids"]  # Composer's eval_forward shifts labels in place
    outputs = model(batch)  # one forward: GPT-2's dropout makes each forward differ
    logits = outputs.logits
    expected = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), torch.stack(samples)[:, 1:].reshape(-1))
    assert torch.allclose(model.loss(outputs, batch), expected, rtol=1e-5)
    # FSDP units and activation checkpointing: exactly the transformer blocks.
    wrapped = [name for name, m in model.model.named_modules() if model.model.fsdp_wrap_fn(m)]
    assert wrapped == ["transformer.h.0", "transformer.h.1"]
