"""What a recipe run reads and writes on the local disk, as Composer will use it: its name, and its paths with every
placeholder formatted (``save_folder: runs/{run_name}/ckpt``), so that the checks before training (the checkpoint
manifest, the save folder's owner, the files a logger would truncate) see the real folder and files, not the
format string.

Composer formats ``save_folder`` with the run's name and the process's place in the job (``{run_name}``,
``{rank}``, ``{node_rank}``, ...: ``format_name_with_dist``) and ``load_path`` with the run's name only; a run
without ``run_name`` gets ``COMPOSER_RUN_NAME``, ``RUN_NAME`` or a generated name. This module does the same with
Composer's own functions, and the recipe entrypoint hands the Trainer the name it chose.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from composer.utils import format_name_with_dist, partial_format

__all__ = ["RunPaths", "known_run_name", "run_name", "run_paths"]


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
