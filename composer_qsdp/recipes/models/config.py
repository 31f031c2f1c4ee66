"""GPT shape and initialisation settings, and the named presets of the paper's GPT experiments."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from composer_qsdp._names import did_you_mean

__all__ = ["GPTConfig", "GPT_PRESETS", "GPT2_VOCAB_SIZE", "gpt_config"]

#: Tokens in the GPT-2 BPE vocabulary (50,256 merges + ``<|endoftext|>``).
GPT2_VOCAB_SIZE = 50257

POSITION_EMBEDDINGS = ("learned", "alibi")


@dataclass(frozen=True)
class GPTConfig:
    """Shape of a decoder-only GPT (pre-LayerNorm, GELU MLP, causal self-attention).

    Attributes:
        d_model: width of the residual stream (elements per token).
        n_layers: number of transformer blocks.
        n_heads: attention heads; must divide ``d_model``.
        max_seq_len: longest sequence the model accepts (tokens).
        vocab_size: tokens in the tokenizer's vocabulary (GPT-2: 50257).
        pad_vocab_to_multiple: the embedding and output head get ``vocab_size`` rounded up to a multiple of
            this (tokens), which keeps the head's matmul on fast tile sizes; 1 disables padding.
        mlp_ratio: MLP hidden width as a multiple of ``d_model``.
        position_embedding: ``"learned"`` (GPT-2 absolute positions) or ``"alibi"`` (linear attention biases,
            as MosaicML's GPT offered).
        tie_word_embeddings: the output head reuses the token embedding matrix (GPT-2 does).
        init_std: standard deviation of the normal initialisation of weight matrices and embeddings.
        layer_norm_eps: epsilon of every LayerNorm.
    """

    d_model: int
    n_layers: int
    n_heads: int
    max_seq_len: int = 2048
    vocab_size: int = GPT2_VOCAB_SIZE
    pad_vocab_to_multiple: int = 64
    mlp_ratio: int = 4
    position_embedding: str = "learned"
    tie_word_embeddings: bool = True
    init_std: float = 0.02
    layer_norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("d_model", "n_layers", "n_heads", "max_seq_len", "vocab_size", "pad_vocab_to_multiple",
                     "mlp_ratio"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GPTConfig.{name}={value!r} is invalid; it must be an integer >= 1")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"GPTConfig.n_heads={self.n_heads} does not divide d_model={self.d_model}; "
                "d_model must be a multiple of n_heads"
            )
        if self.position_embedding not in POSITION_EMBEDDINGS:
            raise ValueError(
                f"GPTConfig.position_embedding={self.position_embedding!r} is invalid; allowed: "
                f"{', '.join(POSITION_EMBEDDINGS)}"
            )
        if not isinstance(self.tie_word_embeddings, bool):
            raise ValueError(f"GPTConfig.tie_word_embeddings={self.tie_word_embeddings!r} must be true or false")
        for name in ("init_std", "layer_norm_eps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"GPTConfig.{name}={value!r} is invalid; it must be a number > 0")

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the embedding and the output head: ``vocab_size`` rounded up to ``pad_vocab_to_multiple``."""
        m = self.pad_vocab_to_multiple
        return -(-self.vocab_size // m) * m

    @property
    def head_dim(self) -> int:
        """Elements per attention head."""
        return self.d_model // self.n_heads


#: The paper's GPT shapes (MosaicML GPT configs: sequence 2048, GPT-2 vocabulary) and a tiny CPU model.
GPT_PRESETS: dict[str, GPTConfig] = {
    "125m": GPTConfig(d_model=768, n_layers=12, n_heads=12),
    "350m": GPTConfig(d_model=1024, n_layers=24, n_heads=16),
    "1.3b": GPTConfig(d_model=2048, n_layers=24, n_heads=16),
    "6.7b": GPTConfig(d_model=4096, n_layers=32, n_heads=32),
    # GPT-3's 13B (Brown et al., 2020, Table 2.1) lists width 5140 for 40 heads of 128; 5120 = 40 x 128 divides.
    "13b": GPTConfig(d_model=5120, n_layers=40, n_heads=40),
    # Small enough that a CPU step with the full 50K-token head stays well under a second.
    "tiny": GPTConfig(d_model=64, n_layers=2, n_heads=4, max_seq_len=64),
}


def gpt_config(preset: str | None = None, **overrides: Any) -> GPTConfig:
    """Build a :class:`GPTConfig` from a named preset and field overrides.

    Args:
        preset: a key of :data:`GPT_PRESETS` (``"125m"``, ``"350m"``, ``"1.3b"``, ``"6.7b"``, ``"13b"``, ``"tiny"``), or None to give
            every required field (``d_model``, ``n_layers``, ``n_heads``) in ``overrides``.
        **overrides: :class:`GPTConfig` fields that replace the preset's values.

    Raises:
        ValueError: unknown preset or field, missing field, or an invalid value.
    """
    fields = {f.name for f in dataclasses.fields(GPTConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"unknown GPT config field(s) {', '.join(unknown)}{did_you_mean(unknown[0], fields)}; "
                         f"allowed: {', '.join(sorted(fields))}")
    if preset is None:
        missing = [f.name for f in dataclasses.fields(GPTConfig)
                   if f.default is dataclasses.MISSING and f.name not in overrides]
        if missing:
            raise ValueError(f"GPT config without a preset needs {', '.join(missing)}; or set a preset "
                             f"({', '.join(GPT_PRESETS)})")
        return GPTConfig(**overrides)
    if preset not in GPT_PRESETS:
        raise ValueError(f"unknown GPT preset {preset!r}; allowed: {', '.join(GPT_PRESETS)}")
    return dataclasses.replace(GPT_PRESETS[preset], **overrides)
