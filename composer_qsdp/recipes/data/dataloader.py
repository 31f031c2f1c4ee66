"""MDS token shards -> ``StreamingDataset`` -> batches of token ids ``[batch, seq_len]`` (int64) for the Trainer."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import tempfile
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from streaming import StreamingDataset
from torch.utils.data import DataLoader

from composer_qsdp.recipes.data.integrity import REBUILD_HINT, UnreadableShardError, verify_shard_file
from composer_qsdp.recipes.data.shards import TOKENS_COLUMN, build_command, check_sample_length, shards_exist

__all__ = ["TokenSamples", "build_token_dataloader", "registering_shared_memory"]

#: The host-wide lock that serializes streaming's shared-memory registration between jobs (in the directory where
#: streaming keeps its own file locks).
SHM_REGISTRATION_LOCK = os.path.join(tempfile.gettempdir(), "composer_qsdp_streaming_registration.lock")


@contextlib.contextmanager
def registering_shared_memory() -> Iterator[None]:
    """Build each ``StreamingDataset`` inside this block so that jobs started together on one host do not collide.

    Every ``StreamingDataset`` registers a shared-memory prefix: its local leader (local rank 0) looks for the
    first free ``NNNNNN_locals`` in ``/dev/shm`` and then creates it, with nothing held in between, so two jobs
    that look at the same moment both pick the same number and the later one fails with ``FileExistsError:
    '/NNNNNN_locals'`` (mosaicml-streaming issues #884, #901). Here the local leader holds an exclusive host-wide
    file lock from before the look-up until the dataset is built (every shared-memory object of its prefix
    exists); the other ranks of its job wait on a barrier until the leader holds the lock, so that they look up
    the same prefix as it does. The lock is released when the process dies, so a killed job blocks no one.
    """
    leader = int(os.environ.get("LOCAL_RANK", "0")) == 0
    grouped = dist.is_available() and dist.is_initialized()
    with open(SHM_REGISTRATION_LOCK, "a+") as lock:
        if leader:
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if grouped:
                dist.barrier()
            yield
        finally:
            if leader:
                fcntl.flock(lock, fcntl.LOCK_UN)


class TokenSamples(StreamingDataset):
    """A split of token shards written by :func:`~composer_qsdp.recipes.data.shards.write_token_shards`.

    Every item is a 1-D int64 tensor of ``max_seq_len`` token ids. ``max_seq_len`` is also what Composer reads to
    count tokens per batch.

    Each shard file is checked against the hash that ``index.json`` records for it before this process reads its
    first sample (:func:`~composer_qsdp.recipes.data.integrity.verify_shard_file`); a split whose index records no
    hashes (built before shards carried them) is read unverified, after one warning.

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
        # streaming prepares shards in a background thread whose error reaches __iter__ only as "Background thread
        # failed": kept here to be raised there instead.
        self._unreadable: UnreadableShardError | None = None
        # Checked by this process: shards whose files are all on disk and were checked, and the files' versions.
        self._verified: set[int] = set()
        self._verified_files: set[tuple[str, int, int]] = set()
        unhashed = sorted({self._folder(i) for i, shard in enumerate(self.shards) if not shard.hashes})
        if unhashed:
            warnings.warn(f"the shards in {', '.join(unhashed)} were built without hashes (index.json records none), "
                          "so a damaged shard file cannot be detected; rebuild them (python -m "
                          "composer_qsdp.recipes.data.build ...) to have every file verified", stacklevel=2)

    def _folder(self, shard_id: int) -> str:
        """The local directory of a shard's files."""
        stream = self.streams[self.stream_per_shard[shard_id]]
        return os.path.join(stream.local, stream.split or "")

    def _verify_file(self, path: str, hashes: dict[str, str], split: str | None) -> bool:
        """Check one shard file against index.json unless this process has checked this version of it (a file
        written again, as after an eviction and a new download, has a new modification time); False when the file
        is not on disk."""
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            return False
        version = (path, stat.st_mtime_ns, stat.st_size)
        if version not in self._verified_files:
            verify_shard_file(path, hashes, split)
            self._verified_files.add(version)
        return True

    def _verify_shard(self, shard_id: int) -> None:
        """Check the shard's files that are on disk: the decompressed one, which samples are read from, or else
        the compressed one, before it is decompressed (so that its damage is reported under its own name)."""
        shard, folder = self.shards[shard_id], self._folder(shard_id)
        complete = True
        for raw, zipped in shard.file_pairs:
            if not self._verify_file(os.path.join(folder, raw.basename), raw.hashes, shard.split):
                complete = False
                if zipped is not None:
                    self._verify_file(os.path.join(folder, zipped.basename), zipped.hashes, shard.split)
        if complete:
            self._verified.add(shard_id)

    def _unreadable_shard(self, shard_id: int, err: BaseException, decompressing: bool) -> UnreadableShardError:
        """Keep and return the error naming the shard file that failed: the compressed one while it was being
        decompressed, else the decompressed one, which samples are read from."""
        if isinstance(err, UnreadableShardError):
            self._unreadable = err
            return err
        shard = self.shards[shard_id]
        file = shard.zip_data if decompressing and shard.zip_data is not None else shard.raw_data
        path = os.path.join(self._folder(shard_id), file.basename)
        self._unreadable = UnreadableShardError(
            f"shard {path} of split {shard.split!r} cannot be read ({type(err).__name__}: {err}): the file is damaged "
            f"or incomplete although index.json lists it; {REBUILD_HINT}")
        return self._unreadable

    def prepare_shard(self, shard_id: int, blocking: bool = True) -> None:
        try:
            self._verify_shard(shard_id)
            super().prepare_shard(shard_id, blocking)
            self._verify_shard(shard_id)
        except Exception as err:  # noqa: BLE001 - whatever the decompressor or reader raises: name the file
            raise self._unreadable_shard(shard_id, err, decompressing=True) from err

    def get_item(self, sample_id: int, retry: int = 7) -> Any:
        shard_id = self.spanner[sample_id][0]
        try:
            if shard_id not in self._verified:  # files not on disk yet: super() prepares them, checking them
                self._verify_shard(shard_id)
            return super().get_item(sample_id, retry)
        except UnreadableShardError as err:
            raise self._unreadable_shard(shard_id, err, decompressing=False) from None
        except Exception as err:  # noqa: BLE001 - a sample's bytes that do not decode
            if self._unreadable is not None:  # the background thread failed on a shard first
                raise self._unreadable from err
            raise self._unreadable_shard(shard_id, err, decompressing=False) from err

    def __iter__(self) -> Iterator[Any]:
        try:
            yield from super().__iter__()
        except RuntimeError as err:
            if self._unreadable is not None:
                raise self._unreadable from err
            raise
        # When its background thread fails, streaming's iterator stops yielding without an error: an epoch cut short
        # on this rank alone, while the others wait for it in their next collective.
        if self._unreadable is not None:
            raise self._unreadable

    def __getitem__(self, idx: int) -> torch.Tensor:
        tokens = super().__getitem__(idx)[TOKENS_COLUMN]
        if tokens.shape != (self.max_seq_len,):
            folder = self._folder(self.spanner[idx][0])
            raise ValueError(f"the shards in {folder} hold samples of {tokens.shape[0]} tokens (sample {idx}), but "
                             f"model.max_seq_len={self.max_seq_len}; set model.max_seq_len={tokens.shape[0]}, or "
                             f"rebuild the shards with --seq-len {self.max_seq_len} (python -m "
                             "composer_qsdp.recipes.data.build ...)")
        if self.vocab_size is not None and int(tokens.max()) >= self.vocab_size:
            raise ValueError(f"shard sample {idx} holds token id {int(tokens.max())}, but the model's vocabulary has "
                             f"{self.vocab_size} ids: the shards were tokenized with a larger vocabulary; rebuild "
                             "them with the model's tokenizer (python -m composer_qsdp.recipes.data.build --tokenizer "
                             "DIR) or enlarge the model's vocab_size")
        return torch.from_numpy(tokens.astype(np.int64))


def _ignore_sigterm(worker_id: int) -> None:
    """A ``DataLoader`` worker's ``worker_init_fn``: SIGTERM is its rank's to handle. A scheduler that signals
    every process of the job (Slurm, a process-group kill) reaches the workers too, and one ended by it makes its
    rank raise at once (torch's check of its workers), before the rank's preemption save
    (:mod:`~composer_qsdp.recipes.preemption`). The rank still ends its workers when it is done with them, and a
    worker whose rank has died exits by itself (torch's watchdog)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


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
    ``WORLD_SIZE``), deterministically for a given ``shuffle_seed``, and resumes mid-epoch from a checkpoint. Its
    dataset holds threads and shared memory until the process exits unless it is given to
    :func:`~composer_qsdp.recipes.compat.release_streaming_dataset` when it is no longer read.

    Args:
        local: the shard directory (holding ``<split>/index.json``) when ``remote`` is None, else the local cache
            directory for the downloaded shards.
        split: subdirectory to read, e.g. ``"train"`` or ``"val"``.
        device_batch_size: samples per batch on this rank.
        max_seq_len: tokens per sample; checked against the shards now (their index.json, or their first sample
            where the index does not state the length), then against every sample read.
        remote: URL or path of the shards (``s3://...``, ``gs://...``, another directory), or None.
        shuffle: shuffle samples (training) or read them in order (evaluation).
        shuffle_seed: seed of the shuffle; the same on every rank.
        num_workers: ``DataLoader`` worker processes; they ignore SIGTERM, which their rank handles.
        drop_last: drop a final partial batch.
        collate_fn: turns a list of samples into the batch the model takes; None stacks them into one tensor.
        vocab_size: the model's vocabulary size; samples with larger ids are refused. None: not checked.

    Raises:
        ValueError: no shards at ``local`` (with no ``remote``), an empty split, samples of another length than
            ``max_seq_len`` (:func:`~composer_qsdp.recipes.data.shards.check_sample_length`) or with ids outside
            ``vocab_size``.
            Reading a damaged shard file (one that fails its hash in ``index.json``, or does not decode) later
            raises :class:`~composer_qsdp.recipes.data.integrity.UnreadableShardError` (a ``ValueError``) naming
            that file.
    """
    if remote is None and not shards_exist(local, (split,)):
        raise ValueError(f"no MDS shards for split {split!r} in {os.fspath(local)!r} (missing {split}/index.json); "
                         f"build them with: {build_command(None, local, max_seq_len)} (SOURCE: the text, e.g. "
                         "wikipedia or c4; python -m composer_qsdp.recipes.data.build --help lists them)")
    check_sample_length(local, split, max_seq_len)  # local shards: before streaming registers anything
    with registering_shared_memory():
        dataset = TokenSamples(max_seq_len=max_seq_len, vocab_size=vocab_size, local=os.fspath(local),
                               remote=remote, split=split, shuffle=shuffle, shuffle_seed=shuffle_seed,
                               batch_size=device_batch_size)
    try:
        if dataset.num_samples == 0:
            raise ValueError(f"split {split!r} in {os.fspath(local)!r} holds no samples")
        # Preparing a shard takes streaming's cache lock, whose file marks this dataset's shared-memory prefix as
        # taken: a later dataset's prefix look-up passes over it instead of attaching to each of its names, and
        # streaming keeps such an attachment open until that process exits.
        dataset.prepare_shard(0)
        check_sample_length(local, split, max_seq_len)  # a remote's index.json is local now
        dataset[0]  # fails now, naming the key, if the shards were built for another sequence length or vocabulary
    except BaseException:
        # Imported here: the compat module imports Composer, which reading shards does not need otherwise.
        from composer_qsdp.recipes.compat import release_streaming_dataset

        release_streaming_dataset(dataset)  # no caller gets it to release
        raise
    return DataLoader(dataset, batch_size=device_batch_size, num_workers=num_workers, drop_last=drop_last,
                      collate_fn=collate_fn, worker_init_fn=_ignore_sigterm if num_workers else None)
