"""Documents -> tokens (GPT-2 or a local Hugging Face tokenizer) -> fixed-length samples -> MDS shards, one directory
per split.

Files in ``out_dir``: ``<split>/index.json`` plus ``<split>/shard.*.mds.zstd`` for each split, readable by
``streaming.StreamingDataset(local=out_dir, split=<split>)`` and by llm-foundry's ``text`` dataloader. Each sample is
one column ``tokens``: an array of exactly ``seq_len`` token ids, ``uint16`` for vocabularies of up to 2**16 ids
(GPT-2's 50257), ``uint32`` for larger ones. The column's encoding in ``index.json`` states the length
(``ndarray:uint16:2048``), so :func:`check_sample_length` compares it with a model's ``max_seq_len`` before any
shard is read, and ``index.json`` records a hash of every shard file
(:mod:`composer_qsdp.recipes.data.integrity`).

Documents are tokenized, each followed by the end-of-text token, concatenated per split and cut into samples of
``seq_len`` tokens (a sample may span documents, as in GPT-2 and MosaicML's C4 shards); the tail of each split
that does not fill a sample is dropped and counted.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from streaming import MDSWriter
from tqdm.auto import tqdm

from composer_qsdp.recipes.data.integrity import SHARD_HASHES
from composer_qsdp.recipes.data.sources import TRAIN_SPLIT, VAL_SPLIT
from composer_qsdp.recipes.data.tokenizer import TextTokenizer, load_tokenizer

__all__ = ["LARGE_SOURCES", "SplitStats", "TOKENS_COLUMN", "build_command", "check_sample_length", "sample_length",
           "shards_exist", "write_token_shards"]

#: Name of the MDS column holding a sample's token ids.
TOKENS_COLUMN = "tokens"
#: The sources of ``python -m composer_qsdp.recipes.data.build`` that hold far more text than a run reads: the command
#: :func:`build_command` writes for a run stops them at the tokens it trains on (``--max-train-tokens``).
LARGE_SOURCES = ("c4",)


def build_command(source: str | None, out_dir: str | os.PathLike, seq_len: int | str,
                  train_tokens: int | None = None) -> str:  # fmt: skip
    """The shell command that builds the shards a run reads: ``python -m composer_qsdp.recipes.data.build SOURCE
    OUT_DIR --seq-len N [OPTIONS]``.

    Args:
        source: the source and its options as a recipe's ``data.source`` gives them (``c4``, ``textdir --input
            DIR``); None: the placeholder ``SOURCE``.
        out_dir: where the run reads the shards.
        seq_len: the model's ``max_seq_len``.
        train_tokens: the tokens the run trains on, which caps a source of :data:`LARGE_SOURCES`; None: no cap.
    """
    name, *options = shlex.split(source) if source else ["SOURCE"]
    words = [name, os.fspath(out_dir), "--seq-len", str(seq_len), *options]
    if name in LARGE_SOURCES and train_tokens is not None and "--max-train-tokens" not in options:
        words += ["--max-train-tokens", str(train_tokens)]
    return "python -m composer_qsdp.recipes.data.build " + " ".join(map(shlex.quote, words))


@dataclass
class SplitStats:
    """What one split of a shard build received and wrote.

    Attributes:
        documents: documents routed to the split.
        samples: samples written (each ``seq_len`` tokens).
        dropped_tokens: tokens at the end of the split too few to fill one more sample.
    """

    documents: int = 0
    samples: int = 0
    dropped_tokens: int = 0


def shards_exist(out_dir: str | os.PathLike, splits: Iterable[str] = (TRAIN_SPLIT, VAL_SPLIT)) -> bool:
    """True when ``out_dir`` holds a finished build (an ``index.json``) for every split in ``splits``."""
    return all((Path(out_dir) / split / "index.json").is_file() for split in splits)


def sample_length(out_dir: str | os.PathLike, split: str) -> int | None:
    """Tokens per sample of a split, read from its ``index.json`` alone (no shard file is opened).

    Returns:
        The length, or None when the index does not state it: shards built before the column encoding carried it,
        or shards of another writer.

    Raises:
        FileNotFoundError: ``out_dir`` has no ``<split>/index.json``.
        ValueError: the index is not JSON (damaged); names it.
    """
    index = Path(out_dir) / split / "index.json"
    try:
        shards = json.loads(index.read_text(encoding="utf-8")).get("shards", [])
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{index} is damaged ({err}); rebuild the split (python -m "
                         "composer_qsdp.recipes.data.build ...)") from err
    lengths = set()
    for shard in shards:
        encodings = dict(zip(shard.get("column_names", []), shard.get("column_encodings", [])))
        match = re.fullmatch(r"ndarray:\w+:(\d+)", encodings.get(TOKENS_COLUMN, ""))
        lengths.add(int(match.group(1)) if match else None)
    return lengths.pop() if len(lengths) == 1 else None


def check_sample_length(out_dir: str | os.PathLike, split: str, max_seq_len: int) -> None:
    """Refuse shards whose samples do not hold ``max_seq_len`` tokens, from the split's ``index.json``.

    Cheap (reads one small JSON file), so a recipe can call it before anything is built. It passes when there is
    nothing to compare: no ``<split>/index.json`` in ``out_dir`` (not built, or not downloaded from a remote yet)
    or an index that does not state the length (:func:`sample_length` is None); the dataloader then checks the
    first sample it reads.

    Raises:
        ValueError: the lengths differ; names both numbers, the shards' folder and the two fixes.
    """
    if not shards_exist(out_dir, (split,)):
        return
    length = sample_length(out_dir, split)
    if length is not None and length != max_seq_len:
        raise ValueError(f"the shards in {os.fspath(Path(out_dir) / split)} hold samples of {length} tokens, but "
                         f"model.max_seq_len={max_seq_len}; set model.max_seq_len={length}, or rebuild the shards "
                         f"with --seq-len {max_seq_len} (python -m composer_qsdp.recipes.data.build ...)")


class _SplitWriter:
    """Packs one split's token stream into samples and hands them to an ``MDSWriter``."""

    def __init__(self, out: Path, seq_len: int, dtype: np.dtype, compression: str | None,
                 size_limit: int | str) -> None:
        self.seq_len = seq_len
        self.stats = SplitStats()
        self._dtype = dtype
        self._pending = np.empty(0, dtype=dtype)
        self._writer = MDSWriter(out=str(out), columns={TOKENS_COLUMN: f"ndarray:{dtype.name}:{seq_len}"},
                                 compression=compression, hashes=list(SHARD_HASHES), size_limit=size_limit)

    def add(self, tokens: list[int]) -> None:
        self.stats.documents += 1
        stream = np.concatenate([self._pending, np.asarray(tokens, dtype=self._dtype)])
        full = len(stream) // self.seq_len
        for sample in stream[: full * self.seq_len].reshape(full, self.seq_len):
            self._writer.write({TOKENS_COLUMN: sample})
        self.stats.samples += full
        self._pending = stream[full * self.seq_len:]

    def finish(self) -> SplitStats:
        self._writer.finish()
        self.stats.dropped_tokens = len(self._pending)
        return self.stats


# Documents tokenized together: enough to keep the tokenizer's threads busy, few enough that a build stopped by
# max_train_tokens tokenizes little past the document that reached it.
_ENCODE_BATCH_DOCUMENTS = 256


def _tokenized(documents: Iterable[tuple[str, str]], tokenizer: TextTokenizer) -> Iterator[tuple[str, list[int]]]:
    """``(split, token ids)`` of each document, in order, tokenized a batch of documents at a time."""
    documents = iter(documents)
    while batch := list(itertools.islice(documents, _ENCODE_BATCH_DOCUMENTS)):
        yield from zip((split for split, _ in batch), tokenizer.encode_batch([text for _, text in batch]))


def write_token_shards(
    documents: Iterable[tuple[str, str]],
    out_dir: str | os.PathLike,
    seq_len: int,
    *,
    max_documents: int | None = None,
    max_train_tokens: int | None = None,
    compression: str | None = "zstd",
    size_limit: int | str = "64mb",
    progress: bool = False,
    tokenizer: str | os.PathLike = "gpt2",
) -> dict[str, SplitStats]:
    """Tokenize ``(split, text)`` documents and write ``train`` and ``val`` MDS shards.

    The build goes to a temporary sibling directory that is renamed to ``out_dir`` only when every split is
    finished, so an interrupted build never looks complete to :func:`shards_exist`.

    Args:
        documents: ``(split, text)`` pairs, split ``"train"`` or ``"val"`` (see :mod:`composer_qsdp.recipes.data.sources`).
        out_dir: directory to create; must not exist yet.
        seq_len: tokens per sample (the model's ``max_seq_len``).
        max_documents: stop after this many documents (all splits together); None reads them all.
        max_train_tokens: stop reading documents once the train split holds this many tokens (in whole samples;
            the val split keeps the documents read until then); None: no cap.
        compression: MDS shard compression (``"zstd"``, ``None``, or another ``streaming`` codec).
        size_limit: bytes (or a size string like ``"64mb"``) per shard before a new one starts.
        progress: show a progress bar of documents and samples.
        tokenizer: ``"gpt2"`` (offline GPT-2 BPE) or a local Hugging Face tokenizer directory
            (:func:`~composer_qsdp.recipes.data.tokenizer.load_tokenizer`); its vocabulary size picks ``uint16`` or ``uint32``.

    Returns:
        The :class:`SplitStats` of each split.

    Raises:
        ValueError: bad ``seq_len``/``max_documents``, an existing ``out_dir``, a document with an unknown split, or
            an unusable tokenizer.
    """
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
        raise ValueError(f"seq_len={seq_len!r} is invalid; it must be an integer >= 2 (tokens per sample)")
    if max_documents is not None and (isinstance(max_documents, bool) or not isinstance(max_documents, int)
                                      or max_documents < 1):
        raise ValueError(f"max_documents={max_documents!r} is invalid; it must be an integer >= 1 or None")
    if max_train_tokens is not None and (isinstance(max_train_tokens, bool) or not isinstance(max_train_tokens, int)
                                         or max_train_tokens < seq_len):
        raise ValueError(f"max_train_tokens={max_train_tokens!r} is invalid; it must be an integer >= seq_len "
                         f"({seq_len}) or None")
    out = Path(out_dir)
    if out.exists():
        raise ValueError(f"shard directory {str(out)!r} already exists; remove it or choose another out_dir")
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    text_tokenizer = load_tokenizer(tokenizer)
    dtype = np.dtype(np.uint16 if text_tokenizer.vocab_size <= 2**16 else np.uint32)
    writers = {split: _SplitWriter(tmp / split, seq_len, dtype, compression, size_limit)
               for split in (TRAIN_SPLIT, VAL_SPLIT)}
    try:
        bar = tqdm(_tokenized(itertools.islice(documents, max_documents), text_tokenizer),
                   desc=f"tokenizing into {out.name}", unit="doc", disable=not progress)
        for split, tokens in bar:
            if split not in writers:
                raise ValueError(f"document has split {split!r}; allowed: {', '.join(writers)}")
            writers[split].add(tokens + [text_tokenizer.eot_id])
            bar.set_postfix({name: w.stats.samples for name, w in writers.items()}, refresh=False)
            if max_train_tokens is not None and writers[TRAIN_SPLIT].stats.samples * seq_len >= max_train_tokens:
                break
        stats = {split: writer.finish() for split, writer in writers.items()}
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    tmp.rename(out)
    return stats
