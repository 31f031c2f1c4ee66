"""Shard integrity: the hash every shard file gets in ``index.json`` at build time, and its check at read time.

:func:`~composer_qsdp.recipes.data.shards.write_token_shards` records the :data:`SHARD_HASHES` of each shard file
(the ``.mds`` and, when compressed, the ``.mds.zstd``) in the split's ``index.json``. The dataloader checks each file
against them before it reads the file's first sample (:func:`verify_shard_file`), so a damaged file fails with
an :class:`UnreadableShardError` naming it, even when its damaged bytes still decode to valid token ids. Shards
built without hashes still load, unverified, with one warning per split.
"""

from __future__ import annotations

import os

from streaming.base.hashing import get_hash, is_hash

__all__ = ["REBUILD_HINT", "SHARD_HASHES", "UnreadableShardError", "verify_shard_file"]

#: Hash algorithms recorded for every shard file (``MDSWriter(hashes=...)``, which wants them sorted). xxh64 finds
#: accidental damage (disk, copy, truncation) at memory speed; it is no defence against deliberate tampering.
SHARD_HASHES = ("xxh64",)

#: How to repair a split, appended to every shard error.
REBUILD_HINT = ("rebuild the split (python -m composer_qsdp.recipes.data.build SOURCE OUT_DIR --seq-len N ...), or, "
                "when the shards come from a remote (data.remote), delete this local copy to download it again")


class UnreadableShardError(ValueError):
    """A shard file that index.json lists is damaged: it fails its recorded hash, or it cannot be decompressed or
    decoded. The message names the file and how to rebuild it."""


def verify_shard_file(path: str | os.PathLike, hashes: dict[str, str], split: str | None) -> bool:
    """Check the file at ``path`` against the ``hashes`` (algorithm -> hex digest) ``index.json`` records for it.

    Uses the first of :data:`SHARD_HASHES`, else any algorithm ``streaming`` knows, that ``hashes`` holds.

    Returns:
        True when the file matched, False when ``hashes`` holds no usable algorithm (a build without hashes).

    Raises:
        UnreadableShardError: the file's digest differs from the recorded one; names the file and the fix.
    """
    usable = [a for a in (*SHARD_HASHES, *sorted(hashes)) if a in hashes and is_hash(a)]
    if not usable:
        return False
    algo = usable[0]
    with open(path, "rb") as f:
        actual = get_hash(algo, f.read())
    if actual != hashes[algo]:
        raise UnreadableShardError(
            f"shard {os.fspath(path)} of split {split!r} cannot be read: the file is damaged (its {algo} hash is "
            f"{actual}, but index.json recorded {hashes[algo]} when the split was built); {REBUILD_HINT}")
    return True
