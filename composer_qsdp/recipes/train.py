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
import os
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Sequence
from typing import Any

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
from composer_qsdp.recipes.failures import (
    CollectiveTimeoutError,
    PeerExitedError,
    Preempted,
    collective_timeout,
    disk_full,
    peer_exit,
    untrusted,
)
from composer_qsdp.recipes.resume import (
    link_latest_checkpoint,
    reading_checkpoint,
    resume_checkpoint,
    resume_key,
    set_aside_incomplete_checkpoints,
    trained_out,
)
from composer_qsdp.recipes.startup import StartupClock

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

    if recipe.cfg.shared_gpu_transport == "samedev":
        from composer_qsdp.comm import register_same_device_backend

        register_same_device_backend()
    fsdp = recipe.cfg.fsdp
    try:  # shared_gpu=auto is decided only here, by the GPUs this host shows, so is a full checkpoint's refusal
        return this_process_gpu(recipe.cfg.shared_gpu, fsdp.state_dict_type if fsdp is not None else None,
                                recipe.cfg.shared_gpu_transport)
    except ValueError as err:
        raise RecipeError(f"recipe key 'device' = 'gpu': {err}") from None


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
        after its last checkpoint: its dataloaders cannot be read again. A failed process of a launched job
        (``WORLD_SIZE`` > 1) leaves them to its exit, which follows at once.

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

    try:
        with checkpoint_loading(trust_checkpoint=recipe.cfg.trust_checkpoint), contextlib.ExitStack() as run:
            try:
                return _train(recipe, StartupClock() if clock is None else clock, run)
            except BaseException:
                if _launched():
                    # A launched process ends right after its report (main), its threads with it. Releasing the
                    # datasets would join their prefetch threads, and one may wait for ever on streaming's cache lock
                    # held by the peer that stalled, which is what failed.
                    run.pop_all()
                raise
    except (Exception, CheckpointException) as err:
        refused = untrusted(err) if not isinstance(err, RecipeError) else None
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
    if cfg.deterministic_mode:
        # Before the first CUDA work (the process group's device): cuBLAS reads its workspace setting once.
        reproducibility.configure_deterministic_mode()
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
    resume = resume_checkpoint(cfg.autoresume, paths)
    if resume is not None:
        try:
            verify_checkpoint(resume)
        except CorruptCheckpointError as err:
            raise RecipeError(f"{resume_key(cfg.autoresume, paths)}: {err}") from None
    world = dist.get_world_size()
    train_dl = _dataloader(recipe, cfg.data.train_split, cfg.global_train_batch_size // world, training=True,
                           run=run)
    eval_dl = None
    if cfg.data.eval_split is not None:
        # One dataloader for every evaluator: algorithms.qsdp.eval_weights=both evaluates the same batches twice
        # (recipe.eval_labels), the exact and the quantized weights, paired within one run.
        eval_loader = _dataloader(recipe, cfg.data.eval_split, cfg.device_eval_batch_size, training=False, run=run)
        eval_dl = [Evaluator(label=label, metric_names=["LanguageCrossEntropy", "LanguagePerplexity"],
                             dataloader=eval_loader, subset_num_batches=cfg.eval_subset_num_batches)
                   for label in recipe.eval_labels]

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
    with reading_checkpoint(cfg.autoresume, paths, resume, cfg.trust_checkpoint):  # the Trainer loads it
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
            deterministic_mode=cfg.deterministic_mode,
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
                                        None), cfg.dist_timeout) if cfg.save_on_sigterm else None
    if preemption is not None:
        trainer.state.callbacks.append(preemption)
    if placement is not None:
        trainer.logger.log_hyperparameters(placement.hyperparameters())
    clock.lap("trainer")
    done = trained_out(trainer.state)
    if done is not None:
        trainer.close()
        if dist.get_global_rank() == 0:
            print(f"run {paths.run_name}: {done}; nothing to train (a larger max_duration trains on)", flush=True)
        return trainer
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
        stalled = collective_timeout(err, cfg.dist_timeout)
        if stalled is not None:
            raise stalled from err
        trainer.engine.close()
        full = disk_full(err, paths, cfg.metrics_file)
        if full is not None:
            raise full from err
        peer = peer_exit(err)
        if peer is not None:
            raise PeerExitedError(
                f"rank {dist.get_global_rank()}: another process of the job ended while this one waited for it in a "
                f"collective ({peer}); the launcher prints that process's error") from err
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
            if launched:
                _leave_the_launcher_the_first_exit()
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
    _close_launched_group()
    return 0


def _launched() -> bool:
    """Whether this process is one of several that a launcher started (``WORLD_SIZE`` > 1)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def _close_launched_group() -> None:
    """End the process groups of a launched process whose run ended well, so that it exits with status 0
    (:func:`composer_qsdp.comm.destroy_process_groups`: left to interpreter exit, gloo's workers can abort it after
    a run that trained to the end, and the launcher then reports the job failed)."""
    from composer_qsdp.comm import destroy_process_groups

    if _launched():
        destroy_process_groups()


#: How long a process whose peer ended waits for the launcher's SIGTERM before it exits itself (seconds, at most).
_PEER_EXIT_GRACE_S = 10.0


def _leave_the_launcher_the_first_exit() -> None:
    """Wait until the launcher sends SIGTERM, at most ``_PEER_EXIT_GRACE_S``; later SIGTERMs are only noted.

    A peer's death closes its sockets, so this process learns of it within milliseconds and would exit within the
    launcher's polling interval. Composer's launcher polls its processes in rank order and names the first failed one
    it finds, so a survivor of lower rank that had already exited would be named as the cause. The launcher's SIGTERM
    says that it has seen a failed process; without a launcher that sends one, the process ends after the grace. The
    handler is Python's, not a blocked-signal wait, because the signal may be delivered to any thread that does not
    block it.
    """
    received: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: received.append(signum))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    deadline = time.monotonic() + _PEER_EXIT_GRACE_S
    while not received and time.monotonic() < deadline:
        time.sleep(0.05)


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
