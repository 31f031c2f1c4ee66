"""Shared fixtures of the data tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest


@pytest.fixture
def legacy_shards() -> Callable[[Path, np.ndarray], Path]:
    """Writes ``samples`` ``[n, seq_len]`` (uint16 ids) as the ``train`` split of ``out_dir`` the way the shard
    writer did before shards carried hashes and their sample length: an ``ndarray:uint16`` column of no fixed
    shape, no hashes in ``index.json``, zstd-compressed. Returns ``out_dir``."""
    from streaming import MDSWriter

    def write(out_dir: Path, samples: np.ndarray) -> Path:
        with MDSWriter(out=str(out_dir / "train"), columns={"tokens": "ndarray:uint16"}, compression="zstd",
                       size_limit=2000) as writer:
            for sample in samples.astype(np.uint16):
                writer.write({"tokens": sample})
        return out_dir

    return write
