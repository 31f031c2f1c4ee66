"""MDS token shards -> ``StreamingDataset`` -> batches of token ids ``[batch, seq_len]`` (int64) for the Trainer."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from streaming import StreamingDataset
from torch.utils.data import DataLoader

from composer_qsdp.data.shards import TOKENS_COLUMN, shards_exist

__all__ = ["TokenSamples", "build_token_dataloader"]


class TokenSamples(StreamingDataset):
    """A split of token shards written by :func:`~composer_qsdp.data.shards.write_token_shards`.

    Every item is a 1-D int64 tensor of ``max_seq_len`` token ids. ``max_seq_len`` is also what Composer reads to
    count tokens per batch.

    Args:
        max_seq_len: tokens the shards' samples must have (the model's ``max_seq_len``).
        vocab_size: the model's vocabulary; a sample with an id at or above it is refused (shards written with a
            larger tokenizer's vocabulary). None: not checked.
        **kwargs: ``StreamingDataset`` arguments (``local``, ``remote``, ``split``, ``shuffle``, ``batch_size``...).
    """

    def __init__(self, max_seq_len: int, vocab_size: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.max_seq_len = max_seq_len
        self.vocab_size = vocab_size

    def __getitem__(self, idx: int) -> torch.Tensor:
        tokens = super().__getitem__(idx)[TOKENS_COLUMN]
        if tokens.shape != (self.max_seq_len,):
            raise ValueError(f"shard sample {idx} has {tokens.shape[0]} tokens but the model "
                             f"expects max_seq_len={self.max_seq_len}; rebuild the shards with --seq-len "
                             f"{self.max_seq_len} or set model.max_seq_len={tokens.shape[0]}")
        if self.vocab_size is not None and int(tokens.max()) >= self.vocab_size:
            raise ValueError(f"shard sample {idx} holds token id {int(tokens.max())}, but the model's vocabulary has "
                             f"{self.vocab_size} ids: the shards were tokenized with a larger vocabulary; rebuild "
                             "them with the model's tokenizer (python -m composer_qsdp.data.build --tokenizer DIR) or "
                             "enlarge the model's vocab_size")
        return torch.from_numpy(tokens.astype(np.int64))


def build_token_dataloader(
    local: str | os.PathLike,
    split: str,
    device_batch_size: int,
    max_seq_len: int,
    *,
    remote: str | None = None,
    shuffle: bool = True,
    shuffle_seed: int = 9176,
    num_workers: int = 0,
    drop_last: bool = True,
    collate_fn: Callable[[list[torch.Tensor]], Any] | None = None,
    vocab_size: int | None = None,
) -> DataLoader:
    """A ``DataLoader`` of this rank's ``[device_batch_size, max_seq_len]`` token batches from one split.

    Each rank reads a disjoint part of the split (``StreamingDataset`` partitions by the launcher's ``RANK`` and
    ``WORLD_SIZE``), deterministically for a given ``shuffle_seed``, and resumes mid-epoch from a checkpoint.

    Args:
        local: the shard directory (holding ``<split>/index.json``) when ``remote`` is None, else the local cache
            directory for the downloaded shards.
        split: subdirectory to read, e.g. ``"train"`` or ``"val"``.
        device_batch_size: samples per batch on this rank.
        max_seq_len: tokens per sample; checked against the shards (first sample now, then every sample).
        remote: URL or path of the shards (``s3://...``, ``gs://...``, another directory), or None.
        shuffle: shuffle samples (training) or read them in order (evaluation).
        shuffle_seed: seed of the shuffle; the same on every rank.
        num_workers: ``DataLoader`` worker processes.
        drop_last: drop a final partial batch.
        collate_fn: turns a list of samples into the batch the model takes; None stacks them into one tensor.
        vocab_size: the model's vocabulary size; samples with larger ids are refused. None: not checked.

    Raises:
        ValueError: no shards at ``local`` (with no ``remote``), an empty split, samples of the wrong length or
            with ids outside ``vocab_size``.
    """
    if remote is None and not shards_exist(local, (split,)):
        raise ValueError(f"no MDS shards for split {split!r} in {os.fspath(local)!r} (missing {split}/index.json); "
                         "build them with: python -m composer_qsdp.data.build")
    dataset = TokenSamples(max_seq_len=max_seq_len, vocab_size=vocab_size, local=os.fspath(local), remote=remote,
                           split=split, shuffle=shuffle, shuffle_seed=shuffle_seed, batch_size=device_batch_size)
    if dataset.num_samples == 0:
        raise ValueError(f"split {split!r} in {os.fspath(local)!r} holds no samples")
    dataset[0]  # fails now, naming the key, if the shards were built for another sequence length or vocabulary
    return DataLoader(dataset, batch_size=device_batch_size, num_workers=num_workers, drop_last=drop_last,
                      collate_fn=collate_fn)
