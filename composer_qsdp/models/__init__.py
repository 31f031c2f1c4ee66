"""GPT models for the paper's experiments: a decoder-only network and its Composer wrapper.

``ComposerGPT(gpt_config("125m"))`` builds the paper's 125M model; the presets are in :data:`GPT_PRESETS`.
"""

from composer_qsdp.models.composer_gpt import ComposerGPT
from composer_qsdp.models.config import GPT2_VOCAB_SIZE, GPT_PRESETS, GPTConfig, gpt_config
from composer_qsdp.models.gpt import GPT, GPTBlock

__all__ = ["ComposerGPT", "GPT", "GPTBlock", "GPTConfig", "GPT_PRESETS", "GPT2_VOCAB_SIZE", "gpt_config"]
