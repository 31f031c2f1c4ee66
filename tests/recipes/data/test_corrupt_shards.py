"""Damaged shard files behind a valid index.json: reading them fails with an error that names the file and how to
rebuild it, instead of streaming's bare ``zstd.Error`` or ``IndexError`` at the first batch."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from composer_qsdp.recipes.data import build_token_dataloader, write_token_shards

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
