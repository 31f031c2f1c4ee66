"""The GPT network: token ids ``[batch, seq]`` -> next-token logits ``[batch, seq, padded_vocab]``."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from composer_qsdp.recipes.models.alibi import alibi_slopes, causal_alibi_bias
from composer_qsdp.recipes.models.config import GPTConfig

__all__ = ["GPT", "GPTBlock"]

# Marks the Linear layers that write into the residual stream. An attribute of the module, not its name: activation
# checkpointing and FSDP wrap the blocks, which changes every name below them.
_RESIDUAL = "_is_residual"


def _residual(linear: nn.Linear) -> nn.Linear:
    """``linear``, marked as a projection into the residual stream (initialised with the smaller std)."""
    setattr(linear, _RESIDUAL, True)
    return linear


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention through ``scaled_dot_product_attention``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.out_proj = _residual(nn.Linear(config.d_model, config.d_model))

    def forward(self, x: torch.Tensor, attn_bias: torch.Tensor | None) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        if attn_bias is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            # Under autocast q/k/v may be in a lower precision than the bias was built in.
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_bias.to(q.dtype))
        return self.out_proj(y.transpose(1, 2).reshape(b, s, d))


class MLP(nn.Module):
    """Two-layer GELU MLP of hidden width ``mlp_ratio * d_model``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.fc_in = nn.Linear(config.d_model, config.mlp_ratio * config.d_model)
        self.fc_out = _residual(nn.Linear(config.mlp_ratio * config.d_model, config.d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(F.gelu(self.fc_in(x)))


class GPTBlock(nn.Module):
    """One pre-LayerNorm transformer block; the unit that FSDP shards and gathers on its own."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_attn = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.attn = CausalSelfAttention(config)
        self.ln_mlp = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, attn_bias: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln_attn(x), attn_bias)
        return x + self.mlp(self.ln_mlp(x))


class GPT(nn.Module):
    """Decoder-only GPT.

    Composer's FSDP2 policy shards every direct child of a ``ComposerModel`` and then asks that child's
    :meth:`fsdp_wrap_fn` which of its submodules to shard separately; the whole network therefore lives in
    this one module and selects its :class:`GPTBlock` s.

    Args:
        config: the model's shape and initialisation.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.padded_vocab_size, config.d_model)
        self.wpe = nn.Embedding(config.max_seq_len, config.d_model) if config.position_embedding == "learned" else None
        self.blocks = nn.ModuleList(GPTBlock(config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(
            config.d_model, config.padded_vocab_size, bias=False)
        if config.position_embedding == "alibi":
            # Not persistent: derived from n_heads, so checkpoints need not carry it.
            self.register_buffer("alibi_slopes", alibi_slopes(config.n_heads), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Initialise every weight by :meth:`param_init_fn`, module by module."""
        for module in self.modules():
            self.param_init_fn(module)

    def param_init_fn(self, module: nn.Module) -> None:
        """Initialise the parameters and buffers of ``module``, a module of this GPT, but not its children's.

        Linear and embedding weights are drawn from normal(0, ``init_std``), biases are zero, LayerNorms one
        (weight) and zero (bias). The two projections that write into the residual stream (each block's
        ``attn.out_proj`` and ``mlp.fc_out``) get ``init_std / sqrt(2 * n_layers)``, as in GPT-2, so the residual's
        variance does not grow with depth. The GPT itself recomputes its ALiBi slopes.

        Composer's meta-device initialisation (``model.init_device: meta``) calls this on each module whose
        parameters it has just allocated on the GPU (sharded DTensors), children before parents; the same rules
        apply to a sharded tensor as to a whole one.

        Raises:
            TypeError: ``module`` has parameters of its own but no rule here says how to initialise them.
        """
        with torch.no_grad():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                std = self.config.init_std
                if getattr(module, _RESIDUAL, False):
                    std /= math.sqrt(2 * self.config.n_layers)
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
            elif any(True for _ in module.parameters(recurse=False)):
                # Left alone, these would keep whatever memory the meta initialisation allocated for them.
                raise TypeError(f"GPT.param_init_fn has no initialisation for the parameters of "
                                f"{type(module).__name__}")
            if module is self and self.config.position_embedding == "alibi":
                self.alibi_slopes.copy_(alibi_slopes(self.config.n_heads))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``[batch, seq, padded_vocab_size]`` for token ids ``[batch, seq]`` (``seq <= max_seq_len``)."""
        if tokens.dim() != 2:
            raise ValueError(f"GPT expects token ids of shape [batch, seq], got shape {tuple(tokens.shape)}")
        seq_len = tokens.shape[1]
        if seq_len > self.config.max_seq_len:
            raise ValueError(f"sequence of {seq_len} tokens is longer than max_seq_len={self.config.max_seq_len}")
        x = self.wte(tokens)
        attn_bias = None
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(seq_len, device=tokens.device))
        else:
            attn_bias = causal_alibi_bias(self.alibi_slopes, seq_len, x.dtype)
        for block in self.blocks:
            x = block(x, attn_bias)
        x = self.ln_f(x)
        weight = self.wte.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(x, weight)

    def fsdp_wrap_fn(self, module: nn.Module) -> bool:
        """Composer FSDP policy: shard each transformer block as its own unit."""
        return isinstance(module, GPTBlock)

    def activation_checkpointing_fn(self, module: nn.Module) -> bool:
        """Composer activation-checkpointing policy: recompute each block's activations in the backward."""
        return isinstance(module, GPTBlock)
