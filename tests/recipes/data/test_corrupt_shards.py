"""Damaged shard files behind a valid index.json: reading them fails with an error that names the file and how to
rebuild it, instead of streaming's bare ``zstd.Error`` or ``IndexError`` at the first batch, or, for damage that
still decodes to valid token ids, instead of training on it silently."""

from __future__ import annotations

import json
import random
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from streaming import StreamingDataset

from composer_qsdp.recipes.data import UnreadableShardError, build_token_dataloader, write_token_shards

WORDS = "the of model shard token gradient weight bucket quantize gather reduce scatter rank byte".split()
SEQ_LEN = 16


def _shards(out: Path, compression: str | None) -> list[Path]:
    rng = random.Random(0)
    documents = [("train", " ".join(rng.choice(WORDS) for _ in range(300))) for _ in range(12)]
    write_token_shards(iter(documents), out, SEQ_LEN, compression=compression, size_limit=2000)
    files = sorted(p for p in (out / "train").iterdir() if p.suffix in (".mds", ".zstd"))
    assert len(files) >= 3
    return files


@pytest.mark.parametrize("compression, damage", [("zstd", "overwrite"), (None, "truncate")])
def test_a_damaged_shard_is_named_with_how_to_rebuild(tmp_path, compression, damage):
    files = _shards(tmp_path / "shards", compression)
    victim = files[1]  # the dataloader's first sample (checked at build) is in the first shard
    data = bytearray(victim.read_bytes())
    if damage == "overwrite":
        rng = random.Random(1)
        data[len(data) // 4: len(data) // 2] = bytes(rng.randrange(256) for _ in range(len(data) // 2 - len(data) // 4))
    else:
        del data[len(data) // 2:]
    victim.write_bytes(bytes(data))
    loader = build_token_dataloader(tmp_path / "shards", "train", 4, SEQ_LEN, shuffle=False)
    with pytest.raises(ValueError, match=re.escape(f"shard {victim} of split 'train' cannot be read") + ".*rebuild"):
        for _ in loader:
            pass


def test_a_shard_that_fails_in_the_background_ends_the_epoch_with_its_error(tmp_path, monkeypatch):
    """streaming prepares shards in a background thread; when that thread fails, its iterator stops yielding and
    the epoch ends early without an error (on 2 GPU ranks: one rank left the evaluation, the other waited in a
    collective until the 300 s timeout). The epoch must end with the shard's error instead."""
    import streaming

    _shards(tmp_path / "shards", "zstd")
    prepare = streaming.StreamingDataset.prepare_shard

    def fail_after_the_first(self, shard_id, blocking=True):
        if shard_id > 0:  # as a shard the job cannot write or decompress (FileNotFoundError on its .tmp)
            raise FileNotFoundError(f"No such file or directory: 'shard.{shard_id:05d}.mds.tmp'")
        return prepare(self, shard_id, blocking)

    monkeypatch.setattr(streaming.StreamingDataset, "prepare_shard", fail_after_the_first)
    loader = build_token_dataloader(tmp_path / "shards", "train", 4, SEQ_LEN, shuffle=False)
    batches = 0
    with pytest.raises(ValueError, match=r"shard .*shard\.0000[1-9]\.mds\.zstd of split 'train' cannot be read"):
        for _ in loader:
            batches += 1
    assert batches < len(loader)


def _read_all(out: Path) -> np.ndarray:
    """Every sample of the train split through plain ``StreamingDataset``, which checks no hash when reading local
    shards: what training would see without this package's check."""
    dataset = StreamingDataset(local=str(out), split="train", shuffle=False)
    return np.stack([dataset[i]["tokens"] for i in range(dataset.num_samples)]).astype(np.int64)


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_damage_that_keeps_token_ids_valid_fails_naming_the_damaged_file(tmp_path, compression):
    out = tmp_path / "shards"
    _shards(out, compression)
    index = json.loads((out / "train" / "index.json").read_text())
    assert all(shard["hashes"] and shard["raw_data"]["hashes"] for shard in index["shards"])
    clean = _read_all(out)  # with zstd this also leaves each shard's decompressed .mds beside its .mds.zstd
    victim = out / "train" / index["shards"][1]["raw_data"]["basename"]  # the .mds that samples are read from
    assert victim.suffix == ".mds" and victim.is_file()
    data = bytearray(victim.read_bytes())
    # The file ends with the last token of the shard's last sample: give it another id, still in GPT-2's vocabulary.
    old = int.from_bytes(data[-2:], "little")
    data[-2:] = ((old + 1) % 50256).to_bytes(2, "little")
    victim.write_bytes(bytes(data))
    damaged = _read_all(out)
    assert (damaged != clean).sum() == 1 and damaged.max() < 50257  # decodes, in vocabulary: silent without hashes

    loader = build_token_dataloader(out, "train", 4, SEQ_LEN, shuffle=False, vocab_size=50257)
    with pytest.raises(UnreadableShardError, match=re.escape(f"shard {victim} of split 'train' cannot be read: the "
                                                             "file is damaged (its xxh64 hash")
                       + ".*python -m composer_qsdp.recipes.data.build"):
        for _ in loader:
            pass


def test_shards_built_without_hashes_load_after_one_warning(tmp_path, legacy_shards):
    samples = np.arange(200 * SEQ_LEN).reshape(200, SEQ_LEN) % 50257
    out = legacy_shards(tmp_path / "old", samples)
    assert len(json.loads((out / "train" / "index.json").read_text())["shards"]) >= 3
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = list(build_token_dataloader(out, "train", 4, SEQ_LEN, shuffle=False))
    messages = [str(w.message) for w in caught if "without hashes" in str(w.message)]
    assert messages == [f"the shards in {out / 'train'} were built without hashes (index.json records none), so a "
                        "damaged shard file cannot be detected; rebuild them (python -m "
                        "composer_qsdp.recipes.data.build ...) to have every file verified"]
    torch.testing.assert_close(torch.cat(batches), torch.from_numpy(samples))


def test_a_damaged_decompressed_file_is_named_not_its_compressed_source(tmp_path, legacy_shards):
    """Without hashes the damage shows only when the file is decoded; the error names the file that was read
    (the .mds decompressed from a .mds.zstd on the first read), not the intact .mds.zstd beside it."""
    out = legacy_shards(tmp_path / "old", np.arange(200 * SEQ_LEN).reshape(200, SEQ_LEN) % 50257)
    with pytest.warns(UserWarning, match="without hashes"):
        list(build_token_dataloader(out, "train", 4, SEQ_LEN, shuffle=False))
    victim = out / "train" / json.loads((out / "train" / "index.json").read_text())["shards"][1]["raw_data"]["basename"]
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    with pytest.warns(UserWarning, match="without hashes"):
        loader = build_token_dataloader(out, "train", 4, SEQ_LEN, shuffle=False)
    with pytest.raises(UnreadableShardError, match=re.escape(f"shard {victim} of split 'train' cannot be read (")):
        for _ in loader:
            pass
