"""A Hugging Face causal LM in Composer's ``HuggingFaceModel`` with ``QSDP()`` gets one FSDP unit per transformer
block (GPT-2 and a Llama-style model, configs built offline), as a real in-process Composer FSDP2 Trainer wraps it;
a model's own choice of units is kept; a single unit without a choice is warned about."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
from composer import Trainer
from composer.models import HuggingFaceModel
from composer.utils import FSDP2Config
from torch.distributed.fsdp import FSDPModule

from composer_qsdp import QSDP
from composer_qsdp.algorithms.qsdp import per_block_fsdp_units

transformers = pytest.importorskip("transformers")

GPT2 = {"model_type": "gpt2", "n_layer": 3, "n_head": 2, "n_embd": 32, "n_positions": 16, "vocab_size": 128}
LLAMA = {"model_type": "llama", "num_hidden_layers": 3, "num_attention_heads": 2, "num_key_value_heads": 1,
         "hidden_size": 32, "intermediate_size": 64, "max_position_embeddings": 16, "vocab_size": 128}


def _hf_model(config: dict) -> HuggingFaceModel:
    torch.manual_seed(0)
    network = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
    return HuggingFaceModel(network, use_logits=True, shift_labels=True)


def _fsdp_units(model: nn.Module) -> list[str]:
    return [name for name, module in model.named_modules() if isinstance(module, FSDPModule)]


@pytest.mark.parametrize("config,blocks", [(GPT2, "model.transformer.h"), (LLAMA, "model.model.layers")])
def test_qsdp_gives_each_transformer_block_its_own_unit(config, blocks):
    model = _hf_model(config)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="QSDP does nothing with world size 1")
        trainer = Trainer(model=model, device="cpu", parallelism_config={"fsdp": FSDP2Config()},
                          algorithms=[QSDP()], progress_bar=False)
    assert _fsdp_units(trainer.state.model) == ["model", *(f"{blocks}.{i}" for i in range(3))]
    trainer.close()


def test_plain_composer_makes_the_same_model_one_unit():
    """The reference: without QSDP, Composer wraps the whole network as one unit."""
    trainer = Trainer(model=_hf_model(GPT2), device="cpu", parallelism_config={"fsdp": FSDP2Config()},
                      progress_bar=False)
    assert _fsdp_units(trainer.state.model) == ["model"]
    trainer.close()


def test_a_models_own_choice_is_kept():
    model = _hf_model(LLAMA)
    model.model.fsdp_wrap_fn = lambda module: isinstance(module, nn.Embedding)
    assert per_block_fsdp_units(model) == []
    assert model.model.fsdp_wrap_fn(model.model.model.embed_tokens)
    assert not model.model.fsdp_wrap_fn(model.model.model.layers[0])
    fresh = _hf_model(LLAMA)
    assert per_block_fsdp_units(fresh) == ["model: LlamaDecoderLayer"]


def test_one_unit_without_blocks_warns_with_the_fix():
    class OneNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))

    fix = r"Sequential \('net' of the OneNet\) has no fsdp_wrap_fn.*fsdp_wrap_fn\(module\)"
    with pytest.warns(UserWarning, match=fix):
        assert per_block_fsdp_units(OneNet()) == []
