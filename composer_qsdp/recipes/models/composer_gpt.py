"""The GPT as a Composer model: a batch of token samples -> next-token cross entropy and perplexity."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from composer.metrics.nlp import LanguageCrossEntropy, LanguagePerplexity
from composer.models import ComposerModel
from torchmetrics import Metric

from composer_qsdp.recipes.models.config import GPTConfig
from composer_qsdp.recipes.models.gpt import GPT

__all__ = ["ComposerGPT"]


class ComposerGPT(ComposerModel):
    """Causal language model on batches of token ids ``[batch, seq]`` (int64).

    Position ``t`` predicts token ``t + 1``, so a sample of ``seq`` tokens contributes ``seq - 1`` predictions.
    The network is the single child ``self.model`` (see :class:`~composer_qsdp.recipes.models.gpt.GPT` for why).

    Args:
        config: the model's shape and initialisation.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.model = GPT(config)
        # A plain dict, not a module: Composer's FSDP policy must not see metrics as children to shard.
        self.val_metrics: dict[str, Metric] = {
            "LanguageCrossEntropy": LanguageCrossEntropy(),
            "LanguagePerplexity": LanguagePerplexity(),
        }

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        """Logits ``[batch, seq, padded_vocab_size]`` of a ``[batch, seq]`` token batch."""
        return self.model(batch)

    def loss(self, outputs: torch.Tensor, batch: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Mean next-token cross entropy (nats per predicted token), computed in fp32."""
        logits = outputs[:, :-1].float()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))

    def eval_forward(self, batch: torch.Tensor, outputs: torch.Tensor | None = None) -> torch.Tensor:
        """Logits for evaluation; reuses ``outputs`` when the training forward already produced them."""
        return outputs if outputs is not None else self.forward(batch)

    def get_metrics(self, is_train: bool = False) -> dict[str, Metric]:
        """Cross entropy and perplexity over predicted tokens, for evaluation.

        Training reports none: its loss already is the cross entropy, and recomputing it would double the cost
        of the softmax over the 50K-token vocabulary.
        """
        return {} if is_train else self.val_metrics

    def update_metric(self, batch: torch.Tensor, outputs: torch.Tensor, metric: Metric) -> None:
        """Accumulate one batch's next-token predictions into ``metric``."""
        logits = outputs[:, :-1].float()
        metric.update(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
