"""The semantic checks of a schema-merged recipe (value ranges, the model, durations, batch size vs world size, the
components' arguments), and of the machine that runs it."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from composer_qsdp._names import did_you_mean
from composer_qsdp.recipes.loader.arguments import (
    build_algorithm,
    check_arguments,
    class_section,
    component_kwargs,
    entry_kwargs,
)
from composer_qsdp.recipes.loader.components import ALGORITHMS, MODELS
from composer_qsdp.recipes.loader.errors import Problems, RecipeError, check, check_time
from composer_qsdp.recipes.loader.schema import (
    BOTH_EVAL_WEIGHTS,
    EVAL_LABEL,
    QUANTIZED_EVAL_LABEL,
    DEVICES,
    FSDP_MIXED_PRECISION,
    FSDP_STATE_DICT_TYPES,
    INIT_DEVICES,
    LLM_FOUNDRY_HINTS,
    MAX_DURATION_UNITS,
    PRECISIONS,
    ValidatedRecipe,
)
from composer_qsdp.recipes.loader.sources import unknown_key_message
from composer_qsdp.recipes.models.config import GPTConfig
from composer_qsdp.recipes.models.hf import HFCausalLMConfig
from composer_qsdp.shared_gpu import check_shared_gpu, check_shared_gpu_transport, check_state_dict_type
from composer_qsdp.validate import SEED_BITS

__all__ = ["check_machine", "machine_checks", "validate"]

# Algorithms that act on FSDP's collectives and are meaningless without it.
_NEEDS_FSDP = frozenset({"qsdp"})
# Algorithms that replace DDP's gradient all-reduce, which FSDP does not do.
_NEEDS_DDP = frozenset({"zero_one_adam"})

def check_machine(recipe: ValidatedRecipe) -> None:
    """Check what ``recipe`` needs of the machine that runs it, before any process group starts (:func:`load_recipe`
    checks the recipe itself, on any machine): a visible CUDA device for ``device: gpu``, a ``save_folder`` this
    process can write in or create, and local shards where the recipe reads no ``data.remote``.

    Raises:
        RecipeError: naming the key; every problem found in one error.
    """
    problems = Problems()
    machine_checks(recipe.cfg, recipe.model_config.max_seq_len, problems)
    problems.raise_if_any()


def machine_checks(cfg: DictConfig, max_seq_len: int | None, problems: Problems) -> None:
    """:func:`check_machine`'s checks of the merged recipe ``cfg`` (whose model takes ``max_seq_len`` tokens; None:
    an invalid model), each recorded in ``problems``."""
    with problems.collect():
        if cfg.device == "gpu":
            import torch

            meta = OmegaConf.select(cfg, "model.init_device") == "meta"
            cpu = " ".join(["device=cpu", *(["precision=fp32"] if cfg.precision != "fp32" else []),
                            *(["model.init_device=cpu"] if meta else [])])
            check(torch.cuda.is_available(), "device", cfg.device, "no CUDA device is visible to this process "
                  f"(torch.cuda.is_available() is False); use {cpu} (what a CPU run needs), or check the driver and "
                  "CUDA_VISIBLE_DEVICES; make try RECIPE=<this recipe> tries a GPU recipe on 2 CPU processes "
                  "(docs/recipes.md)")
    with problems.collect():
        from composer_qsdp.recipes.run_files import known_run_name, run_paths

        name = known_run_name(cfg.run_name)
        # Formatted as the Trainer will format it. A name the Trainer generates is not known yet: that folder is a
        # new one, whose existing parent is what is checked.
        _check_save_folder(cfg.save_folder if name is None else run_paths(cfg.save_folder, None, name).save_folder)
    with problems.collect():
        _check_local_shards(cfg, max_seq_len)


def _check_local_shards(cfg: DictConfig, seq_len: int | None) -> None:
    """Without ``data.remote``, ``data.local`` must hold the shards of every split the run reads; the error prints
    the command that builds them for this recipe (its ``data.source``, folder and ``model.max_seq_len``)."""
    from composer_qsdp.recipes.data.shards import build_command, shards_exist

    data = cfg.data
    if data.remote is not None:
        return  # downloaded at start-up; the dataloader reports a remote without shards
    missing = [split for split in (data.train_split, data.eval_split) if split and not shards_exist(data.local,
                                                                                                      (split,))]
    if not missing:
        return
    command = build_command(data.source, data.local, seq_len if seq_len is not None else "N",
                            _train_tokens(cfg, seq_len))
    source = "" if data.source else (" (SOURCE: the text, e.g. wikipedia or c4, which the recipe key data.source "
                                     "names; python -m composer_qsdp.recipes.data.build --help lists them)")
    raise RecipeError(f"recipe key 'data.local' = {data.local!r}: no MDS token shards there for split(s) "
                      f"{', '.join(missing)} (no {'/index.json, '.join(missing)}/index.json) and no data.remote to "
                      f"download them from; build them with: {command}{source}; or point data.local at built shards, "
                      "or data.remote at their URL")


def _train_tokens(cfg: DictConfig, seq_len: int | None) -> int | None:
    """The tokens a run of ``cfg`` trains on, where its ``max_duration`` says (in batches, samples or tokens)."""
    from composer.core import Time, TimeUnit

    batch = OmegaConf.select(cfg, "global_train_batch_size")  # None where it is missing or invalid
    try:
        duration = Time.from_timestring(str(OmegaConf.select(cfg, "max_duration")))
    except (ValueError, TypeError):
        return None
    if duration.unit == TimeUnit.TOKEN:
        return duration.value
    samples = {TimeUnit.BATCH: duration.value * (batch or 0), TimeUnit.SAMPLE: duration.value}
    tokens = samples.get(duration.unit, 0) * (seq_len or 0)
    return tokens if tokens > 0 else None


def _check_save_folder(folder: str | None) -> None:
    """A local ``save_folder`` must be a folder this process can write in, or one it can create (its nearest existing
    parent must be a writable folder); found now rather than at Trainer init or at the first checkpoint.

    Nothing is created: the check writes and removes an anonymous temporary file. A remote folder (``s3://...``) is
    Composer's object store's to check. A folder still holding a placeholder (``{run_name}`` of a run whose name the
    Trainer generates) does not exist yet, so only its existing parent is checked.
    """
    if folder is None or "://" in folder:
        return
    path = Path(folder).expanduser().absolute()
    existing = path
    while not existing.exists():
        existing = existing.parent
    where = "it" if existing == path else f"its nearest existing parent {str(existing)!r}"
    check(existing.is_dir(), "save_folder", folder, f"{where}: {str(existing)!r} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        raise RecipeError(f"recipe key 'save_folder' = {folder!r} is invalid; {where}: {str(existing)!r} cannot be "
                          f"written by this process ({err.strerror or err}); choose a folder it can write") from None



def _check_run_settings(cfg: DictConfig) -> None:
    """Refuse the run's names and checkpoint settings that Composer accepts but that fail or misbehave later: an
    empty path or run name, and a count of checkpoints to keep that deletes each local checkpoint as it is saved."""
    # "" is not null: Composer would save in, load from or write the working directory ("" + "/logs-rank0.txt" is a
    # file at the root for a run named "").
    for key in ("run_name", "save_folder", "load_path", "metrics_file"):
        value = OmegaConf.select(cfg, key)
        check(value is None or value.strip() != "", key, value, "it is empty; use null for none")
    # Composer's CheckpointSaver: -1 keeps every checkpoint, N >= 0 the newest N local ones, so 0 deletes each local
    # checkpoint right after it is written (meant for checkpoints uploaded to an object store) and the first save of
    # a local save_folder fails; below -1 is not a setting Composer defines. Without a save_folder nothing is saved.
    keep = cfg.save_num_checkpoints_to_keep
    remote = cfg.save_folder is not None and "://" in cfg.save_folder
    check(cfg.save_folder is None or keep == -1 or keep >= (0 if remote else 1), "save_num_checkpoints_to_keep", keep,
          "it must be -1 (keep all) or >= 1 (keep the newest N)" + (", or 0 (keep no local copy of the uploads)"
                                                                   if remote else "; 0, which deletes each local "
                                                                   "checkpoint as soon as it is saved, only with a "
                                                                   "remote save_folder (s3://...)"))


def _check_shard_sample_length(cfg: DictConfig, max_seq_len: int) -> None:
    """Refuse local shards (already built or downloaded) whose samples are not ``max_seq_len`` tokens long."""
    from composer_qsdp.recipes.data import check_sample_length  # imports streaming: only when a recipe is checked

    if not cfg.data.local:
        return
    for split in filter(None, (cfg.data.train_split, cfg.data.eval_split)):
        try:
            check_sample_length(cfg.data.local, split, max_seq_len)
        except ValueError as err:
            raise RecipeError(f"recipe key 'model.max_seq_len': {err}") from None


def _model_config(options: dict[str, Any]) -> GPTConfig | HFCausalLMConfig:
    name = options.pop("name", "gpt")
    if name not in MODELS:
        raise RecipeError(f"recipe key 'model.name' = {name!r} is invalid{did_you_mean(str(name), MODELS)}; "
                          f"allowed: {', '.join(MODELS)}")
    check_arguments("model", MODELS[name], options)
    try:
        return MODELS[name](**options)
    except (ValueError, ImportError) as err:
        raise RecipeError(f"recipe section 'model' is invalid: {err}") from None


def _init_device(cfg: DictConfig, options: dict[str, Any]) -> str:
    """``model.init_device`` of the model section ``options`` (removed from them), checked against the run."""
    key, value = "model.init_device", options.pop("init_device", "cpu")
    if value not in INIT_DEVICES:
        raise RecipeError(f"recipe key '{key}' = {value!r} is invalid{did_you_mean(str(value), INIT_DEVICES)}; "
                          f"allowed: {', '.join(INIT_DEVICES)} (meta initialises each process's shard on its GPU)")
    if value == "meta":
        check(options.get("name", "gpt") == "gpt", key, value,
              "only model.name: gpt initialises on the meta device. A Hugging Face model's weights come from "
              "transformers (loaded, or its own init), which Composer's meta initialisation would replace by each "
              "module's reset_parameters, which not all transformers modules have (GPT-2's Conv1D, Llama's "
              "RMSNorm); use model.init_device=cpu")
        check(cfg.device == "gpu", key, value, "it needs device: gpu (Composer's meta initialisation allocates the "
              "weights on CUDA); use model.init_device=cpu on the CPU")
        check(cfg.fsdp is not None, key, value, "it needs an 'fsdp' section (not null): FSDP2 allocates and "
              "initialises the weights shard by shard, DDP never does; use model.init_device=cpu with fsdp: null")
    return value


def validate(cfg: DictConfig, world_size: int | None = None, *, problems: Problems | None = None,
             machine: bool = False) -> ValidatedRecipe:  # fmt: skip
    """Check a complete schema-merged recipe's values; returns it with the model and the components' arguments.

    Independent checks all run, and their problems are reported together; a check that needs a value an earlier
    problem made invalid is skipped (the model's shards after an invalid model, an algorithm's optimizer check after
    an invalid optimizer).

    Args:
        cfg: the merged recipe.
        world_size: the processes the run will have (the batch sizes and ``ranks_per_node`` must fit them); None:
            this process's world (``WORLD_SIZE`` under a launcher, else 1).
        problems: the problems found before (:func:`~.sources.merged_recipe`), reported with these.
        machine: also check what the recipe needs of this machine (:func:`check_machine`).

    Raises:
        RecipeError: every problem found, each naming its key: the one's message, or several numbered.
    """
    from composer.utils import dist

    problems = Problems() if problems is None else problems
    collect = problems.collect
    shared_gpu = None
    with collect():
        check(cfg.device in DEVICES, "device", cfg.device, f"allowed: {', '.join(DEVICES)}")
    with collect():
        check(cfg.precision in PRECISIONS, "precision", cfg.precision, f"allowed: {', '.join(PRECISIONS)}")
    with collect():
        try:
            shared_gpu = check_shared_gpu(cfg.shared_gpu)
        except ValueError as err:
            raise RecipeError(f"recipe key 'shared_gpu': {err}") from None
        check(cfg.device == "gpu" or shared_gpu is not True, "shared_gpu", cfg.shared_gpu,
              "it shares GPUs between ranks, so it needs device: gpu")
    with collect():
        try:
            check_shared_gpu_transport(cfg.shared_gpu_transport)
        except ValueError as err:
            raise RecipeError(f"recipe key 'shared_gpu_transport': {err}") from None
    with collect():
        check(cfg.device != "cpu" or cfg.precision == "fp32", "precision", cfg.precision,
              "Composer trains on CPU in fp32 only")
    with collect():
        check(0 <= cfg.seed < 2**SEED_BITS, "seed", cfg.seed, f"it must be an integer in [0, 2**{SEED_BITS})")

    model_config = init_device = None
    with collect():
        model_options = OmegaConf.to_container(cfg.model, resolve=True)
        init_device = _init_device(cfg, model_options)
        model_config = _model_config(model_options)
        _check_shard_sample_length(cfg, model_config.max_seq_len)

    with collect():
        check_time("max_duration", cfg.max_duration, positive=True, units=MAX_DURATION_UNITS)
    for key in ("eval_interval", "save_interval", "console_log_interval"):
        with collect():
            check_time(key, OmegaConf.select(cfg, key), positive=True)

    # NaN fails every comparison, so it is refused too; inf would wait forever, which this key exists to prevent.
    with collect():
        check(math.isfinite(cfg.dist_timeout) and cfg.dist_timeout > 0, "dist_timeout", cfg.dist_timeout,
              "it must be a finite number of seconds > 0 (e.g. 600 for steps that take minutes)")

    world = dist.get_world_size() if world_size is None else world_size
    with collect():
        batch = cfg.global_train_batch_size
        check(batch >= 1 and batch % world == 0, "global_train_batch_size", batch,
              f"it must be a positive multiple of the world size ({world} processes)")
        micro = cfg.device_train_microbatch_size
        check(micro is None or (micro >= 1 and (batch // world) % micro == 0), "device_train_microbatch_size", micro,
              f"it must divide the per-device batch of {batch // world} samples")
    with collect():
        check(cfg.device_eval_batch_size >= 1, "device_eval_batch_size", cfg.device_eval_batch_size,
              "it must be >= 1")
    with collect():
        check(cfg.eval_subset_num_batches == -1 or cfg.eval_subset_num_batches >= 1, "eval_subset_num_batches",
              cfg.eval_subset_num_batches, "it must be -1 (all) or >= 1")
    with collect():
        check(cfg.data.num_workers >= 0, "data.num_workers", cfg.data.num_workers, "it must be >= 0")

    optimizer_kwargs = optimizer = scheduler_kwargs = None
    with collect():
        optimizer_kwargs, optimizer = class_section(cfg, "optimizer")
    with collect():
        scheduler_kwargs, _ = class_section(cfg, "scheduler")
    with collect():
        check(cfg.grad_clip_norm is None or cfg.grad_clip_norm > 0, "grad_clip_norm", cfg.grad_clip_norm,
              "it must be > 0, or null to disable clipping")

    if cfg.fsdp is not None:
        with collect():
            check(cfg.fsdp.mixed_precision in FSDP_MIXED_PRECISION, "fsdp.mixed_precision", cfg.fsdp.mixed_precision,
                  f"allowed: {', '.join(FSDP_MIXED_PRECISION)}")
        with collect():
            check(cfg.fsdp.state_dict_type in FSDP_STATE_DICT_TYPES, "fsdp.state_dict_type",
                  cfg.fsdp.state_dict_type, f"allowed: {', '.join(FSDP_STATE_DICT_TYPES)}")
            try:  # certain only with shared_gpu=true; auto is decided by the GPUs a run finds (recipes.train)
                check_state_dict_type(cfg.device == "gpu" and shared_gpu is True, cfg.fsdp.state_dict_type)
            except ValueError as err:
                raise RecipeError(str(err)) from None
        # Whether the group size divides the shard mesh is fully_shard's own check, at wrapping time.
        with collect():
            reshard = cfg.fsdp.reshard_after_forward
            check(isinstance(reshard, bool) or (isinstance(reshard, int) and reshard >= 2),
                  "fsdp.reshard_after_forward", reshard, "allowed: true, false, or an integer >= 2 (ranks of the "
                  "secondary shard group, e.g. the GPUs per node)")
    with collect():
        check(not cfg.autoresume or (cfg.save_folder is not None and cfg.run_name is not None), "autoresume",
              cfg.autoresume, "autoresume needs save_folder and run_name")
    with collect():
        _check_run_settings(cfg)

    components: dict[str, dict[str, Any]] = {"loggers": {}, "callbacks": {}}
    for section in components:
        for name, value in cfg[section].items():
            with collect():
                kwargs = component_kwargs(section, name, value, cfg.allow_imports)
                if kwargs is not None:
                    components[section][name] = kwargs

    algorithm_kwargs = {}
    for name, value in cfg.algorithms.items():
        with collect():
            kwargs = _algorithm_kwargs(cfg, name, value, world, optimizer, optimizer_kwargs is not None)
            if kwargs is not None:
                algorithm_kwargs[name] = kwargs
    if machine:
        machine_checks(cfg, None if model_config is None else model_config.max_seq_len, problems)
    problems.raise_if_any()
    eval_weights = algorithm_kwargs.get("qsdp", {}).get("eval_weights")
    quantized_eval = hasattr(eval_weights, "get") and eval_weights.get(QUANTIZED_EVAL_LABEL) is not None
    return ValidatedRecipe(cfg=cfg, model_config=model_config, init_device=init_device,
                           algorithm_kwargs=algorithm_kwargs, logger_kwargs=components["loggers"],
                           callback_kwargs=components["callbacks"], optimizer_kwargs=optimizer_kwargs,
                           scheduler_kwargs=scheduler_kwargs,
                           eval_labels=(EVAL_LABEL, QUANTIZED_EVAL_LABEL) if quantized_eval else (EVAL_LABEL,))


def _algorithm_kwargs(cfg: DictConfig, name: str, value: Any, world: int, optimizer: Any,
                      optimizer_valid: bool) -> dict[str, Any] | None:  # fmt: skip
    """The keyword arguments of the algorithm entry ``algorithms.<name>`` = ``value``, checked against the run (its
    FSDP or DDP, the ``world`` size, the ``optimizer`` class where ``optimizer_valid``); None: switched off."""
    if f"algorithms.{name}" in LLM_FOUNDRY_HINTS:
        raise RecipeError(unknown_key_message(f"algorithms.{name}"))
    check(name in ALGORITHMS, f"algorithms.{name}", name,
          f"known algorithms: {', '.join(ALGORITHMS)}{did_you_mean(name, ALGORITHMS)}")
    kwargs = entry_kwargs(f"algorithms.{name}", value)
    if kwargs is None:
        return None
    check(name not in _NEEDS_FSDP or cfg.fsdp is not None, f"algorithms.{name}", name,
          "it quantizes FSDP's collectives, so the recipe needs an 'fsdp' section (not null)")
    check(name not in _NEEDS_DDP or cfg.fsdp is None, f"algorithms.{name}", name,
          "it replaces DDP's gradient all-reduce, which FSDP does not do: set 'fsdp: null' in the recipe (fsdp=null "
          "on the command line)")
    if name == "qsdp" and kwargs.get("eval_weights") == "both":
        # A recipe-level choice: the second evaluator is the recipe's to build (recipes.train), QSDP gets the labels.
        check(cfg.data.eval_split is not None, "algorithms.qsdp.eval_weights", "both",
              "it evaluates data.eval_split twice (exact and quantized weights), so data.eval_split must be set")
        kwargs = {**kwargs, "eval_weights": dict(BOTH_EVAL_WEIGHTS)}
    algorithm = build_algorithm(name, kwargs)  # argument errors surface now, before anything is built
    ranks_per_node = kwargs.get("ranks_per_node")  # both algorithms' topology of the run; null: the launcher's
    if ranks_per_node is not None:
        divisors = [d for d in range(1, world + 1) if world % d == 0]
        check(type(ranks_per_node) is int and ranks_per_node in divisors, f"algorithms.{name}.ranks_per_node",
              ranks_per_node, f"it must divide the world size ({world} processes): every node holds equally "
              f"many ranks; allowed: {', '.join(map(str, divisors))}")
    check_optimizer = getattr(algorithm, "check_optimizer", None)
    if optimizer_valid and callable(check_optimizer):  # an algorithm that replaces or inspects the run's optimizer
        try:
            check_optimizer(optimizer)
        except ValueError as err:
            raise RecipeError(f"recipe key 'optimizer.name' = {cfg.optimizer.name!r} does not work with "
                              f"algorithms.{name}: {err}") from None
    return kwargs
