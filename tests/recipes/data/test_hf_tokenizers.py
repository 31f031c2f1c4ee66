"""Shards from a local Hugging Face tokenizer directory (the ``hf`` extra): the build command line with a tokenizer
trained here (no hub access), checked against the ``tokenizers`` library's own ids; GPT-2 through transformers
giving the same shards as the dependency-free default; and clear errors for a missing extra or a directory that
holds no tokenizer."""

from __future__ import annotations

import json
import random
import re
import sys

import numpy as np
import pytest
import torch
from streaming import StreamingDataset

from composer_qsdp.recipes.data import (
    assign_split,
    build_token_dataloader,
    load_tokenizer,
    text_directory_documents,
    write_gpt2_tokenizer,
    write_token_shards,
)
from composer_qsdp.recipes.data.build import main as build_main

transformers = pytest.importorskip("transformers")

WORDS = "the of model shard token gradient weight bucket quantize gather reduce scatter rank byte".split()
SEQ_LEN = 16


def _corpus(directory) -> list[str]:
    directory.mkdir()
    rng = random.Random(0)
    texts = [f"Document {i}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 60))) for i in range(30)]
    for i, text in enumerate(texts):
        (directory / f"doc{i:03d}.txt").write_text(text, encoding="utf-8")
    return texts


def _read(out_dir, split: str = "train") -> np.ndarray:
    dataset = StreamingDataset(local=str(out_dir), split=split, shuffle=False)
    return np.stack([dataset[i]["tokens"] for i in range(dataset.num_samples)]).astype(np.int64)


def test_build_command_line_with_a_local_bpe_tokenizer(tmp_path, capsys):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = _corpus(tmp_path / "text")
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|eos|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    transformers.PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|eos|>").save_pretrained(
        tmp_path / "tokenizer")

    out = tmp_path / "shards"
    assert build_main(["textdir", str(out), "--input", str(tmp_path / "text"), "--seq-len", str(SEQ_LEN),
                       "--val-fraction", "0.3", "--tokenizer", str(tmp_path / "tokenizer")]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    # Reference: the tokenizers library's own ids (no transformers), each document followed by the EOS id.
    eos = core.token_to_id("<|eos|>")
    for split in ("train", "val"):
        stream = [t for text in texts if assign_split(text, 0.3) == split for t in core.encode(text).ids + [eos]]
        full = len(stream) // SEQ_LEN
        expected = np.array(stream[: full * SEQ_LEN]).reshape(full, SEQ_LEN)
        np.testing.assert_array_equal(_read(out, split), expected)
    batches = build_token_dataloader(out, "val", 4, SEQ_LEN, shuffle=False, vocab_size=core.get_vocab_size())
    torch.testing.assert_close(torch.cat(list(batches)), torch.from_numpy(expected[: full // 4 * 4]))


def test_gpt2_through_transformers_writes_the_same_shards_as_the_default(tmp_path):
    _corpus(tmp_path / "text")
    for name, tokenizer in (("tiktoken", "gpt2"), ("hf", write_gpt2_tokenizer(tmp_path / "gpt2-tokenizer"))):
        write_token_shards(text_directory_documents(tmp_path / "text", 0.3), tmp_path / name, SEQ_LEN,
                           tokenizer=tokenizer)
    assert load_tokenizer(tmp_path / "gpt2-tokenizer").vocab_size == load_tokenizer("gpt2").vocab_size == 50257
    for split in ("train", "val"):
        np.testing.assert_array_equal(_read(tmp_path / "hf", split), _read(tmp_path / "tiktoken", split))


def test_a_directory_without_a_tokenizer_is_refused_by_name(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    model_dir = tmp_path / "model"  # a model's config alone: transformers loads a tokenizer with no vocabulary
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    for directory in (tmp_path / "empty", model_dir):
        with pytest.raises(ValueError, match=re.escape(f"{str(directory)!r} is not a Hugging Face tokenizer "
                                                       "directory: it needs the files that save_pretrained writes")):
            load_tokenizer(directory)
    _corpus(tmp_path / "text")
    assert build_main(["textdir", str(tmp_path / "shards"), "--input", str(tmp_path / "text"), "--seq-len", "8",
                       "--tokenizer", str(model_dir)]) == 2
    assert "is not a Hugging Face tokenizer directory" in capsys.readouterr().err
    assert not (tmp_path / "shards").exists()


def test_a_tokenizer_directory_without_transformers_names_the_extra(tmp_path, monkeypatch):
    directory = write_gpt2_tokenizer(tmp_path / "tokenizer")
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` now fails as when not installed
    with pytest.raises(ImportError, match=re.escape("pip install 'composer_qsdp[hf]' (or use --tokenizer gpt2")):
        load_tokenizer(directory)
    assert load_tokenizer("gpt2").eot_id == 50256  # the default needs no transformers
