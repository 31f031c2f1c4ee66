"""What a recipe run reads and writes on the local disk, as Composer will use it: its name, and its paths with every
placeholder formatted (``save_folder: runs/{run_name}/ckpt``), so that the checks before training (the checkpoint
manifest, the save folder's owner, the files a logger would truncate) see the real folder and files, not the
format string. A save folder belongs to one run (:func:`claim_save_folder`, :class:`OwnerRecord`), and a logger
does not truncate a file that the run did not create (:func:`check_logger_files`).

Composer formats ``save_folder`` with the run's name and the process's place in the job (``{run_name}``,
``{rank}``, ``{node_rank}``, ...: ``format_name_with_dist``) and ``load_path`` with the run's name only; a run
without ``run_name`` gets ``COMPOSER_RUN_NAME``, ``RUN_NAME`` or a generated name. This module does the same with
Composer's own functions, and the recipe entrypoint hands the Trainer the name it chose.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from composer.core import Callback, Event, State
from composer.loggers import Logger
from composer.utils import dist, format_name_with_dist, partial_format

from composer_qsdp.recipes.checksums import checkpoint_batch
from composer_qsdp.recipes.loader.errors import RecipeError

__all__ = ["OWNER_FILE", "OwnerRecord", "RunPaths", "check_logger_files", "claim_save_folder", "known_run_name",
           "run_name", "run_paths"]


def known_run_name(configured: Optional[str]) -> Optional[str]:
    """The run's name as Composer's Trainer takes it before it generates one: the recipe's ``run_name``, else the
    ``COMPOSER_RUN_NAME`` or ``RUN_NAME`` environment variable; None when it would generate one."""
    for variable in ("COMPOSER_RUN_NAME", "RUN_NAME"):
        configured = os.getenv(variable) if configured is None else configured
    return configured


def run_name(configured: Optional[str]) -> str:
    """The run's name (:func:`known_run_name`), generated as Composer generates it where none is known; collective
    (every process calls it after the process group starts, and all get process 0's name)."""
    known = known_run_name(configured)
    if known is not None:
        return known
    # Composer's own generator (time and two random words, broadcast from process 0), so that a run named here is
    # named as the Trainer would have named it.
    from composer.trainer.trainer import _generate_run_name

    return _generate_run_name()


@dataclass(frozen=True)
class RunPaths:
    """The run's name and the recipe's checkpoint paths formatted as Composer formats them for this process.

    Attributes:
        run_name: the name the Trainer gets.
        save_folder: ``save_folder`` formatted (``format_name_with_dist``); None without one.
        load_path: ``load_path`` formatted (its ``{run_name}``); None without one.
    """

    run_name: str
    save_folder: Optional[str]
    load_path: Optional[str]

    @property
    def local_save_folder(self) -> Optional[Path]:
        """The save folder on this machine's disk; None without one or for a remote one (``s3://...``), which
        Composer's object store handles."""
        return None if self.save_folder is None or "://" in self.save_folder else Path(self.save_folder)

    @property
    def local_load_path(self) -> Optional[Path]:
        """The checkpoint ``load_path`` names on this machine's disk; None without one or for a remote one."""
        return None if self.load_path is None or "://" in self.load_path else Path(self.load_path)


def run_paths(save_folder: Optional[str], load_path: Optional[str], name: str) -> RunPaths:
    """``save_folder`` and ``load_path`` formatted for the run ``name`` on this process, as the Trainer formats them
    (its ``CheckpointSaver`` and autoresume: ``format_name_with_dist``; ``load_checkpoint``: the run name only)."""
    return RunPaths(run_name=name,
                    save_folder=None if save_folder is None else format_name_with_dist(save_folder, name),
                    load_path=None if load_path is None else partial_format(load_path, run_name=name))


#: The save folder's owner record, written at the run's first save: ``{"run_name": ..., "run_id": ...,
#: "files": [...]}``, the run id a random hex string drawn when the run first saved there, the files the absolute
#: paths of the files its loggers write (:func:`check_logger_files`).
OWNER_FILE = "run.json"


def _owner_record(folder: Path) -> dict[str, Any] | None:
    """The owner record of ``folder``, or None where it has none.

    Raises:
        RecipeError: the record cannot be read, naming it.
    """
    path = folder / OWNER_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        if not (isinstance(record.get("run_name"), str) and isinstance(record.get("run_id"), str)
                and isinstance(record.get("files", []), list)):
            raise ValueError("it needs run_name and run_id strings and a files list")
    except (ValueError, AttributeError, OSError) as err:
        raise RecipeError(f"recipe key 'save_folder': the folder's owner record {path} is unreadable ({err}); "
                          "remove it, or set save_overwrite: true to take the folder over") from None
    return {**record, "files": record.get("files", [])}


def _continues_from(paths: RunPaths, folder: Path) -> bool:
    """Whether ``load_path`` names a checkpoint inside ``folder``: the run continues that folder's run."""
    load = paths.local_load_path
    return load is not None and folder.resolve() in load.resolve().parents


def _claim(paths: RunPaths, folder: Path, autoresume: bool, overwrite: bool) -> dict[str, Any]:
    """The owner record this run writes to ``folder`` at its first save, if it may write there.

    Raises:
        RecipeError: the folder belongs to another run, or holds checkpoints of a run that recorded none, naming
            both runs and what to do.
    """
    record = _owner_record(folder)
    mine = {"run_name": paths.run_name, "run_id": uuid.uuid4().hex, "files": []}
    if overwrite:  # the run takes the folder over, with the files its run wrote
        return {**mine, "files": record["files"]} if record is not None else mine
    where = f"recipe key 'save_folder' = {str(folder)!r}"
    fixes = ("choose another save_folder, continue that run (autoresume: true with its run_name, or load_path: one "
             "of its checkpoints), or set save_overwrite: true to take the folder over")
    if record is None:
        saved = sorted(e.name for e in folder.iterdir() if checkpoint_batch(e.name) is not None) \
            if folder.is_dir() else []
        if saved and not (autoresume or _continues_from(paths, folder)):
            raise RecipeError(f"{where}: the folder holds checkpoints ({', '.join(saved[:3])}"
                              f"{', ...' if len(saved) > 3 else ''}) of a run that recorded no owner "
                              f"({OWNER_FILE}); this run {paths.run_name!r} would write its own beside them, and "
                              f"autoresume would then pick from both: {fixes}")
        return mine
    owner = f"{record['run_name']!r} (run id {record['run_id']}, recorded in {folder / OWNER_FILE})"
    if _continues_from(paths, folder) or (autoresume and record["run_name"] == paths.run_name):
        return record
    resumes = " resumes only the run it is named after" if autoresume else " is a new run (not an autoresume)"
    raise RecipeError(f"{where}: the folder belongs to run {owner}; this run {paths.run_name!r}{resumes}, and "
                      f"would write its checkpoints beside that run's, from which autoresume would then pick: {fixes}")


def claim_save_folder(paths: RunPaths, *, autoresume: bool, overwrite: bool) -> dict[str, Any] | None:
    """Check that this run may write checkpoints to its local save folder; collective (process 0 reads the folder
    and every process gets its answer). Returns the owner record that :class:`OwnerRecord` writes at the run's
    first save: this run's (a new run), or the folder's (a continuation); None without a local save folder.

    A folder belongs to the run recorded in its :data:`OWNER_FILE`. This run may write there when the folder has no
    record and no checkpoints, when it continues the folder's run (``autoresume`` under the recorded run name, or a
    ``load_path`` inside the folder), or with ``save_overwrite`` (the run takes the folder over). A folder with
    checkpoints but no record (written before records were kept) takes continuations only.

    Raises:
        RecipeError: on every process alike, naming the folder, its run and this run.
    """
    folder = paths.local_save_folder
    if folder is None:
        return None
    answer: list[Any] = [None]
    if dist.get_global_rank() == 0:
        try:
            answer[0] = _claim(paths, folder, autoresume, overwrite)
        except RecipeError as err:
            answer[0] = err
    dist.broadcast_object_list(answer, src=0)
    if isinstance(answer[0], RecipeError):
        raise answer[0]
    return answer[0]


class OwnerRecord(Callback):
    """Writes the save folder's owner record (:data:`OWNER_FILE`) at the run's first save by Composer's
    ``CheckpointSaver`` ``saver``: ``record`` (from :func:`claim_save_folder`) with the ``files`` of every process
    added; must run after the saver (append it to ``state.callbacks`` once the Trainer is built)."""

    def __init__(self, saver: Any, folder: Path, record: dict[str, Any], files: list[Path]) -> None:
        self.saver = saver
        self.folder = folder
        self.record: dict[str, Any] | None = record  # None once written
        self.files = files
        self._last_batch = saver.last_checkpoint_batch

    def run_event(self, event: Event, state: State, logger: Logger) -> None:
        if self.record is None or self.saver.last_checkpoint_batch == self._last_batch:
            return
        files = {str(f) for part in dist.all_gather_object([str(f) for f in self.files]) for f in part}
        if dist.get_global_rank() == 0:  # a temporary file renamed: a reader never sees half a record
            record = {**self.record, "files": sorted(files | set(self.record["files"]))}
            target = self.folder / OWNER_FILE
            tmp = target.with_name(target.name + ".tmp")
            tmp.write_text(json.dumps(record, indent=1))
            os.replace(tmp, target)
        self.record = None  # once: the first save


def _logger_files(loggers: Mapping[str, Any], name: str) -> dict[str, tuple[Path, Any]]:
    """The files that ``loggers`` (recipe key -> logger) write on this process, with Composer's placeholders
    formatted for the run ``name``: recipe key -> (absolute path, the logger)."""
    from composer.loggers import FileLogger

    from composer_qsdp.recipes.metrics_file import MetricsFile

    files = {}
    for key, logger in loggers.items():
        if isinstance(logger, FileLogger):  # FileLogger.filename formats its format string the same way
            files[f"{key}.filename"] = (Path(format_name_with_dist(logger.filename_format, name)).absolute(), logger)
        elif isinstance(logger, MetricsFile) and dist.get_global_rank() == 0:  # process 0 alone writes it
            files[key] = (logger.path.absolute(), logger)
    return files


def _logger_file_problem(key: str, path: Path, logger: Any, created: set[str], recorded: str) -> str | None:
    """Why the existing file ``path`` that ``logger`` (recipe key ``key``) writes must not be written, or None.

    A metrics file is replaced whole: one that an earlier metrics file wrote (:func:`~.metrics_file.is_metrics_file`)
    may be. Composer's ``FileLogger`` truncates its file (``overwrite: true``) or fails on an existing one
    (``overwrite: false``): it may truncate only a file this run wrote before, which ``created`` (the save folder's
    record, described by ``recorded``) lists.
    """
    from composer_qsdp.recipes.metrics_file import MetricsFile, is_metrics_file

    where = f"recipe key '{key}' = {str(path)!r}"
    fix = "choose a path that does not exist, or remove the file"
    if isinstance(logger, MetricsFile):
        if is_metrics_file(path):
            return None
        return (f"{where}: the file exists and is not a metrics file (a JSON object with the keys "
                f"{', '.join(MetricsFile.KEYS)}); the metrics file would replace it: {fix}")
    if str(path) not in created:
        return (f"{where}: the file exists and this run did not create it ({recorded}); the FileLogger would "
                f"{'truncate' if logger.overwrite else 'fail on'} it: {fix}")
    if not logger.overwrite:
        return (f"{where}: this run wrote the file before, and Composer's FileLogger opens it exclusively "
                f"(overwrite: false) and would fail: set {key.removesuffix('.filename')}.overwrite=true to start it "
                "again, or choose another path")
    return None


def check_logger_files(loggers: Mapping[str, Any], paths: RunPaths, record: dict[str, Any] | None) -> list[Path]:
    """Refuse an existing file that a logger of ``loggers`` (recipe key -> logger: ``loggers.file``,
    ``metrics_file``) would truncate or replace and that this run did not write (:func:`_logger_file_problem`;
    ``record``: the save folder's owner record from :func:`claim_save_folder`, None without a local save folder);
    collective. Returns this process's files, for the record.

    Raises:
        RecipeError: on every process alike, naming the first such file, its key and what to do.
    """
    files = _logger_files(loggers, paths.run_name)
    created = set(record["files"]) if record is not None else set()
    recorded = (f"the save folder's {OWNER_FILE} lists the files its run wrote" if record is not None
                else "without a local save_folder no run records its files")
    problems = [problem for key, (path, logger) in files.items()
                if path.exists() and (problem := _logger_file_problem(key, path, logger, created, recorded))]
    gathered = sorted(p for part in dist.all_gather_object(problems) for p in part)
    if gathered:
        raise RecipeError(gathered[0])
    return [path for path, _ in files.values()]
