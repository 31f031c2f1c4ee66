"""YAML training entrypoint for the recipes of yamls/ (llm-foundry style): GPT or Hugging Face models, QSDP.

Run it through Composer's launcher, one process per device::

    composer -n 8 -m composer_qsdp.recipes.train yamls/gpt-125m/qsdp-w8g8.yaml [key=value ...]

Each ``key=value`` (dotted for nested keys: ``model.max_seq_len=2048``, ``fsdp=null``) overrides the recipe,
omegaconf style. A recipe may start with ``base: other.yaml`` (a path relative to the recipe) to extend another
recipe; its own keys override the base's. ``--help`` lists every key with its type and default.

The recipe is checked completely (:mod:`composer_qsdp.recipes.loader`) before anything is built. This module imports
torch and Composer only when it trains, so ``--help`` answers at once.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import pickle
import shutil
import signal
import sys
import traceback
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from composer_qsdp.recipes.loader import (
    ALGORITHMS,
    RecipeError,
    TrainRecipe,
    ValidatedRecipe,
    build_algorithm,
    build_components,
    build_optimizer,
    build_scheduler,
    check_machine,
    load_recipe,
    recipe_help,
)
from composer_qsdp.recipes.startup import StartupClock

if TYPE_CHECKING:
    from composer_qsdp.recipes.run_files import RunPaths

__all__ = ["ALGORITHMS", "RECIPE_ERROR_STATUS", "CollectiveTimeoutError", "PeerExitedError", "Preempted",
           "RecipeError", "TrainRecipe", "ValidatedRecipe", "console_output", "link_latest_checkpoint", "load_recipe",
           "main", "set_aside_incomplete_checkpoints", "train"]


def _dataloader(recipe: ValidatedRecipe, split: str, batch_size: int, training: bool,
                run: contextlib.ExitStack) -> Any:
    """A dataloader of ``split``, whose dataset ``run`` releases when it closes."""
    # Training shuffles (unless data.shuffle is false) and keeps full batches only; evaluation reads every
    # sample in order.
    from composer_qsdp.recipes.compat import release_streaming_dataset
    from composer_qsdp.recipes.data import build_token_dataloader
    from composer_qsdp.recipes.models import HFCausalLMConfig, causal_lm_batch

    cfg = recipe.cfg
    collate = causal_lm_batch if isinstance(recipe.model_config, HFCausalLMConfig) else None
    try:
        loader = build_token_dataloader(cfg.data.local, split, batch_size, recipe.model_config.max_seq_len,
                                        remote=cfg.data.remote, shuffle=training and cfg.data.shuffle,
                                        shuffle_seed=cfg.seed, num_workers=cfg.data.num_workers, drop_last=training,
                                        collate_fn=collate, vocab_size=recipe.model_config.vocab_size)
    except ValueError as err:
        raise RecipeError(f"recipe section 'data': {err}") from None
    run.callback(release_streaming_dataset, loader.dataset)
    return loader


def console_output(progress_bar: bool | None, log_to_console: bool | None, is_terminal: bool) -> tuple[bool, bool]:
    """The ``(progress_bar, log_to_console)`` Composer gets: a recipe's null means a progress bar only on a terminal
    (its ANSI redraws are noise in log files and notebooks) and metric lines where there is no bar."""
    bar = is_terminal if progress_bar is None else progress_bar
    return bar, (not bar) if log_to_console is None else log_to_console


def _model(recipe: ValidatedRecipe) -> Any:
    """The recipe's Composer model; with ``model.init_device: meta`` a GPT on the meta device, which Composer's FSDP2
    preparation allocates and initialises shard by shard on the GPU (``GPT.param_init_fn``)."""
    import torch

    from composer_qsdp.recipes.models import ComposerGPT, HFCausalLMConfig, build_hf_causal_lm

    config = recipe.model_config
    if isinstance(config, HFCausalLMConfig):
        return build_hf_causal_lm(config)
    with torch.device(recipe.init_device):
        return ComposerGPT(config)


def _device(recipe: ValidatedRecipe) -> tuple[Any, Any]:
    """Composer's device for this process and, with ``device: gpu``, its :class:`~composer_qsdp.shared_gpu.GPUPlacement`
    (None on CPU)."""
    if recipe.cfg.device != "gpu":
        return recipe.cfg.device, None
    from composer_qsdp.shared_gpu import this_process_gpu

    fsdp = recipe.cfg.fsdp
    try:  # shared_gpu=auto is decided only here, by the GPUs this host shows, so is a full checkpoint's refusal
        return this_process_gpu(recipe.cfg.shared_gpu, fsdp.state_dict_type if fsdp is not None else None)
    except ValueError as err:
        raise RecipeError(f"recipe key 'device' = 'gpu': {err}") from None


class CollectiveTimeoutError(RuntimeError):
    """A collective waited ``dist_timeout`` seconds for the other processes: one stalled or died."""


class PeerExitedError(RuntimeError):
    """Another process of the job ended while this one waited for it in a collective; that process's own error (in
    its output, which the launcher prints) is the cause."""


class Preempted(Exception):
    """The run stopped on a signal after the batch its processes agreed on; the message names the signal, the batch
    and the checkpoint saved there (or that none was: no ``save_folder``)."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        #: The exit status a process stopped by ``signum`` reports: 128 + the signal's number, the shell's convention.
        self.status = 128 + signum


#: What gloo reports when the other end of a collective's connection is gone (its process ended).
_PEER_EXIT_MESSAGES = ("connection closed by peer", "connection reset by peer", "broken pipe")


def _peer_exit(err: BaseException | None) -> str | None:
    """The message of ``err`` (or an exception it was raised from) if it says that a peer process's connection
    closed, else None."""
    while err is not None:
        if isinstance(err, RuntimeError) and any(m in str(err).lower() for m in _PEER_EXIT_MESSAGES):
            return str(err).splitlines()[0]
        err = err.__cause__ or err.__context__
    return None


#: How long a rank whose collective timed out waits for the other ranks' reports of theirs (seconds, at most).
_REPORT_GRACE_S = 10.0


def _is_timeout(err: BaseException | None) -> bool:
    """Whether ``err`` (or an exception it was raised from) is a collective's timeout (gloo: "Timed out waiting
    ...ms for recv"; NCCL's watchdog: "... timeout ...")."""
    while err is not None:
        if isinstance(err, RuntimeError) and ("timed out" in str(err).lower() or "timeout" in str(err).lower()):
            return True
        err = err.__cause__ or err.__context__
    return False


def _collective_timeout(err: BaseException, timeout_s: float) -> CollectiveTimeoutError | None:
    """A :class:`CollectiveTimeoutError` naming the ranks that did not answer, if ``err`` is a collective's timeout.

    Every rank whose collective timed out reports itself in the process group's rendezvous store and waits briefly
    for the others' reports: the ranks that never report are the stalled (or dead) ones. The store lives in rank 0;
    when rank 0 itself is the stalled one, the message says that it cannot tell.
    """
    if not _is_timeout(err):
        return None
    import time
    from datetime import timedelta

    import torch.distributed as torch_dist

    from composer_qsdp.recipes.compat import default_store

    rank, world = torch_dist.get_rank(), torch_dist.get_world_size()
    grace = min(_REPORT_GRACE_S, timeout_s)
    try:
        store = default_store()
        store.set_timeout(timedelta(seconds=grace))
        store.set(f"composer_qsdp/timed_out/{rank}", "1")
        deadline = time.monotonic() + grace
        while True:
            silent = [r for r in range(world) if not store.check([f"composer_qsdp/timed_out/{r}"])]
            if not silent or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        who = (f"rank(s) {', '.join(map(str, silent))} of {world} did not answer: stalled (stopped, deadlocked, "
               "swapped out) or dead" if silent else "every rank reports the same timeout: the processes may wait in "
               "different collectives (a rank took another code path)")
    except Exception:  # noqa: BLE001 - the store itself does not answer: it is served by rank 0
        who = "which rank stalled is unknown: the rendezvous store (served by rank 0) does not answer either, so " \
              "rank 0 may be the stalled one"
    return CollectiveTimeoutError(
        f"rank {rank}: a collective waited dist_timeout={timeout_s:g} s for the other processes and timed out; {who}. "
        "If a step legitimately takes longer (a slow first step, a large checkpoint), raise the recipe key "
        "dist_timeout.")


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
            f"but no {latest.name} link naming the last complete one, and none has a checksum manifest that verifies "
            "it; autoresume would start again from batch 0. Resume from one of them with load_path=PATH (autoresume "
            f"false), or link {latest} to it, or move them out of the folder to start again")
    if dist.get_global_rank() == 0:
        os.symlink(checkpoint.name, latest)
    return checkpoint


def _resume_checkpoint(autoresume: bool, paths: RunPaths) -> Path | None:
    """The local checkpoint the Trainer will load, as Composer picks it from the formatted ``paths``: with
    ``autoresume``, the one that ``save_folder/latest-rank0.pt`` names, if any; else ``load_path``. None when it
    loads none or a remote one."""
    folder = paths.local_save_folder
    if autoresume and folder is not None and (folder / "latest-rank0.pt").exists():
        return (folder / "latest-rank0.pt").resolve()
    return paths.local_load_path


def _resume_key(autoresume: bool, paths: RunPaths) -> str:
    """The recipe key that chose the checkpoint to load, with the formatted path, for error messages."""
    folder = paths.local_save_folder
    if autoresume and folder is not None and (folder / "latest-rank0.pt").exists():
        return f"recipe key 'autoresume' (the checkpoint {folder / 'latest-rank0.pt'} names)"
    return f"recipe key 'load_path' = {paths.load_path!r}"


#: What reading a truncated or corrupt checkpoint raises, by the first line of its message: torch.load's zip reader,
#: pickle, and torch.distributed.checkpoint's reads.
_UNREADABLE_MESSAGES = ("pytorchstreamreader", "unpickling", "ran out of input", "unexpected eof", "truncated",
                        "invalid load key", "corrupt")


def _causes(err: BaseException | None) -> Iterator[BaseException]:
    """``err``, then what it was raised from; a ``torch.distributed.checkpoint`` ``CheckpointException``'s per-rank
    failures (and their causes) come before it."""
    while err is not None:
        for failure, _trace in getattr(err, "failures", {}).values():
            yield from _causes(failure)
        yield err
        err = err.__cause__ or err.__context__


def _unreadable(err: BaseException | None) -> str | None:
    """The first line of ``err`` or one of its :func:`_causes` if it says a checkpoint file could not be read, else
    None."""
    for cause in _causes(err):
        first = (str(cause).strip().splitlines() or [""])[0]
        if isinstance(cause, (EOFError, pickle.UnpicklingError)) or any(m in first.lower()
                                                                        for m in _UNREADABLE_MESSAGES):
            return f"{type(cause).__name__}: {first}"
    return None


def _disk_full(err: BaseException, paths: RunPaths, metrics_file: str | None) -> RecipeError | None:
    """A :class:`RecipeError` naming the file, the recipe key that put it there and the bytes free on its disk, if
    ``err`` or one of its :func:`_causes` is an ``ENOSPC`` ``OSError`` (a checkpoint or a metrics file that did not
    fit); else None. Without the error's own file name, the save folder is named."""
    full = next((c for c in _causes(err) if isinstance(c, OSError) and c.errno == errno.ENOSPC), None)
    if full is None:
        return None
    path = Path(full.filename) if full.filename else paths.local_save_folder
    if path is None:
        return None  # nothing of the recipe's to name: the error as it is
    path = path.absolute()
    metrics = Path(metrics_file).absolute() if metrics_file is not None else None
    # The metrics file is written through a temporary file beside it (metrics.json.tmp).
    if metrics is not None and path.parent == metrics.parent and path.name.startswith(metrics.name):
        key = "metrics_file"
    elif paths.local_save_folder is not None and path.is_relative_to(paths.local_save_folder.absolute()):
        key = "save_folder"
    else:
        key = None
    existing = next(p for p in (path, *path.parents) if p.exists())
    usage = shutil.disk_usage(existing)
    return RecipeError(f"{f'recipe key {key!r}' if key else 'a file of the run'}: the disk is full: writing {path} "
                       f"failed with ENOSPC ({full.strerror}); {usage.free} bytes free of {usage.total} on the file "
                       f"system of {existing}. Free space there{f' or point {key} at another disk' if key else ''}")


def _untrusted(err: BaseException | None) -> BaseException | None:
    """The :class:`~composer_qsdp.recipes.safe_load.UntrustedCheckpointError` among ``err`` and its
    :func:`_causes` (a sharded load raises it inside a ``CheckpointException``), else None."""
    from composer_qsdp.recipes.safe_load import UntrustedCheckpointError

    return next((cause for cause in _causes(err) if isinstance(cause, UntrustedCheckpointError)), None)


@contextlib.contextmanager
def _reading_checkpoint(autoresume: bool, paths: RunPaths, checkpoint: Path | None,
                        trust_checkpoint: bool) -> Iterator[None]:
    """Turn a failure to read ``checkpoint`` inside the block into a :class:`RecipeError` naming the file and the
    fix: a checkpoint refused for what it would run, or one that is truncated or corrupt."""
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

    try:
        yield
    except (Exception, CheckpointException) as err:
        refused = _untrusted(err)
        if refused is not None:
            chosen = checkpoint is not None or paths.load_path is not None  # else a callback's checkpoint
            key = _resume_key(autoresume, paths) if chosen else "recipe key 'trust_checkpoint' = False"
            raise RecipeError(f"{key}: {refused}") from None
        why = _unreadable(err) if checkpoint is not None else None
        if why is None:
            raise
        from composer_qsdp.recipes.checksums import remedy, short_file

        found = short_file(checkpoint, trust_checkpoint=trust_checkpoint)
        what = f"checkpoint file {found[0]}" if found else f"checkpoint {checkpoint}"
        raise RecipeError(f"{_resume_key(autoresume, paths)}: {what} is truncated or corrupt "
                          f"({found[1] if found else why}); {remedy(checkpoint)}") from err


def train(recipe: ValidatedRecipe, clock: StartupClock | None = None) -> Any:
    """Build the data, model, optimizer, schedule, parallelism, loggers, callbacks and algorithms of ``recipe``,
    then train; every checkpoint the run reads loads as data only, unless the recipe sets ``trust_checkpoint``
    (:func:`~composer_qsdp.recipes.safe_load.checkpoint_loading`).

    Args:
        recipe: the checked recipe.
        clock: the start-up clock to continue (:func:`main` starts one before it reads the recipe); a new one
            otherwise. Process 0 prints its phases before the first batch, and they are logged as ``startup/*``
            hyperparameters.

    Returns:
        The finished (closed) Composer ``Trainer``. Its datasets are released however the run ends (their prefetch
        threads stopped, their shared memory freed: :func:`~composer_qsdp.recipes.compat.release_streaming_dataset`),
        after its last checkpoint: its dataloaders cannot be read again.

    Raises:
        Preempted: the run received SIGTERM (``save_on_sigterm``) and stopped after saving the batch it was in.
        RecipeError: the machine cannot run the recipe (:func:`~composer_qsdp.recipes.loader.check_machine`), the shards
            named in ``data`` are missing or do not fit the model, an algorithm cannot run
            on the installed torch, or the checkpoint to resume from is truncated or corrupt (naming the file:
            :mod:`~composer_qsdp.recipes.checksums`) or needs more than the data a checkpoint may load without
            ``trust_checkpoint`` (naming the file and the global).
        CollectiveTimeoutError: a collective waited ``dist_timeout`` seconds for the other processes (a stalled or
            dead process), naming the ranks that did not answer where it can.
    """
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

    from composer_qsdp.recipes.safe_load import checkpoint_loading

    with checkpoint_loading(trust_checkpoint=recipe.cfg.trust_checkpoint), contextlib.ExitStack() as run:
        try:
            return _train(recipe, StartupClock() if clock is None else clock, run)
        except (Exception, CheckpointException) as err:
            refused = _untrusted(err) if not isinstance(err, RecipeError) else None
            if refused is None:
                raise
            # A checkpoint a callback loads while training (Composer's LoadCheckpoint at a later event).
            raise RecipeError(f"recipe key 'trust_checkpoint' = False: {refused}") from None


def _train(recipe: ValidatedRecipe, clock: StartupClock, run: contextlib.ExitStack) -> Any:
    """:func:`train`, inside its checkpoint loading context; ``run`` releases the datasets when it closes."""
    from composer import Evaluator, Trainer
    from composer.algorithms import GradientClipping
    from composer.callbacks import CheckpointSaver
    from composer.utils import FSDP2Config, dist, reproducibility
    from omegaconf import OmegaConf
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException: a failed sharded save

    from composer_qsdp.recipes.checksums import CheckpointChecksums, CorruptCheckpointError, verify_checkpoint
    from composer_qsdp.recipes.metrics_file import MetricsFile
    from composer_qsdp.recipes.preemption import SigtermCheckpoint
    from composer_qsdp.recipes.run_files import OwnerRecord, check_logger_files, claim_save_folder, run_name, run_paths

    clock.lap("imports")
    cfg = recipe.cfg
    check_machine(recipe)
    device, placement = _device(recipe)
    # The process group must exist before the streaming datasets are built: without one, each rank's
    # StreamingDataset creates temporary groups of its own, and concurrent ranks race on them at start-up.
    dist.initialize_dist(device, cfg.dist_timeout)
    clock.lap("process group")
    if placement is not None and placement.shared and dist.get_local_rank() == 0:
        print(placement.describe(), flush=True)
    # Composer's placeholders formatted as the Trainer will format them: every check below sees the real folder.
    paths = run_paths(cfg.save_folder, cfg.load_path, run_name(cfg.run_name))
    # Before anything in the folder is touched (the set-aside below renames files).
    owner = claim_save_folder(paths, autoresume=cfg.autoresume, overwrite=cfg.save_overwrite)
    if cfg.autoresume and paths.local_save_folder is not None:
        linked = link_latest_checkpoint(paths.local_save_folder)
        if linked is not None and dist.get_global_rank() == 0:
            warnings.warn(f"autoresume: {paths.local_save_folder} had no latest-rank0.pt link; linked it to "
                          f"{linked.name}, the newest checkpoint that its checksum manifest verifies", stacklevel=2)
        dist.barrier()
        if dist.get_global_rank() == 0:
            moved = set_aside_incomplete_checkpoints(paths.local_save_folder)
            if moved:
                warnings.warn(f"autoresume: {', '.join(map(str, moved))} hold(s) checkpoint(s) newer than the last "
                              "complete one (latest-rank0.pt), left by a save that never finished; set aside so "
                              "that the run resumes from the last complete checkpoint", stacklevel=2)
        dist.barrier()
    resume = _resume_checkpoint(cfg.autoresume, paths)
    if resume is not None:
        try:
            verify_checkpoint(resume)
        except CorruptCheckpointError as err:
            raise RecipeError(f"{_resume_key(cfg.autoresume, paths)}: {err}") from None
    world = dist.get_world_size()
    train_dl = _dataloader(recipe, cfg.data.train_split, cfg.global_train_batch_size // world, training=True,
                           run=run)
    eval_dl = None
    if cfg.data.eval_split is not None:
        eval_dl = Evaluator(label="val", metric_names=["LanguageCrossEntropy", "LanguagePerplexity"],
                            dataloader=_dataloader(recipe, cfg.data.eval_split, cfg.device_eval_batch_size,
                                                   training=False, run=run),
                            subset_num_batches=cfg.eval_subset_num_batches)

    clock.lap("data")
    # Every rank must start from the same weights; FSDP then shards them.
    reproducibility.seed_all(cfg.seed)
    model = _model(recipe)
    optimizer = build_optimizer(recipe, model.parameters())
    algorithms = [build_algorithm(name, kwargs) for name, kwargs in recipe.algorithm_kwargs.items()]
    if cfg.grad_clip_norm is not None:
        algorithms.append(GradientClipping(clipping_type="norm", clipping_threshold=cfg.grad_clip_norm))
    parallelism = None
    if cfg.fsdp is not None:
        # An FSDP2Config (not a dict) selects FSDP2 in composer 0.32.1 without the FSDP_VERSION variable.
        parallelism = {"fsdp": FSDP2Config(**OmegaConf.to_container(cfg.fsdp))}
    loggers = build_components(recipe, "loggers")
    callbacks = build_components(recipe, "callbacks")
    metrics = MetricsFile(cfg.metrics_file) if cfg.metrics_file is not None else None
    if metrics is not None:
        loggers.append(metrics)
    # Before the Trainer, whose FileLogger opens (truncates) its file at once; keys in the order built above.
    logger_keys = [f"loggers.{name}" for name in recipe.logger_kwargs] + ["metrics_file"]
    logger_files = check_logger_files(dict(zip(logger_keys, loggers)), paths, owner)

    clock.lap("model")
    progress_bar, log_to_console = console_output(cfg.progress_bar, cfg.log_to_console, sys.stdout.isatty())
    with _reading_checkpoint(cfg.autoresume, paths, resume, cfg.trust_checkpoint):  # the Trainer loads it
        trainer = Trainer(
            run_name=paths.run_name,
            model=model,
            train_dataloader=train_dl,
            eval_dataloader=eval_dl,
            eval_interval=cfg.eval_interval,
            max_duration=cfg.max_duration,
            optimizers=optimizer,
            schedulers=build_scheduler(recipe),
            algorithms=algorithms,
            device=device,
            precision=cfg.precision,
            parallelism_config=parallelism,
            device_train_microbatch_size=cfg.device_train_microbatch_size,
            seed=cfg.seed,
            dist_timeout=cfg.dist_timeout,
            save_folder=cfg.save_folder,
            save_interval=cfg.save_interval,
            save_num_checkpoints_to_keep=cfg.save_num_checkpoints_to_keep,
            save_overwrite=cfg.save_overwrite,
            load_path=cfg.load_path,
            autoresume=cfg.autoresume,
            progress_bar=progress_bar,
            log_to_console=log_to_console,
            console_log_interval=cfg.console_log_interval,
            loggers=loggers,
            callbacks=callbacks,
        )
    if paths.local_save_folder is not None:
        # After the saver in the callback order: each checkpoint's manifest is written at the event that saved it.
        saver = next(cb for cb in trainer.state.callbacks if isinstance(cb, CheckpointSaver))
        trainer.state.callbacks.append(CheckpointChecksums(saver))
        trainer.state.callbacks.append(OwnerRecord(saver, paths.local_save_folder, owner, logger_files))
    # Last: it stops the run after the saver and the callbacks above have acted on the batch's checkpoint.
    preemption = SigtermCheckpoint(next((cb for cb in trainer.state.callbacks if isinstance(cb, CheckpointSaver)),
                                        None)) if cfg.save_on_sigterm else None
    if preemption is not None:
        trainer.state.callbacks.append(preemption)
    if placement is not None:
        trainer.logger.log_hyperparameters(placement.hyperparameters())
    clock.lap("trainer")
    trainer.logger.log_hyperparameters(clock.hyperparameters())
    if dist.get_global_rank() == 0:
        print(clock.describe(), flush=True)
    try:
        with preemption.handling() if preemption is not None else contextlib.nullcontext():
            trainer.fit()
    except Preempted:
        if metrics is not None:  # written at fit end, which a stopped run never reaches: the batches it trained
            metrics.write(trainer.state)
        trainer.close()  # every process stops at the same batch: the closing barrier is met
        raise
    except (Exception, CheckpointException) as err:
        # No trainer.close() on any failure: its closing barrier would hold this process, and with it the job, for
        # dist_timeout while the other processes wait in a collective that this one never joins. Closing the engine
        # alone still flushes the loggers; this process then exits, its connections close, and the others' pending
        # collectives fail at once.
        stalled = _collective_timeout(err, cfg.dist_timeout)
        if stalled is not None:
            raise stalled from err
        trainer.engine.close()
        full = _disk_full(err, paths, cfg.metrics_file)
        if full is not None:
            raise full from err
        peer_exit = _peer_exit(err)
        if peer_exit is not None:
            raise PeerExitedError(
                f"rank {dist.get_global_rank()}: another process of the job ended while this one waited for it in a "
                f"collective ({peer_exit}); the launcher prints that process's error") from err
        raise
    trainer.close()
    if dist.get_global_rank() == 0:
        for algorithm in trainer.state.algorithms:
            if callable(getattr(algorithm, "traffic", None)):
                print(f"\n{type(algorithm).__name__} communication of rank 0 over "
                      f"{int(trainer.state.timestamp.batch)} batches:\n{algorithm.traffic().summary()}")
                if callable(getattr(algorithm, "eval_traffic", None)) and algorithm.eval_traffic().total.calls:
                    print(f"of which during evaluation:\n{algorithm.eval_traffic().summary()}")
        print(f"\nrun {paths.run_name}: {int(trainer.state.timestamp.batch)} batches; "
              + (f"metrics in {metrics.path} (JSON: docs/recipes.md, 'Reading the metrics')" if metrics is not None
                 else "no metrics file (metrics_file=PATH keeps the logged metrics as JSON)")
              + (f"; checkpoints in {paths.save_folder}" if paths.save_folder is not None else "; no checkpoints"),
              flush=True)
    return trainer


#: Exit status of a recipe error (on every process, whichever ends first); 1 is any other failure.
RECIPE_ERROR_STATUS = 2


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m composer_qsdp.recipes.train RECIPE.yaml [key=value ...]``; returns the exit status: 0, or
    :data:`RECIPE_ERROR_STATUS` for a recipe error (stderr says which key), 1 for any other failure. A process whose
    peer ended in a collective prints one line instead of a traceback: the peer's own traceback is the one to read.
    A process of a launched job (``WORLD_SIZE`` > 1) that fails ends at once with its status, after its error and
    the ``atexit`` callbacks, without waiting for library background threads, so its peers' collectives fail
    within seconds and the launcher's SIGTERM and SIGKILL are not needed."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(recipe_help())
        return 0 if argv else RECIPE_ERROR_STATUS
    # Every process checks the same recipe, but not at the same speed: when one finds a recipe error first and exits,
    # Composer's launcher SIGTERMs the others, and the job's status would be that of whichever process it reports.
    # SIGTERM waits until the check (seconds; the launcher waits 30 s before SIGKILL) is done: a process that finds
    # the error ends with its status, one that finds none receives the held signal then.
    clock = StartupClock()
    previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        recipe = load_recipe(argv[0], argv[1:], machine=True)  # the machine's problems with the recipe's
    except RecipeError as err:
        print(f"recipe error: {err}", file=sys.stderr, flush=True)
        return _end_launched(RECIPE_ERROR_STATUS)  # a launched process: no exit-time SIGTERM either
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
    clock.lap("recipe")
    try:
        train(recipe, clock)
    except (Exception, SystemExit) as err:
        launched = _launched()
        if launched:  # the launcher's SIGTERM (Composer's handler: sys.exit) must not cut the report short
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        if isinstance(err, RecipeError):
            print(f"recipe error: {err}", file=sys.stderr)
            status = RECIPE_ERROR_STATUS
        elif isinstance(err, Preempted):
            print(err, file=sys.stderr)
            status = err.status
        elif isinstance(err, PeerExitedError):
            print(f"{type(err).__name__}: {err}", file=sys.stderr)
            status = 1
        elif not launched:
            raise
        elif isinstance(err, SystemExit):  # Composer's SIGTERM handler: the launcher ends this process
            status = err.code if isinstance(err.code, int) else 1
            print(f"rank {os.environ.get('RANK', '?')}: stopped by the launcher (status {status}) because another "
                  "process of the job ended; the launcher prints that process's error", file=sys.stderr)
        else:
            traceback.print_exc()
            status = 1
        return _end_launched(status)
    return 0


def _launched() -> bool:
    """Whether this process is one of several that a launcher started (``WORLD_SIZE`` > 1)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def _end_launched(status: int) -> int:
    """End a launched process that failed with ``status`` now, without waiting for background threads; elsewhere
    return ``status``.

    Interpreter exit joins every non-daemon thread before it runs the ``atexit`` callbacks. On the recipe's path the
    only thread pool is mosaicml-streaming's (``StreamingDataset``'s ``_prepare_thread`` and ``_ready_thread``): its
    exit hook asks them to stop, but the ready thread's wait for a shard that is being prepared checks only the
    dataset's own error flag, so a process could wait there until the launcher's SIGKILL (Composer turns the
    launcher's SIGTERM into ``sys.exit``, which ends up in the same join), and a failed process whose sockets stay
    open makes its peers wait for ``dist_timeout``. The ``atexit`` callbacks (Composer's loggers, streaming's shared
    memory) still run; only the thread joins are skipped.
    """
    if not _launched():
        return status
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()  # what interpreter exit runs after the joins; os._exit runs none of it
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main())
