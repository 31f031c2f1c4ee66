"""A small GPT trained on a learnable synthetic language by data-parallel ranks, with AdamW (exact mean gradients,
clipped, as DDP) or ZeroOneAdam (local gradients, the optimizer communicates): the convergence check of 0/1 Adam.

The language: a fixed random bigram model over ``VOCAB`` tokens whose next-token rows are Zipf-like, so that some
tokens are rare and their embedding rows see a gradient only now and then (the rows whose stale variance made 0/1
Adam blow up on GPT-125M). The loss floor is the bigram entropy. ``python tests/optim/zero_one_training.py`` prints
the comparison (2 gloo ranks).
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

VOCAB = 512
SEQ = 32
MICRO = 8  # sequences per rank per step


def _language(seed: int = 0) -> torch.Tensor:
    """Next-token probabilities ``[VOCAB, VOCAB]``: a Zipf-like unigram sharpened per row."""
    gen = torch.Generator().manual_seed(seed)
    unigram = 1.0 / torch.arange(1, VOCAB + 1, dtype=torch.float64) ** 1.1
    logits = torch.randn(VOCAB, VOCAB, generator=gen, dtype=torch.float64) * 2.0 + unigram.log()
    return torch.softmax(logits, dim=-1)


def _sample(probs: torch.Tensor, n: int, gen: torch.Generator) -> torch.Tensor:
    tokens = torch.empty(n, SEQ + 1, dtype=torch.long)
    tokens[:, 0] = torch.multinomial(probs.sum(0), n, replacement=True, generator=gen)
    for i in range(SEQ):
        tokens[:, i + 1] = torch.multinomial(probs[tokens[:, i]], 1, generator=gen).squeeze(1)
    return tokens


def _lr(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warm-up, then cosine to 0.1 x peak (the recipes' schedule)."""
    if step <= warmup:
        return peak * step / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def train(rank: int, world: int, optimizer: str, steps: int, options: dict[str, Any] | None = None,
          peak_lr: float = 3e-3, warmup: int | None = None, clip: float | None = 1.0, seed: int = 0) -> dict:
    """Train on this rank (the default process group must exist); returns the mean train loss of every step (mean
    over ranks), the validation loss of the final (synchronized) weights, and the traffic ratio for ZeroOneAdam.

    Args:
        optimizer: ``"adamw"`` (torch AdamW on the all-reduced, clipped mean gradient: DDP) or ``"zero_one_adam"``.
        options: ZeroOneAdam's keyword arguments.
        warmup: warm-up steps (default: a tenth of ``steps``).
        clip: the global gradient-norm bound (``max_grad_norm`` of ZeroOneAdam).
    """
    from composer_qsdp.recipes.models.config import GPTConfig
    from composer_qsdp.recipes.models.gpt import GPT
    from composer_qsdp.optim import ZeroOneAdam

    warmup = warmup if warmup is not None else max(1, steps // 10)
    torch.manual_seed(seed)
    model = GPT(GPTConfig(d_model=64, n_layers=2, n_heads=4, max_seq_len=SEQ, vocab_size=VOCAB))
    betas = (0.9, 0.95)
    local_clip = False
    if optimizer == "adamw":
        opt: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=peak_lr, betas=betas, eps=1e-8,
                                                       weight_decay=0.0)
    else:
        options = dict(options or {})
        # local_clip: clip each rank's own gradient before the step (Composer's GradientClipping under DDP's
        # local-gradient hook) instead of the optimizer's clipping of the mean.
        local_clip = options.pop("local_clip", False)
        if not local_clip:
            options.setdefault("max_grad_norm", clip)
        opt = ZeroOneAdam(model.parameters(), lr=peak_lr, betas=betas, eps=1e-8, bias_correction=True, **options)
    probs = _language()
    data_gen = torch.Generator().manual_seed(1000 + seed * 100 + rank)
    losses = []
    for step in range(1, steps + 1):
        for group in opt.param_groups:
            group["lr"] = _lr(step, steps, peak_lr, warmup)
        tokens = _sample(probs, MICRO, data_gen)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if optimizer == "adamw":
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
        if (optimizer == "adamw" or local_clip) and clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(float(mean) / world)
    val = _sample(probs, 64, torch.Generator().manual_seed(999))
    with torch.no_grad():
        logits = model(val[:, :-1])
        val_loss = float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), val[:, 1:].reshape(-1)))
    out = {"losses": losses, "val": val_loss}
    if isinstance(opt, ZeroOneAdam):
        out["ratio"] = opt.traffic().ratio_vs_native
        out["interval"] = opt.schedule.local_step_interval
        out["between_syncs"] = opt.schedule.between_syncs
    return out


def entropy() -> float:
    """The language's loss floor (nats per token, stationary-weighted approximately by the unigram)."""
    probs = _language()
    pi = torch.full((VOCAB,), 1.0 / VOCAB, dtype=torch.float64)
    for _ in range(200):
        pi = pi @ probs
    return float(-(pi[:, None] * probs * probs.log()).sum())


def _worker(info: Any, arms: dict[str, tuple[str, dict]], steps: int, kwargs: dict) -> dict:
    return {name: train(info.rank, info.world_size, kind, steps, options, **kwargs)
            for name, (kind, options) in arms.items()}


if __name__ == "__main__":
    import json
    import os

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from dist_spawn import run_ranks

    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    arms = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {"adamw": ["adamw", {}]}
    kwargs = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    world = int(os.environ.get("WORLD", "2"))
    start = time.time()
    results = run_ranks(_worker, world, {k: tuple(v) for k, v in arms.items()}, steps, kwargs, timeout_s=3000)
    print(f"floor {entropy():.3f}  ({time.time() - start:.0f} s)")
    for name, r in results[0].items():
        curve = " ".join(f"{sum(r['losses'][i:i + 10]) / 10:.3f}" for i in range(0, steps, max(10, steps // 15)))
        extra = f" ratio {r['ratio']:.1f}x interval {r['interval']}" if "ratio" in r else ""
        tail = sum(r["losses"][-50:]) / len(r["losses"][-50:])
        print(f"{name:>14}: val {r['val']:.4f} tail50 {tail:.4f}{extra} | {curve}")
