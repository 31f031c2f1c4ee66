"""Checksums of the recipe entrypoint's checkpoints: written beside each checkpoint when it is saved, verified
before a resume loads it, so that a truncated or corrupted file is refused by name instead of failing deep inside
``torch.load`` or ``torch.distributed.checkpoint`` (or, for flipped bytes inside a shard, loading silently).

A checkpoint is a folder (a sharded checkpoint: one ``.distcp`` file per rank and ``.metadata``) or one file (a
full checkpoint, written by process 0). Its manifest, ``checksums.json`` inside the folder or ``NAME.checksums.json``
beside the file, records each file's size in bytes and SHA-256:
``{"algorithm": "sha256", "files": {"__0_0.distcp": {"bytes": 123, "sha256": "..."}, ...}}``. The processes of the
job hash the files in turn (file ``i`` on process ``i % world_size``), so writing and checking cost one read of
the checkpoint spread over the processes. A manifest must list every file of its checkpoint, by its name in the
checkpoint's folder: an empty or partial map, or a path elsewhere, is refused as unable to vouch for the checkpoint.
A checkpoint without a manifest (written elsewhere, or by a process that died before writing it) is loaded
unchecked. Local paths only: remote (``s3://``...) checkpoints get none.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from composer.core import Callback, Event, State
from composer.loggers import Logger
from composer.utils import dist

__all__ = ["CheckpointChecksums", "CorruptCheckpointError", "checkpoint_batch", "manifest_path", "remedy", "short_file",
           "verify_checkpoint", "write_manifest"]

#: A sharded checkpoint's manifest, inside its folder.
MANIFEST_NAME = "checksums.json"
_CHUNK_BYTES = 1 << 22


class CorruptCheckpointError(RuntimeError):
    """A checkpoint file differs from what was written (truncated, overwritten, bit rot); the message names it."""


def manifest_path(checkpoint: str | os.PathLike) -> Path:
    """Where the manifest of ``checkpoint`` (a sharded checkpoint's folder or a full checkpoint's file) lives."""
    checkpoint = Path(checkpoint)
    return checkpoint / MANIFEST_NAME if checkpoint.is_dir() else checkpoint.with_name(checkpoint.name + ".checksums.json")


def _files(checkpoint: Path) -> list[str]:
    """The files of ``checkpoint``, relative to its folder (a file checkpoint: its own name)."""
    if not checkpoint.is_dir():
        return [checkpoint.name]
    return sorted(p.name for p in checkpoint.iterdir() if p.is_file() and p.name != MANIFEST_NAME)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _folder(checkpoint: Path) -> Path:
    return checkpoint if checkpoint.is_dir() else checkpoint.parent


def write_manifest(checkpoint: str | os.PathLike) -> Path:
    """Hash the files of ``checkpoint`` and write its manifest; collective (every process calls it, after the
    checkpoint is complete). Returns the manifest's path."""
    checkpoint = Path(checkpoint)
    names = _files(checkpoint)
    rank, world = dist.get_global_rank(), dist.get_world_size()
    mine = {name: {"bytes": (_folder(checkpoint) / name).stat().st_size, "sha256": _sha256(_folder(checkpoint) / name)}
            for name in names[rank::world]}
    files: dict[str, Any] = {}
    for part in dist.all_gather_object(mine):
        files.update(part)
    target = manifest_path(checkpoint)
    if rank == 0:  # a temporary file renamed: a reader never sees half a manifest
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(json.dumps({"algorithm": "sha256", "files": dict(sorted(files.items()))}, indent=1))
        os.replace(tmp, target)
    return target


def _check_file(folder: Path, name: str, recorded: dict[str, Any], manifest: Path) -> str | None:
    """Why the file ``name`` of ``folder`` differs from its ``recorded`` entry, or None when it matches."""
    path = folder / name
    if not path.is_file():
        return f"checkpoint file {path} is missing (listed in {manifest})"
    size = path.stat().st_size
    if size != recorded["bytes"]:
        return (f"checkpoint file {path} is truncated or corrupt ({size} bytes; {recorded['bytes']} were written, "
                f"as {manifest} records)")
    if _sha256(path) != recorded["sha256"]:
        return (f"checkpoint file {path} is corrupt (its SHA-256 differs from the one recorded when it was written, "
                f"in {manifest})")
    return None


def _manifest_problem(checkpoint: Path, manifest: Path, files: Any) -> str | None:
    """Why the file map ``files`` of ``checkpoint``'s ``manifest`` cannot vouch for it, or None: it must list every
    file of the checkpoint (an empty or partial map would leave files unchecked), each by its name inside the
    checkpoint's folder (a path elsewhere would check, and name, a file that is not part of it), with its size and
    hash."""
    if not isinstance(files, dict) or not files:
        return f"the checksum manifest {manifest} lists no files"
    for name, entry in files.items():
        if name in ("", ".", "..") or Path(name).name != name:
            return f"the checksum manifest {manifest} names {name!r}, a path outside the checkpoint's folder"
        if not (isinstance(entry, dict) and type(entry.get("bytes")) is int and isinstance(entry.get("sha256"), str)):
            return f"the checksum manifest {manifest} is unreadable (the entry of {name!r} is {entry!r})"
    unlisted = sorted(set(_files(checkpoint)) - set(files))
    if unlisted:
        return (f"the checksum manifest {manifest} does not list {', '.join(unlisted)} of the checkpoint, so it "
                "cannot vouch for it")
    return None


def verify_checkpoint(checkpoint: str | os.PathLike) -> bool:
    """Check the files of ``checkpoint`` against its manifest; collective. Returns False (checking nothing) when
    it has none, True when every file matches.

    Raises:
        CorruptCheckpointError: on every process alike, naming the first file that is missing, truncated or
            corrupt, or what is wrong with the manifest (:func:`_manifest_problem`), and what to do.
    """
    checkpoint = Path(checkpoint).resolve()  # the 'latest' link: the checkpoint it names
    manifest = manifest_path(checkpoint)
    shared: list[Any] = [None]
    if dist.get_global_rank() == 0 and manifest.is_file():
        try:
            files = json.loads(manifest.read_text())["files"]
        except (ValueError, KeyError, TypeError) as err:
            shared[0] = f"the checksum manifest {manifest} is unreadable ({err})"
        else:
            shared[0] = _manifest_problem(checkpoint, manifest, files) or files
    dist.broadcast_object_list(shared, src=0)
    files = shared[0]
    if files is None:
        return False
    problems: list[str] = [files] if isinstance(files, str) else []
    if not problems:
        names = sorted(files)
        rank, world = dist.get_global_rank(), dist.get_world_size()
        mine = [_check_file(_folder(checkpoint), name, files[name], manifest) for name in names[rank::world]]
        problems = [p for part in dist.all_gather_object([p for p in mine if p is not None]) for p in part]
    if problems:
        raise CorruptCheckpointError(f"{sorted(problems)[0]}; {remedy(checkpoint)}")
    return True


def short_file(checkpoint: str | os.PathLike, *, trust_checkpoint: bool = False) -> tuple[Path, str] | None:
    """Without a manifest: the file of a sharded ``checkpoint`` folder that is unreadable (``.metadata``), missing
    or shorter than ``.metadata`` says (each stored item's offset and length), with what is wrong with it; None
    when none is found, or when ``checkpoint`` is a file. ``.metadata`` is read as the run reads it: through the
    unpickler that finds only ``torch.distributed.checkpoint``'s metadata classes unless ``trust_checkpoint``
    (:func:`composer_qsdp.recipes.safe_load.checkpoint_loading`)."""
    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir():
        return None
    from torch.distributed.checkpoint import FileSystemReader

    from composer_qsdp.recipes.safe_load import checkpoint_loading

    try:
        with checkpoint_loading(trust_checkpoint=trust_checkpoint):
            storage = FileSystemReader(checkpoint).read_metadata().storage_data
    except Exception as err:  # noqa: BLE001 - any failure to read it is the answer
        return checkpoint / ".metadata", f"{type(err).__name__}: {err}"
    needed: dict[str, int] = {}
    for info in storage.values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for name, end in sorted(needed.items()):
        path = checkpoint / name
        if not path.is_file():
            return path, "missing"
        if path.stat().st_size < end:
            return path, f"{path.stat().st_size} bytes; .metadata places data up to byte {end}"
    return None


#: Composer's default checkpoint names, which the recipe keeps: ``ep0-ba6`` (sharded: a folder), ``ep0-ba6-rank0.pt``.
_CHECKPOINT_NAME = re.compile(r"ep(\d+)-ba(\d+)(-rank\d+)?(\.pt)?")


def checkpoint_batch(name: str) -> int | None:
    """The batch of a checkpoint named as the recipe names them (``ep0-ba6``, ``ep0-ba6-rank0.pt``), else None."""
    match = _CHECKPOINT_NAME.fullmatch(name)
    return None if match is None else int(match[2])


def remedy(checkpoint: str | os.PathLike) -> str:
    """What to do about a bad ``checkpoint``, naming the newest earlier checkpoint beside it if there is one."""
    checkpoint = Path(checkpoint)
    batch = checkpoint_batch(checkpoint.name)
    earlier = sorted((b, p) for p in checkpoint.parent.iterdir()
                     if batch is not None and (b := checkpoint_batch(p.name)) is not None and b < batch)
    where = f"load_path={earlier[-1][1]}, " if earlier else ""
    return (f"resume from an earlier checkpoint ({where}autoresume false) or start again; with autoresume, rename "
            f"{checkpoint} and point the save folder's latest-rank0.pt at an earlier checkpoint")


class CheckpointChecksums(Callback):
    """Writes the manifest of each checkpoint that Composer's ``CheckpointSaver`` ``saver`` writes, at the event it
    writes it; must run after it (append it to ``state.callbacks`` once the Trainer is built)."""

    def __init__(self, saver: Any) -> None:
        self.saver = saver
        self._last_batch = saver.last_checkpoint_batch

    def run_event(self, event: Event, state: State, logger: Logger) -> None:
        # Every process runs the saver's schedule and sets last_checkpoint_batch, but only process 0 records the
        # path of a full checkpoint: it tells the others.
        if self.saver.last_checkpoint_batch == self._last_batch:
            return
        self._last_batch = self.saver.last_checkpoint_batch
        new: list[Any] = [None]
        if dist.get_global_rank() == 0:
            saved = Path(self.saver.saved_checkpoints[-1])
            new[0] = str(saved.parent if state.fsdp_sharded_state_dict_enabled else saved)
        dist.broadcast_object_list(new, src=0)
        write_manifest(new[0])
        if dist.get_global_rank() == 0:  # a full checkpoint's manifest outlives it when the saver deletes old ones
            for manifest in Path(new[0]).parent.glob("*.checksums.json"):
                if not manifest.with_name(manifest.name.removesuffix(".checksums.json")).exists():
                    manifest.unlink()
