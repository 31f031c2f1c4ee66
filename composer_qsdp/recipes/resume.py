"""Which checkpoint a run resumes from, and a folder made fit to resume from: the ``latest`` link restored from the
checksum manifests, the remains of an unfinished save set aside, a failed read turned into an error naming the
file and the fix, and whether the resumed run has anything left to train."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from composer_qsdp.recipes.failures import unreadable, untrusted
from composer_qsdp.recipes.loader import RecipeError

if TYPE_CHECKING:
    from composer_qsdp.recipes.run_files import RunPaths

__all__ = ["NO_COMPLETE_CHECKPOINT", "link_latest_checkpoint", "reading_checkpoint", "resume_checkpoint", "resume_key",
           "set_aside_incomplete_checkpoints", "trained_out"]

#: What autoresume's error says when a save folder holds checkpoints of which none is known complete (every save
#: was cut short): a driver that may start its run again reads it from the run's log.
NO_COMPLETE_CHECKPOINT = "none has a checksum manifest that verifies it"


def set_aside_incomplete_checkpoints(save_folder: str | os.PathLike) -> list[Path]:
    """Rename the checkpoints of ``save_folder`` that are newer than the one ``latest-rank0.pt`` names (all of them
    when there is no such link) to ``NAME.incomplete``; returns the new paths.

    Composer links ``latest`` only after a checkpoint is complete, so a newer one is the remains of a save that a
    dying process never finished (a folder without its metadata, half a file). Autoresume loads the one ``latest``
    names, but Composer refuses to start while such remains might be overwritten by the resumed run; set aside,
    nothing is deleted.
    """
    from composer_qsdp.recipes.checksums import checkpoint_batch

    folder = Path(save_folder)
    latest = folder / "latest-rank0.pt"
    newest = -1
    if latest.is_symlink():
        linked = checkpoint_batch(Path(os.readlink(latest)).name)
        if linked is None:
            return []  # not a name this recipe writes: leave the folder alone
        newest = linked
    moved = []
    for entry in sorted(folder.iterdir()) if folder.is_dir() else []:
        batch = checkpoint_batch(entry.name)
        if batch is not None and batch > newest:
            target = entry.with_name(entry.name + ".incomplete")
            suffix = 1
            while target.exists():
                target, suffix = entry.with_name(f"{entry.name}.incomplete{suffix}"), suffix + 1
            entry.rename(target)
            moved.append(target)
    return moved


def link_latest_checkpoint(save_folder: str | os.PathLike) -> Path | None:
    """Where ``save_folder`` holds checkpoints but no ``latest-rank0.pt`` link, link it to the newest checkpoint
    whose checksum manifest verifies it, and return that checkpoint; None where the link exists or there are no
    checkpoints. Collective (every process calls it).

    Composer's autoresume starts from batch 0 when the link is missing (deleted, or a copy that dropped symlinks),
    and the later set-aside would move every checkpoint away: the run would silently repeat all its work. Only a
    manifest proves that a checkpoint was complete (it is written after the save), so one without is not picked.

    Raises:
        RecipeError: no checkpoint of the folder has a manifest that verifies it; naming the folder and its
            checkpoints.
    """
    from composer.utils import dist

    from composer_qsdp.recipes.checksums import CorruptCheckpointError, checkpoint_batch, verify_checkpoint

    folder = Path(save_folder)
    latest = folder / "latest-rank0.pt"
    found: list[Any] = [[]]  # process 0's view of the folder: every process then verifies the same checkpoints
    if dist.get_global_rank() == 0 and folder.is_dir() and not latest.is_symlink():
        batches = {p.name: checkpoint_batch(p.name) for p in folder.iterdir()}
        found[0] = sorted((name for name, batch in batches.items() if batch is not None), key=batches.get,
                          reverse=True)
    dist.broadcast_object_list(found, src=0)
    names: list[str] = found[0]
    if not names:
        return None
    for checkpoint in (folder / name for name in names):
        try:
            if verify_checkpoint(checkpoint):  # same answer on every process: the manifest is broadcast
                break
        except CorruptCheckpointError:
            continue
    else:
        raise RecipeError(
            f"recipe key 'autoresume': save_folder {folder} holds checkpoint(s) {', '.join(names)} "
            f"but no {latest.name} link naming the last complete one, and {NO_COMPLETE_CHECKPOINT}; autoresume "
            "would start again from batch 0. Resume from one of them with load_path=PATH (autoresume "
            f"false), or link {latest} to it, or move them out of the folder to start again")
    if dist.get_global_rank() == 0:
        os.symlink(checkpoint.name, latest)
    return checkpoint


def resume_checkpoint(autoresume: bool, paths: RunPaths) -> Path | None:
    """The local checkpoint the Trainer will load, as Composer picks it from the formatted ``paths``: with
    ``autoresume``, the one that ``save_folder/latest-rank0.pt`` names, if any; else ``load_path``. None when it
    loads none or a remote one."""
    folder = paths.local_save_folder
    if autoresume and folder is not None and (folder / "latest-rank0.pt").exists():
        return (folder / "latest-rank0.pt").resolve()
    return paths.local_load_path


def trained_out(state: Any) -> str | None:
    """What a run that resumed at or past its ``max_duration`` has already done (Composer's ``State`` after the
    Trainer loaded the checkpoint), or None when it has batches left. Composer's ``fit`` would raise "no training
    would occur" for such a run: rerunning a finished job (a requeue, a rerun script) is then a no-op instead."""
    duration = state.max_duration
    if duration is None or duration > state.timestamp.get(duration.unit):
        return None
    return (f"already trained {int(state.timestamp.batch)} batches, at or past max_duration={duration} (the "
            "checkpoint it resumed from)")


def resume_key(autoresume: bool, paths: RunPaths) -> str:
    """The recipe key that chose the checkpoint to load, with the formatted path, for error messages."""
    folder = paths.local_save_folder
    if autoresume and folder is not None and (folder / "latest-rank0.pt").exists():
        return f"recipe key 'autoresume' (the checkpoint {folder / 'latest-rank0.pt'} names)"
    return f"recipe key 'load_path' = {paths.load_path!r}"


@contextlib.contextmanager
def reading_checkpoint(autoresume: bool, paths: RunPaths, checkpoint: Path | None,
                        trust_checkpoint: bool) -> Iterator[None]:
    """Turn a failure to read ``checkpoint`` inside the block into a :class:`RecipeError` naming the file and the
    fix: a checkpoint refused for what it would run, or one that is truncated or corrupt."""
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

    try:
        yield
    except (Exception, CheckpointException) as err:
        refused = untrusted(err)
        if refused is not None:
            chosen = checkpoint is not None or paths.load_path is not None  # else a callback's checkpoint
            key = resume_key(autoresume, paths) if chosen else "recipe key 'trust_checkpoint' = False"
            raise RecipeError(f"{key}: {refused}") from None
        why = unreadable(err) if checkpoint is not None else None
        if why is None:
            raise
        from composer_qsdp.recipes.checksums import remedy, short_file

        found = short_file(checkpoint, trust_checkpoint=trust_checkpoint)
        what = f"checkpoint file {found[0]}" if found else f"checkpoint {checkpoint}"
        raise RecipeError(f"{resume_key(autoresume, paths)}: {what} is truncated or corrupt "
                          f"({found[1] if found else why}); {remedy(checkpoint)}") from err
