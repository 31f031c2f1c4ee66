"""ALiBi (Press et al., 2022): per-head linear attention biases that replace position embeddings."""

from __future__ import annotations

import math

import torch

__all__ = ["alibi_slopes", "causal_alibi_bias"]


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """The ALiBi slope of each head, a float32 tensor of ``n_heads`` elements.

    For a power-of-two head count the slopes are the geometric sequence ``2**(-8 * i / n_heads)``,
    ``i = 1..n_heads``; otherwise the paper's recipe is used: the slopes of the next lower power of two,
    then every other slope of twice that count.
    """
    if isinstance(n_heads, bool) or not isinstance(n_heads, int) or n_heads < 1:
        raise ValueError(f"n_heads={n_heads!r} is invalid; it must be an integer >= 1")

    def power_of_two_slopes(n: int) -> list[float]:
        return [2.0 ** (-8.0 * i / n) for i in range(1, n + 1)]

    lower = 2 ** math.floor(math.log2(n_heads))
    slopes = power_of_two_slopes(lower)
    if lower != n_heads:
        slopes += power_of_two_slopes(2 * lower)[0::2][: n_heads - lower]
    return torch.tensor(slopes, dtype=torch.float32)


def causal_alibi_bias(slopes: torch.Tensor, seq_len: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive attention mask ``[n_heads, seq_len, seq_len]`` combining ALiBi and causality.

    Entry ``[h, i, j]`` is ``-slopes[h] * (i - j)`` for keys ``j <= i`` and ``-inf`` for future keys, so it can
    be passed as the float ``attn_mask`` of ``scaled_dot_product_attention``.
    """
    pos = torch.arange(seq_len, device=slopes.device)
    distance = (pos[:, None] - pos[None, :]).to(torch.float32)
    bias = -slopes.to(torch.float32)[:, None, None] * distance
    bias = bias.masked_fill(distance < 0, float("-inf"))
    return bias.to(dtype)
