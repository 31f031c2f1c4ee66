"""Models for the paper's experiments: a decoder-only GPT and its Composer wrapper, and Hugging Face causal LMs.

``ComposerGPT(gpt_config("125m"))`` builds the paper's 125M model; the presets are in :data:`GPT_PRESETS`.
``build_hf_causal_lm(hf_causal_lm_config(...))`` wraps a ``transformers`` causal LM (see :mod:`.hf`).

The configs load without torch or Composer (the recipe entrypoint checks them before anything heavy is
imported); the networks load on first access.
"""

from __future__ import annotations

import importlib
from typing import Any

from composer_qsdp.recipes.models.config import GPT2_VOCAB_SIZE, GPT_PRESETS, GPTConfig, gpt_config
from composer_qsdp.recipes.models.hf import HFCausalLMConfig, build_hf_causal_lm, causal_lm_batch, hf_causal_lm_config

_LAZY = {
    "ComposerGPT": "composer_qsdp.recipes.models.composer_gpt",
    "GPT": "composer_qsdp.recipes.models.gpt",
    "GPTBlock": "composer_qsdp.recipes.models.gpt",
}

__all__ = ["ComposerGPT", "GPT", "GPTBlock", "GPTConfig", "GPT_PRESETS", "GPT2_VOCAB_SIZE", "HFCausalLMConfig",
           "build_hf_causal_lm", "causal_lm_batch", "gpt_config", "hf_causal_lm_config"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'composer_qsdp.recipes.models' has no attribute {name!r}")
