"""Token shards: text -> MDS -> StreamingDataset round trip with the right train/val split, the build CLI,
and the sources (text directory, the gensim Wikipedia sample, C4's lazy import)."""

from __future__ import annotations

import itertools
import random
import re
import signal
import sys
import time

import numpy as np
import pytest
import torch
from streaming import StreamingDataset

from composer_qsdp.recipes.data import (
    EOT_TOKEN_ID,
    TokenSamples,
    assign_split,
    build_token_dataloader,
    c4_documents,
    check_sample_length,
    gpt2_tokenizer,
    sample_length,
    shards_exist,
    text_directory_documents,
    wikipedia_sample_documents,
    write_token_shards,
)
from composer_qsdp.recipes.data.build import main as build_main

WORDS = "the of model shard token gradient weight bucket quantize gather reduce scatter rank byte".split()


def make_corpus(directory, n_docs: int, seed: int = 0) -> list[str]:
    directory.mkdir()
    rng = random.Random(seed)
    texts = []
    for i in range(n_docs):
        text = f"Document {i}. " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 60)))
        (directory / f"doc{i:03d}.txt").write_text(text, encoding="utf-8")
        texts.append(text)
    return texts


def expected_samples(texts: list[str], seq_len: int) -> np.ndarray:
    """Reference packing: every document's tokens plus <|endoftext|>, concatenated, cut into full samples."""
    tokenizer = gpt2_tokenizer()
    stream = [t for text in texts for t in tokenizer.encode_ordinary(text) + [EOT_TOKEN_ID]]
    full = len(stream) // seq_len
    return np.array(stream[: full * seq_len]).reshape(full, seq_len)


def read_split(out_dir, split: str) -> np.ndarray:
    dataset = StreamingDataset(local=str(out_dir), split=split, shuffle=False)
    return np.stack([dataset[i]["tokens"] for i in range(dataset.num_samples)]).astype(np.int64)


# Documents tokenized per batch: one at a time, batches that end inside the corpus, and all in one batch.
BATCHES = pytest.mark.parametrize("batch", [1, 7, 256])


@BATCHES
def test_shards_round_trip_with_document_level_split(tmp_path, monkeypatch, batch):
    monkeypatch.setattr("composer_qsdp.recipes.data.shards._ENCODE_BATCH_DOCUMENTS", batch)
    texts = make_corpus(tmp_path / "text", 60)
    seq_len = 16
    stats = write_token_shards(text_directory_documents(tmp_path / "text", 0.25), tmp_path / "shards", seq_len)
    # Files are read in sorted path order, which is the creation order here.
    by_split = {split: [t for t in texts if assign_split(t, 0.25) == split] for split in ("train", "val")}
    assert 0 < len(by_split["val"]) < len(by_split["train"])
    for split, split_texts in by_split.items():
        expected = expected_samples(split_texts, seq_len)
        np.testing.assert_array_equal(read_split(tmp_path / "shards", split), expected)
        n_tokens = sum(len(gpt2_tokenizer().encode_ordinary(t)) + 1 for t in split_texts)
        assert stats[split].documents == len(split_texts)
        assert stats[split].samples == len(expected)
        assert stats[split].samples * seq_len + stats[split].dropped_tokens == n_tokens
    assert shards_exist(tmp_path / "shards")


@BATCHES
def test_train_token_cap_stops_at_the_first_document_that_reaches_it(tmp_path, monkeypatch, batch):
    monkeypatch.setattr("composer_qsdp.recipes.data.shards._ENCODE_BATCH_DOCUMENTS", batch)
    texts = make_corpus(tmp_path / "text", 60)
    seq_len, cap = 16, 400
    stats = write_token_shards(text_directory_documents(tmp_path / "text", 0.25), tmp_path / "shards", seq_len,
                               max_train_tokens=cap)
    # The documents read are a prefix of the corpus: the shortest one whose train split reaches the cap.
    for n in range(1, len(texts) + 1):
        read = {split: [t for t in texts[:n] if assign_split(t, 0.25) == split] for split in ("train", "val")}
        if len(expected_samples(read["train"], seq_len)) * seq_len >= cap:
            break
    for split in ("train", "val"):
        np.testing.assert_array_equal(read_split(tmp_path / "shards", split), expected_samples(read[split], seq_len))
    assert cap <= stats["train"].samples * seq_len < cap + max(len(gpt2_tokenizer().encode_ordinary(t)) + 1
                                                               for t in texts)
    with pytest.raises(ValueError, match=r"max_train_tokens=8 is invalid; it must be an integer >= seq_len \(16\)"):
        write_token_shards(iter([]), tmp_path / "other", seq_len, max_train_tokens=8)


def test_split_assignment_is_deterministic_and_proportional():
    texts = [f"text number {i}" for i in range(4000)]
    splits = [assign_split(t, 0.1) for t in texts]
    assert splits == [assign_split(t, 0.1) for t in texts]
    assert 0.08 < splits.count("val") / len(texts) < 0.12
    assert all(assign_split(t, 0.0) == "train" for t in texts[:100])
    with pytest.raises(ValueError, match="val_fraction=1.0"):
        assign_split("x", 1.0)


def test_dataloader_batches_and_remote_cache(tmp_path):
    texts = make_corpus(tmp_path / "text", 40)
    write_token_shards(text_directory_documents(tmp_path / "text", 0.0), tmp_path / "shards", 8)
    expected = torch.from_numpy(expected_samples(texts, 8))

    loader = build_token_dataloader(tmp_path / "shards", "train", device_batch_size=4, max_seq_len=8, shuffle=False)
    batches = list(loader)
    assert all(b.dtype == torch.int64 and b.shape == (4, 8) for b in batches)
    torch.testing.assert_close(torch.cat(batches), expected[: 4 * len(batches)])

    # The same shards as a "remote": downloaded into a cache directory, then read.
    remote = build_token_dataloader(tmp_path / "cache", "train", device_batch_size=4, max_seq_len=8,
                                    remote=str(tmp_path / "shards"), shuffle=True, shuffle_seed=3)
    shuffled = [tuple(row) for row in torch.cat(list(remote)).tolist()]
    rows = [tuple(row) for row in expected.tolist()]
    assert len(shuffled) == len(rows) // 4 * 4  # drop_last: full batches only
    assert len(set(shuffled)) == len(shuffled) and set(shuffled) <= set(rows)  # distinct samples of the split
    assert shuffled != rows[: len(shuffled)]


def test_dataloader_workers_leave_sigterm_to_their_process(tmp_path):
    """A kill of a job's process group reaches the DataLoader workers too: they must keep serving, so that their
    process can finish the batch and save (the recipe's save_on_sigterm), instead of dying and failing it."""
    import psutil

    texts = make_corpus(tmp_path / "text", 40)
    write_token_shards(text_directory_documents(tmp_path / "text", 0.0), tmp_path / "shards", 8)
    expected = torch.from_numpy(expected_samples(texts, 8))
    loader = build_token_dataloader(tmp_path / "shards", "train", device_batch_size=4, max_seq_len=8, shuffle=False,
                                    num_workers=2)
    before = {child.pid for child in psutil.Process().children()}
    batches = iter(loader)
    first = [next(batches)]
    workers = [child for child in psutil.Process().children() if child.pid not in before]
    assert len(workers) == 2
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
    time.sleep(0.5)  # a worker that SIGTERM ended is gone by now, and the next batch would raise
    assert all(worker.is_running() for worker in workers)
    torch.testing.assert_close(torch.cat(first + list(batches)), expected[: len(expected) // 4 * 4])


def test_dataloader_rejects_missing_or_mismatched_shards(tmp_path, monkeypatch, legacy_shards):
    with pytest.raises(ValueError, match="no MDS shards for split 'train'"):
        build_token_dataloader(tmp_path / "nothing", "train", 2, 8)
    check_sample_length(tmp_path / "nothing", "train", 8)  # nothing built (or downloaded) yet: nothing to compare
    make_corpus(tmp_path / "text", 10)
    write_token_shards(text_directory_documents(tmp_path / "text", 0.0), tmp_path / "shards", 8)
    assert sample_length(tmp_path / "shards", "train") == 8
    mismatch = re.escape(f"the shards in {tmp_path / 'shards' / 'train'} hold samples of 8 tokens") + r".*" + \
        re.escape("model.max_seq_len=16; set model.max_seq_len=8, or rebuild the shards with --seq-len 16")
    with pytest.raises(ValueError, match=mismatch):
        check_sample_length(tmp_path / "shards", "train", 16)
    check_sample_length(tmp_path / "shards", "train", 8)
    (tmp_path / "shards" / "val" / "index.json").write_text('{"shards": [')
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'shards' / 'val' / 'index.json'} is damaged")):
        check_sample_length(tmp_path / "shards", "val", 8)
    # The dataloader refuses the shards from their index.json, before streaming opens anything.
    monkeypatch.setattr(TokenSamples, "__init__", lambda *args, **kwargs: pytest.fail("dataset built"))
    with pytest.raises(ValueError, match=mismatch):
        build_token_dataloader(tmp_path / "shards", "train", 2, 16)
    monkeypatch.undo()

    # Shards whose index does not state the length: refused at their first sample, with the same message.
    legacy = legacy_shards(tmp_path / "legacy", np.zeros((200, 8), np.uint16))
    assert sample_length(legacy, "train") is None
    check_sample_length(legacy, "train", 16)
    with pytest.warns(UserWarning, match="without hashes"), pytest.raises(ValueError, match=re.escape(
            f"the shards in {legacy / 'train'} hold samples of 8 tokens (sample 0), but model.max_seq_len=16")):
        build_token_dataloader(legacy, "train", 2, 16)


def test_writer_rejects_bad_input_and_leaves_nothing_half_written(tmp_path):
    with pytest.raises(ValueError, match="seq_len=1"):
        write_token_shards([], tmp_path / "a", 1)
    with pytest.raises(ValueError, match="split 'test'"):
        write_token_shards([("test", "some text")], tmp_path / "b", 8)
    assert not (tmp_path / "b").exists()

    def failing_documents():
        yield "train", "a document " * 50
        raise RuntimeError("source failed mid-way")

    with pytest.raises(RuntimeError, match="mid-way"):
        write_token_shards(failing_documents(), tmp_path / "c", 8)
    assert list(tmp_path.iterdir()) == []  # neither the output nor its temporary directory remains

    (tmp_path / "d").mkdir()
    with pytest.raises(ValueError, match="already exists"):
        write_token_shards([("train", "x")], tmp_path / "d", 8)


def test_text_directory_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        next(text_directory_documents(tmp_path / "missing", 0.1))
    with pytest.raises(ValueError, match="no \\*.txt files"):
        next(text_directory_documents(tmp_path, 0.1))


def test_build_cli_textdir_and_skip_existing(tmp_path, capsys):
    make_corpus(tmp_path / "text", 80)
    out = tmp_path / "shards"
    args = ["textdir", str(out), "--input", str(tmp_path / "text"), "--seq-len", "16", "--val-fraction", "0.2"]
    assert build_main(args) == 0
    printed = capsys.readouterr().out
    assert "train:" in printed and "val:" in printed and shards_exist(out)
    assert build_main(args + ["--skip-existing"]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert build_main(args) == 2  # without --skip-existing an existing directory is an error
    assert "already exists" in capsys.readouterr().err
    assert build_main(["textdir", str(tmp_path / "x"), "--seq-len", "16"]) == 2
    assert "needs --input" in capsys.readouterr().err


def test_wikipedia_sample_is_real_prose():
    docs = list(itertools.islice(wikipedia_sample_documents(0.05), 3))
    assert len(docs) == 3
    for split, text in docs:
        assert split in ("train", "val")
        title, body = text.split("\n\n", 1)
        assert title and len(body) > 200
        assert "[[" not in body and "''" not in body  # wiki markup was stripped
    assert docs[0][1].startswith("Anarchism")


def test_build_cli_wikipedia(tmp_path, capsys):
    out = tmp_path / "wiki"
    assert build_main(["wikipedia", str(out), "--seq-len", "32", "--max-documents", "4", "--val-fraction",
                       "0.5"]) == 0
    assert shards_exist(out)
    train = read_split(out, "train")
    assert train.shape[1] == 32 and train.max() < 50257


def test_wikipedia_sample_without_gensim_names_the_demo_extra(monkeypatch):
    for name in ("gensim", "gensim.corpora.wikicorpus"):  # `import` now fails as for a missing package
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match=re.escape("pip install 'composer_qsdp[demo]'")):
        next(wikipedia_sample_documents(0.05))


def test_c4_needs_datasets(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail like a missing package
    with pytest.raises(ImportError, match=re.escape("pip install 'composer_qsdp[c4]'")):
        next(c4_documents(10))
    with pytest.raises(ValueError, match="val_documents=-1"):
        next(c4_documents(-1))


def _large_vocabulary_tokenizer(directory) -> dict[str, int]:
    """A word-level Hugging Face tokenizer directory whose words have ids above 2**16 (built offline with
    ``tokenizers``); returns its word -> id map."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    vocab = {f"<filler{i}>": i for i in range(70_000)}
    for word in ["[UNK]", "[EOS]", *WORDS, "Document", *(f"{i}." for i in range(60))]:
        vocab[word] = len(vocab)
    core = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = WhitespaceSplit()
    transformers.PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]",
                                         eos_token="[EOS]").save_pretrained(directory)
    return vocab


def test_a_local_tokenizer_directory_with_ids_past_16_bits_writes_uint32_shards(tmp_path):
    vocab = _large_vocabulary_tokenizer(tmp_path / "tokenizer")
    texts = make_corpus(tmp_path / "text", 20)
    seq_len = 8
    write_token_shards(text_directory_documents(tmp_path / "text", 0.0), tmp_path / "shards", seq_len,
                       tokenizer=tmp_path / "tokenizer")
    stream = [vocab[word] for text in texts for word in [*text.split(), "[EOS]"]]  # the reference packing
    full = len(stream) // seq_len
    expected = np.array(stream[: full * seq_len]).reshape(full, seq_len)
    assert expected.max() >= 2**16  # ids a uint16 column would wrap
    dataset = StreamingDataset(local=str(tmp_path / "shards"), split="train", shuffle=False)
    assert dataset[0]["tokens"].dtype == np.uint32
    np.testing.assert_array_equal(read_split(tmp_path / "shards", "train"), expected)
    batches = build_token_dataloader(tmp_path / "shards", "train", 2, seq_len, shuffle=False, vocab_size=len(vocab))
    assert torch.equal(next(iter(batches)), torch.from_numpy(expected[:2]))
    with pytest.raises(ValueError, match=r"holds token id \d+, but the model's vocabulary has 50257 ids"):
        build_token_dataloader(tmp_path / "shards", "train", 2, seq_len, shuffle=False, vocab_size=50257)


def test_gpt2_shards_stay_uint16_and_bad_tokenizers_are_named(tmp_path):
    make_corpus(tmp_path / "text", 4)
    write_token_shards(text_directory_documents(tmp_path / "text", 0.0), tmp_path / "shards", 8)
    assert StreamingDataset(local=str(tmp_path / "shards"), split="train")[0]["tokens"].dtype == np.uint16
    with pytest.raises(ValueError, match="tokenizer 'llama' is neither 'gpt2' nor a local tokenizer directory"):
        write_token_shards([("train", "x")], tmp_path / "e", 8, tokenizer="llama")
