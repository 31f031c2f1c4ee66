"""Training recipes for :mod:`composer_qsdp.recipes.train`: the YAML schema, loading, validation and the key listing.

A recipe is checked against :class:`TrainRecipe` (unknown keys, missing values, wrong types) and then
semantically (value ranges, model, durations, loggers, callbacks, algorithm arguments, batch size vs world size)
before anything is built; every problem raises :class:`RecipeError` naming the key and what is allowed.

llm-foundry's spellings are accepted where the meaning is the same (``fsdp_config``, the ``optimizer`` and
``scheduler`` sections, ``model.name: hf_causal_lm`` with its keys, the ``loggers``/``callbacks`` names); the others
are refused with the key to write instead (:data:`LLM_FOUNDRY_HINTS`).

Importing this module loads only omegaconf, so ``--help`` answers at once; checks that need Composer or
``transformers`` import them when they run.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import json
import math
import os
import re
import tempfile
import textwrap
import typing
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Optional

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, InterpolationResolutionError, OmegaConfBaseException, ValidationError

from composer_qsdp._names import did_you_mean
from composer_qsdp.recipes.models.config import GPT_PRESETS, GPTConfig, gpt_config
from composer_qsdp.recipes.models.hf import HFCausalLMConfig, hf_causal_lm_config
from composer_qsdp.shared_gpu import check_shared_gpu, check_state_dict_type
from composer_qsdp.validate import SEED_BITS

__all__ = [
    "ALGORITHMS",
    "CALLBACKS",
    "CLASS_SECTIONS",
    "COMPONENT_SECTIONS",
    "LLM_FOUNDRY_ALIASES",
    "LLM_FOUNDRY_HINTS",
    "LOGGERS",
    "MODELS",
    "Builder",
    "RecipeError",
    "OPTIMIZERS",
    "SCHEDULERS",
    "TrainRecipe",
    "ValidatedRecipe",
    "build_algorithm",
    "build_optimizer",
    "build_scheduler",
    "check_machine",
    "component_class",
    "composer_components",
    "load_class",
    "load_recipe",
    "optim_class",
    "recipe_help",
]

USAGE = "composer -n N -m composer_qsdp.recipes.train RECIPE.yaml [key=value ...]"

#: Algorithms a recipe can enable under ``algorithms: {name: {kwargs}}``: name -> "module:Class".
ALGORITHMS: dict[str, str] = {
    "qsdp": "composer_qsdp.algorithms.qsdp:QSDP",
    "zero_one_adam": "composer_qsdp.algorithms.zero_one_adam:ZeroOneAdamDDP",
}
# Algorithms that act on FSDP's collectives and are meaningless without it.
_NEEDS_FSDP = frozenset({"qsdp"})
# Algorithms that replace DDP's gradient all-reduce, which FSDP does not do.
_NEEDS_DDP = frozenset({"zero_one_adam"})


@dataclass(frozen=True)
class Builder:
    """A class a recipe section names: ``target`` is "module:Class"; ``package`` the optional package it needs
    (installed by Composer's extra of the same name), if any; ``defaults`` the recipe's values of keyword arguments
    the section leaves out, where they differ from the class's own."""

    target: str
    package: Optional[str] = None
    defaults: Mapping[str, Any] = field(default_factory=dict)


#: Composer loggers a recipe can enable under ``loggers: {name: {kwargs}}`` (llm-foundry's names, plus ``file``).
LOGGERS: dict[str, Builder] = {
    "file": Builder("composer.loggers:FileLogger"),
    "mlflow": Builder("composer.loggers:MLFlowLogger", "mlflow"),
    "tensorboard": Builder("composer.loggers:TensorboardLogger", "tensorboard"),
    "wandb": Builder("composer.loggers:WandBLogger", "wandb"),
}
#: Composer callbacks a recipe can enable under ``callbacks: {name: {kwargs}}`` (llm-foundry's names).
CALLBACKS: dict[str, Builder] = {
    "lr_monitor": Builder("composer.callbacks:LRMonitor"),
    "memory_monitor": Builder("composer.callbacks:MemoryMonitor"),
    "optimizer_monitor": Builder("composer.callbacks:OptimizerMonitor"),
    "runtime_estimator": Builder("composer.callbacks:RuntimeEstimator"),
    "speed_monitor": Builder("composer.callbacks:SpeedMonitor"),
    "step_profile": Builder("composer_qsdp.recipes.step_profile:StepProfile"),
}
#: Models a recipe can name with ``model.name``: name -> the function that checks the section's other keys.
MODELS: dict[str, Callable[..., GPTConfig | HFCausalLMConfig]] = {
    "gpt": gpt_config,
    "hf_causal_lm": hf_causal_lm_config,
}

#: llm-foundry keys that mean the same as a key here: accepted and renamed.
LLM_FOUNDRY_ALIASES: dict[str, str] = {"fsdp_config": "fsdp"}
#: llm-foundry keys without a same-meaning key here: refused, with what to write instead.
LLM_FOUNDRY_HINTS: dict[str, str] = {
    "train_loader": "data: MDS token shards (data.local or data.remote, data.train_split, data.shuffle, "
                    "data.num_workers)",
    "eval_loader": "data.eval_split: a split of the same shards",
    "tokenizer": "nothing: the shards hold token ids (python -m composer_qsdp.recipes.data.build tokenizes, with GPT-2 or "
                 "--tokenizer DIR, a local Hugging Face tokenizer)",
    "max_seq_len": "model.max_seq_len",
    "global_seed": "seed",
    "device_train_batch_size": "global_train_batch_size (the samples of all processes together)",
    "fsdp.sharding_strategy": "fsdp.reshard_after_forward (true: FULL_SHARD, false: SHARD_GRAD_OP)",
    "algorithms.gradient_clipping": "grad_clip_norm (clips the global L2 norm)",
}

DEVICES = ("cpu", "gpu")
PRECISIONS = ("fp32", "amp_bf16", "amp_fp16")
FSDP_MIXED_PRECISION = ("DEFAULT", "PURE", "FULL")
FSDP_STATE_DICT_TYPES = ("sharded", "full")
# The recipe's defaults for the Adam family are the paper recipes' settings (yamls/base/paper-gpt.yaml); torch's own
# (AdamW: beta2 0.999, weight decay 0.01) would change a recipe that names AdamW without them.
_ADAM_DEFAULTS = MappingProxyType({"betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.0})
_WARMUP_DEFAULTS = MappingProxyType({"t_warmup": "100ba", "alpha_f": 0.1})
#: Optimizers by the recipe's own names (llm-foundry's ``decoupled_adamw``; torch's Adam family), with the recipe's
#: defaults. ``optimizer.name`` also takes every other optimizer class of composer.optim and torch.optim by its
#: name or snake-case name, llm-foundry's registered names where it is installed, and "module:Class" paths.
OPTIMIZERS: dict[str, Builder] = {
    "decoupled_adamw": Builder("composer.optim:DecoupledAdamW", defaults=_ADAM_DEFAULTS),
    "adamw": Builder("torch.optim:AdamW", defaults=_ADAM_DEFAULTS),
    "adam": Builder("torch.optim:Adam", defaults=_ADAM_DEFAULTS),
    "nadam": Builder("torch.optim:NAdam", defaults=_ADAM_DEFAULTS),
    "radam": Builder("torch.optim:RAdam", defaults=_ADAM_DEFAULTS),
    "adamax": Builder("torch.optim:Adamax", defaults=_ADAM_DEFAULTS),
}
#: Schedules by llm-foundry's names of Composer's warm-up schedules, with the recipe's defaults. ``scheduler.name``
#: also takes every other schedule class of composer.optim by its name or snake-case name (``step``,
#: ``multi_step``, ``constant``, ...), llm-foundry's registered names where it is installed, and "module:Class".
SCHEDULERS: dict[str, Builder] = {
    "cosine_with_warmup": Builder("composer.optim:CosineAnnealingWithWarmupScheduler", defaults=_WARMUP_DEFAULTS),
    "linear_decay_with_warmup": Builder("composer.optim:LinearWithWarmupScheduler", defaults=_WARMUP_DEFAULTS),
    "polynomial_with_warmup": Builder("composer.optim:PolynomialWithWarmupScheduler", defaults=_WARMUP_DEFAULTS),
}
#: ``optimizer.name`` and ``scheduler.name`` where a recipe leaves them out.
DEFAULT_CLASS_NAMES = {"optimizer": "decoupled_adamw", "scheduler": "cosine_with_warmup"}
# max_duration in 'dur' is circular; Composer refuses it.
MAX_DURATION_UNITS = ("ep", "iter", "ba", "sp", "tok")


#: The sections that name one class (``name``) and give its keyword arguments (the other keys).
CLASS_SECTIONS = ("optimizer", "scheduler")
#: The sections that map a component's name to its keyword arguments. Within one, ``name: {...}`` enables the
#: component (``{}``: its defaults; a base recipe's arguments are merged with these), ``name: null`` or ``name: false``
#: switches off one that a base recipe enabled; the section itself set to ``{}`` (or null) in a recipe or on the
#: command line replaces the base's: nothing of it is enabled.
COMPONENT_SECTIONS = ("loggers", "callbacks", "algorithms")


class RecipeError(ValueError):
    """A recipe that cannot run: the message names the offending key and what is allowed."""


def _key(default: Any = MISSING, doc: str = "", factory: Callable[[], Any] | None = None) -> Any:
    """A schema field with its ``--help`` text."""
    if factory is not None:
        return field(default_factory=factory, metadata={"doc": doc})
    return field(default=default, metadata={"doc": doc})


@dataclass
class DataSettings:
    """Where the MDS token shards are (written by ``python -m composer_qsdp.recipes.data.build``)."""

    local: str = _key(doc="shard directory, or the local cache directory when data.remote is set")
    remote: Optional[str] = _key(None, "URL or path of the shards (s3://, gs://, oci://, a directory)")
    train_split: str = _key("train", "subdirectory of the training samples")
    eval_split: Optional[str] = _key("val", "subdirectory of the evaluation samples; null: no evaluation")
    shuffle: bool = _key(True, "shuffle the training samples (seeded by seed)")
    num_workers: int = _key(0, "DataLoader worker processes")


@dataclass
class FSDPSettings:
    """Composer ``FSDP2Config`` fields (FSDP2 is always used when this section is present)."""

    # OmegaConf 2.3 has no bool | int: the value is checked in validation.
    reshard_after_forward: Any = _key(True, "free gathered weights after the forward (FULL_SHARD); false keeps "
                                            "them for the backward (SHARD_GRAD_OP); an integer k >= 2 keeps a "
                                            "secondary shard over k consecutive ranks and re-gathers it there in "
                                            "backward (ZeRO++'s hpZ, k = GPUs per node)")
    mixed_precision: str = _key("DEFAULT", "DEFAULT: parameters in the run precision, fp32 gradient reduction; "
                                           "PURE: both in the run precision; FULL: fp32")
    state_dict_type: str = _key("sharded", "checkpoints: sharded (a file per process) or full (not with ranks "
                                           "sharing GPUs: see shared_gpu)")
    activation_checkpointing: bool = _key(False, "recompute each FSDP unit's activations in the backward")


@dataclass
class TrainRecipe:
    """Schema of a training recipe; the YAML's keys and types must match it.

    Durations are Composer time strings (``"4800ba"``, ``"1ep"``, ``"2500000000tok"``). ``model`` names a model
    of :data:`MODELS` and its settings; ``optimizer`` and ``scheduler`` name a class (:func:`optim_class`) and give
    its keyword arguments; ``loggers``, ``callbacks`` and ``algorithms`` map a name of :data:`LOGGERS`,
    :data:`CALLBACKS`, :data:`ALGORITHMS` to the keyword arguments of its class.
    """

    model: dict[str, Any] = _key(doc="the model: see 'model' below")
    data: DataSettings = _key(factory=DataSettings)
    optimizer: dict[str, Any] = _key(doc="the optimizer: its name and keyword arguments, see 'optimizer' below",
                                     factory=lambda: {"name": DEFAULT_CLASS_NAMES["optimizer"]})
    max_duration: str = _key(doc="training duration, > 0, in ep, iter, ba, sp or tok")
    global_train_batch_size: int = _key(doc="samples per optimizer step, all processes together")
    device_train_microbatch_size: Optional[int] = _key(None, "samples per forward/backward; null: the whole "
                                                             "per-process batch")
    device_eval_batch_size: int = _key(8, "evaluation samples per batch and process")
    run_name: Optional[str] = _key(None, "name of the run (checkpoints, loggers)")
    seed: int = _key(17, f"seed of weights, data order and Composer, in [0, 2**{SEED_BITS})")
    device: str = _key("cpu", f"one of {', '.join(DEVICES)}")
    # OmegaConf 2.3 has no str | bool: the value is checked in validation.
    shared_gpu: Any = _key("auto", "device: gpu with fewer GPUs than ranks on a host: auto runs several ranks per "
                                   "GPU over gloo (numerics of one GPU per rank, timings no network's), only when "
                                   "the GPUs are too few; true always does; false refuses (NCCL, a GPU per rank)")
    precision: str = _key("fp32", f"one of {', '.join(PRECISIONS)} (fp32 only on cpu)")
    scheduler: dict[str, Any] = _key(doc="the learning-rate schedule: its name and keyword arguments, see "
                                         "'scheduler' below",
                                     factory=lambda: {"name": DEFAULT_CLASS_NAMES["scheduler"]})
    grad_clip_norm: Optional[float] = _key(1.0, "clip the global gradient L2 norm to this; null: no clipping")
    fsdp: Optional[FSDPSettings] = _key(doc="FSDP2 sharding (llm-foundry: fsdp_config); null: none (DDP or one "
                                            "process)", factory=FSDPSettings)
    loggers: dict[str, Any] = _key(doc="Composer loggers: see 'loggers' below", factory=dict)
    callbacks: dict[str, Any] = _key(doc="Composer callbacks: see 'callbacks' below", factory=dict)
    algorithms: dict[str, Any] = _key(doc="Composer algorithms: see 'algorithms' below", factory=dict)
    eval_interval: str = _key("500ba", "evaluate every this long (> 0)")
    eval_subset_num_batches: int = _key(-1, "batches per evaluation; -1: the whole eval split")
    dist_timeout: float = _key(300.0, "seconds the process-group set-up and every collective wait for the other "
                                      "processes; a stalled (stopped, deadlocked) or dead process ends the run "
                                      "after this long, with an error naming it where it can")
    save_folder: Optional[str] = _key(None, "checkpoint directory; null: no checkpoints")
    save_interval: str = _key("1000ba", "checkpoint every this long (> 0)")
    save_num_checkpoints_to_keep: int = _key(-1, "checkpoints kept; -1: all")
    save_overwrite: bool = _key(False, "overwrite existing checkpoints")
    load_path: Optional[str] = _key(None, "checkpoint to resume from")
    autoresume: bool = _key(False, "resume from the newest checkpoint in save_folder (needs run_name)")
    progress_bar: Optional[bool] = _key(None, "show Composer's progress bar; null: only when standard output is a "
                                               "terminal (no ANSI redraws in log files, CI logs and notebooks)")
    log_to_console: Optional[bool] = _key(None, "print the logged metrics every console_log_interval; null: when no "
                                                "progress bar is shown")
    console_log_interval: str = _key("1ba", "print metrics every this long (> 0)")
    metrics_file: Optional[str] = _key(None, "process 0 writes the logged metrics, QSDP's byte counters and the "
                                             "peak GPU memory (with the memory_monitor callback) as JSON after "
                                             "every evaluation and at the end")


@dataclass(frozen=True)
class ValidatedRecipe:
    """A recipe that passed every check, with the objects the checks already had to build.

    Attributes:
        cfg: the merged recipe (typed by :class:`TrainRecipe`).
        model_config: the model: a GPT's shape or a Hugging Face causal LM.
        algorithm_kwargs: name -> keyword arguments of each enabled algorithm.
        logger_kwargs: name -> keyword arguments of each enabled logger.
        callback_kwargs: name -> keyword arguments of each enabled callback.
        optimizer_kwargs: the keyword arguments of the optimizer ``cfg.optimizer.name`` besides its parameters, in
            the types its signature names (tuples, floats).
        scheduler_kwargs: the keyword arguments of the schedule ``cfg.scheduler.name``, durations as Composer
            ``Time``.
    """

    cfg: DictConfig
    model_config: GPTConfig | HFCausalLMConfig
    algorithm_kwargs: dict[str, dict[str, Any]]
    logger_kwargs: dict[str, dict[str, Any]]
    callback_kwargs: dict[str, dict[str, Any]]
    optimizer_kwargs: dict[str, Any]
    scheduler_kwargs: dict[str, Any]


# ------------------------------------------------------------------------------------------------ loading
def _accept_llm_foundry_spellings(cfg: DictConfig, source: str) -> DictConfig:
    """Rename the llm-foundry keys of one recipe source (a file, or the command line) to ours."""
    for theirs, ours in LLM_FOUNDRY_ALIASES.items():
        if theirs in cfg:
            if ours in cfg:
                raise RecipeError(f"{source} sets both '{theirs}' (llm-foundry's spelling) and '{ours}'; keep one")
            cfg[ours] = cfg.pop(theirs)
    return cfg


def _load_yaml(path: Path, chain: tuple[Path, ...] = ()) -> DictConfig:
    """Load ``path``, first merging the recipe named by its ``base:`` key (recursively)."""
    path = path.resolve()
    if path in chain:
        raise RecipeError(f"recipe base chain loops: {' -> '.join(map(str, chain + (path,)))}")
    if not path.is_file():
        raise RecipeError(f"recipe file {str(path)!r} does not exist")
    try:
        cfg = OmegaConf.load(path)
    except Exception as err:  # yaml.YAMLError and friends: report the file, not a parser stack
        raise RecipeError(f"recipe {str(path)!r} is not valid YAML: {err}") from None
    if not isinstance(cfg, DictConfig):
        raise RecipeError(f"recipe {str(path)!r} must be a mapping of keys, not a {type(cfg).__name__}")
    cfg = _accept_llm_foundry_spellings(cfg, f"recipe {str(path)!r}")
    base = cfg.pop("base", None)
    if base is None:
        return _merge_sources(OmegaConf.create(), cfg)
    if not isinstance(base, str):
        raise RecipeError(f"'base' in {str(path)!r} must be a path string, got {base!r}")
    return _merge_sources(_load_yaml(path.parent / base, chain + (path,)), cfg)


def _merge_sources(base: DictConfig, override: DictConfig) -> DictConfig:
    """``override`` (a recipe, or the command line) merged onto ``base``; a section of :data:`COMPONENT_SECTIONS`
    that ``override`` sets to ``{}``, null or false replaces the base's with an empty one instead of merging."""
    for section in CLASS_SECTIONS:
        # A section naming another class than the base's keeps only the base's keys that this class's signature
        # names too (an optimizer's lr and weight_decay, not Adam's betas for SGD; none for one taking **kwargs).
        value, base_value = override.get(section), base.get(section)
        if isinstance(value, DictConfig) and isinstance(base_value, DictConfig) and isinstance(value.get("name"), str):
            if value.name != base_value.get("name", DEFAULT_CLASS_NAMES[section]):
                takes = inspect.signature(optim_class(section, value.name)).parameters
                for key in [k for k in base_value if k not in takes or takes[k].kind in (takes[k].VAR_POSITIONAL,
                                                                                          takes[k].VAR_KEYWORD)]:
                    base_value.pop(key)
    for section in COMPONENT_SECTIONS:
        value = override.get(section, "absent")
        if value is None or value is False or (isinstance(value, DictConfig) and len(value) == 0):
            base.pop(section, None)
            override[section] = {}
        elif isinstance(value, DictConfig):
            # A list or a number cannot merge with a base's mapping. Unresolved: an entry may interpolate keys
            # that only the merged recipe has (``${scheduler.t_warmup}`` from a base).
            for name, entry in value.items_ex(resolve=False):
                _check_entry(f"{section}.{name}", entry)
    return OmegaConf.merge(base, override)


def _section_class(path: str) -> type | None:
    """The schema dataclass of the section at dotted ``path`` ("" for the top level), or None."""
    cls: Any = TrainRecipe
    for part in filter(None, path.split(".")):
        hint = typing.get_type_hints(cls).get(part) if dataclasses.is_dataclass(cls) else None
        cls = next((a for a in typing.get_args(hint) if dataclasses.is_dataclass(a)), hint)
    return cls if dataclasses.is_dataclass(cls) else None


def _unknown_key_message(key: str) -> str:
    parent, _, name = key.rpartition(".")
    hint = LLM_FOUNDRY_HINTS.get(key)
    if hint is not None:
        return f"unknown recipe key '{key}' (llm-foundry's spelling); here: {hint}"
    section = _section_class(parent)
    allowed = [f.name for f in dataclasses.fields(section)] if section else []
    where = f"; '{parent}' takes: {', '.join(allowed)}" if parent else " (composer_qsdp.recipes.train --help lists every key)"
    return f"unknown recipe key '{key}'{did_you_mean(name, allowed)}{where}"


def _merge_schema(*configs: DictConfig) -> DictConfig:
    """Merge ``configs`` onto the :class:`TrainRecipe` schema, turning omegaconf errors into RecipeErrors."""
    try:
        return OmegaConf.merge(OmegaConf.structured(TrainRecipe), *configs)
    except ConfigKeyError as err:
        raise RecipeError(_unknown_key_message(err.full_key)) from None
    except ValidationError as err:
        raise RecipeError(f"recipe key '{err.full_key}' has the wrong type: {err.msg.splitlines()[0]}") from None
    except OmegaConfBaseException as err:
        raise RecipeError(f"recipe key '{getattr(err, 'full_key', '?')}': {err.msg.splitlines()[0]}") from None


def _cli_overrides(overrides: Sequence[str]) -> DictConfig:
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise RecipeError(f"command-line override(s) {', '.join(map(repr, bad))} must have the form key=value")
    try:
        cfg = OmegaConf.from_dotlist(list(overrides))
    except OmegaConfBaseException as err:
        raise RecipeError(f"cannot parse command-line overrides {list(overrides)}: {err}") from None
    return _accept_llm_foundry_spellings(cfg, "the command line")


def load_recipe(path: str | os.PathLike, overrides: Sequence[str] = ()) -> ValidatedRecipe:
    """Load a YAML recipe, apply ``key=value`` overrides, and validate all of it; builds nothing heavy.

    Raises:
        RecipeError: a YAML, schema or value problem; the message names the key.
    """
    raw = _merge_sources(_load_yaml(Path(path)), _cli_overrides(overrides))
    cfg = _merge_schema(raw)
    for section in CLASS_SECTIONS:  # before any interpolation (``${scheduler.t_warmup}``) is resolved
        _add_defaults(cfg, section)
    # Merging never lets '???' replace a schema default, so look for it in the recipe as written too.
    try:
        missing = sorted(OmegaConf.missing_keys(raw) | OmegaConf.missing_keys(cfg))
    except InterpolationResolutionError as err:
        raise _unresolved(err, "") from None
    if missing:
        raise RecipeError(f"recipe is missing required key(s): {', '.join(missing)}")
    return _validate(cfg)


# --------------------------------------------------------------------------------------------- validation
def _check(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise RecipeError(f"recipe key '{key}' = {value!r} is invalid; {allowed}")


def _check_time(key: str, value: Any, *, positive: bool, units: Sequence[str] | None = None) -> Any:
    """``value`` must be a Composer duration, > 0 (``positive``) or >= 0, in one of ``units`` when given; returns
    it as Composer's ``Time``."""
    from composer.core import Time

    try:
        time = value if isinstance(value, Time) else Time.from_timestring(value)
    except (ValueError, TypeError, AttributeError):
        raise RecipeError(f"recipe key '{key}' = {value!r} is not a duration; use e.g. 4800ba, 1ep, "
                          "2500000000tok") from None
    _check(time.value > 0 if positive else time.value >= 0, key, value, f"it must be {'>' if positive else '>='} 0")
    _check(units is None or time.unit.value in units, key, value, f"its unit must be one of {', '.join(units or ())}")
    return time


def check_machine(recipe: ValidatedRecipe) -> None:
    """Check what ``recipe`` needs of the machine that runs it, before any process group starts (:func:`load_recipe`
    checks the recipe itself, on any machine): a visible CUDA device for ``device: gpu``, and a ``save_folder`` this
    process can write in or create.

    Raises:
        RecipeError: naming the key.
    """
    cfg = recipe.cfg
    if cfg.device == "gpu":
        import torch

        _check(torch.cuda.is_available(), "device", cfg.device, "no CUDA device is visible to this process "
               "(torch.cuda.is_available() is False); use device=cpu, or check the driver and CUDA_VISIBLE_DEVICES")
    _check_save_folder(cfg.save_folder)


def _check_save_folder(folder: str | None) -> None:
    """A local ``save_folder`` must be a folder this process can write in, or one it can create (its nearest existing
    parent must be a writable folder); found now rather than at Trainer init or at the first checkpoint.

    Nothing is created: the check writes and removes an anonymous temporary file. A remote folder (``s3://...``) is
    Composer's object store's to check. Composer's placeholders (``{run_name}``) are part of a folder that does not
    exist yet, so only its existing parent is checked.
    """
    if folder is None or "://" in folder:
        return
    path = Path(folder).expanduser().absolute()
    existing = path
    while not existing.exists():
        existing = existing.parent
    where = "it" if existing == path else f"its nearest existing parent {str(existing)!r}"
    _check(existing.is_dir(), "save_folder", folder, f"{where}: {str(existing)!r} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        raise RecipeError(f"recipe key 'save_folder' = {folder!r} is invalid; {where}: {str(existing)!r} cannot be "
                          f"written by this process ({err.strerror or err}); choose a folder it can write") from None


def load_class(target: str) -> type:
    """The class named by ``"module:Class"``."""
    module_name, class_name = target.split(":")
    return getattr(importlib.import_module(module_name), class_name)


def _algorithm_class(name: str) -> type:
    try:
        return load_class(ALGORITHMS[name])
    except ImportError as err:
        raise RecipeError(f"algorithm '{name}' ({ALGORITHMS[name]}) cannot be imported: {err}") from None


def build_algorithm(name: str, kwargs: dict[str, Any]) -> Any:
    """The algorithm ``name`` of :data:`ALGORITHMS` built with ``kwargs``.

    Raises:
        RecipeError: the class refuses the arguments.
    """
    try:
        return _algorithm_class(name)(**kwargs)
    except (TypeError, ValueError) as err:
        raise RecipeError(f"recipe section 'algorithms.{name}' is invalid: {err}") from None


def _check_arguments(section: str, function: Callable[..., Any], kwargs: Mapping[str, Any],
                     reserved: Sequence[str] = ()) -> None:
    """``kwargs`` must be keyword arguments ``function`` (a class or function) accepts, none of ``reserved`` (the
    ones the recipe fills in itself); one that takes ``**kwargs`` checks them itself."""
    signature = inspect.signature(function).parameters
    parameters = [name for name in signature if name not in reserved]
    for key in kwargs:
        if key in reserved:
            raise RecipeError(f"recipe key '{section}.{key}' cannot be set: the recipe passes it; '{section}' takes: "
                              f"{', '.join(parameters)}")
    if any(p.kind is p.VAR_KEYWORD for p in signature.values()):
        return
    for key in kwargs:
        if key not in parameters:
            raise RecipeError(f"recipe key '{section}.{key}' is unknown{did_you_mean(key, parameters)}; "
                              f"'{section}' takes: {', '.join(parameters)}")


def _entry_kwargs(key: str, value: Any) -> dict | None:
    """The keyword arguments an entry of a :data:`COMPONENT_SECTIONS` section gives (None: switched off)."""
    if value is None or value is False:
        return None
    if value is True:
        return {}
    _check_entry(key, value)
    return _resolved(key, value)


def _resolved(key: str, value: DictConfig) -> dict:
    """``value`` (the recipe's ``key``) as a plain dict with its interpolations resolved."""
    try:
        return OmegaConf.to_container(value, resolve=True)
    except InterpolationResolutionError as err:
        raise _unresolved(err, key) from None


def _unresolved(err: InterpolationResolutionError, key: str) -> RecipeError:
    """The error of an interpolation in ``key`` (or below it) that cannot be resolved, naming the key that holds it."""
    where = err.full_key or key
    if key and not where.startswith(key):
        where = f"{key}.{where}"
    message = f"recipe key '{where}' cannot be resolved: {err.msg.splitlines()[0]}"
    if any(f"'{section}." in err.msg for section in CLASS_SECTIONS):
        message += (" (an optimizer or scheduler section naming another class than its base's keeps only the base's "
                    "keys that class takes; give the value itself)")
    return RecipeError(message)


def _check_entry(key: str, value: Any) -> None:
    """An entry of a :data:`COMPONENT_SECTIONS` section is a mapping of keyword arguments, or off."""
    if value is not None and not isinstance(value, (bool, DictConfig)):
        raise RecipeError(f"recipe key '{key}' = {value!r} is invalid; give its keyword arguments as a mapping "
                          "({} for the defaults), or null (or false) to switch off one that a base recipe enabled")


def _snake(class_name: str) -> str:
    """``SpeedMonitor`` -> ``speed_monitor``, ``MLFlowLogger`` -> ``mlflow_logger``, ``LRMonitor`` -> ``lr_monitor``."""
    return re.sub(r"(?<!^)(?=[A-Z][a-z])", "_", class_name).lower()


def _word_snake(class_name: str) -> str:
    """``DecoupledSGDW`` -> ``decoupled_sgdw``, ``NAdam`` -> ``nadam``, ``MultiStepScheduler`` ->
    ``multi_step_scheduler``: a word starts only at a capital after a lowercase letter, so that optimizers'
    acronyms stay whole."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z][a-z])|(?<=[a-z])(?=[A-Z]{2})", "_", class_name).lower()


@dataclass(frozen=True)
class _ClassSource:
    """Where a section's names resolve beyond this package's tables: the public classes of ``modules`` derived from
    ``base`` ("module:Class"), by their name and ``snake`` name, also without ``suffix``."""

    modules: tuple[str, ...]
    base: str
    suffix: str
    snake: Callable[[str], str]


_COMPOSER_SECTIONS = {
    "loggers": _ClassSource(("composer.loggers",), "composer.loggers:LoggerDestination", "_logger", _snake),
    "callbacks": _ClassSource(("composer.callbacks",), "composer.core:Callback", "", _snake),
    "optimizer": _ClassSource(("composer.optim", "torch.optim"), "torch.optim:Optimizer", "", _word_snake),
    "scheduler": _ClassSource(("composer.optim",), "composer.optim:ComposerScheduler", "_scheduler", _word_snake),
}
#: The llm-foundry registry of each section, where llm-foundry is installed (its entry points included).
_LLM_FOUNDRY_REGISTRIES = {"loggers": "loggers", "callbacks": "callbacks", "optimizer": "optimizers",
                           "scheduler": "schedulers"}


def composer_components(section: str) -> dict[str, str]:
    """Every public class of ``section`` by recipe name -> "module:Class": Composer's loggers (``"loggers"``) or
    callbacks (``"callbacks"``), the optimizers of composer.optim and torch.optim (``"optimizer"``), Composer's
    schedules (``"scheduler"``).

    A class answers to its own name (``EarlyStopper``, ``StepScheduler``) and its snake-case name
    (``early_stopper``, ``step_scheduler``), also without the section's suffix (``tensorboard``, ``wandb``,
    ``in_memory``; ``step``, ``multi_step``, ``cosine_annealing_with_warmup``)."""
    source = _COMPOSER_SECTIONS[section]
    base = load_class(source.base)
    names: dict[str, str] = {}
    for module_name in source.modules:
        module = importlib.import_module(module_name)
        for class_name in getattr(module, "__all__", ()):
            cls = getattr(module, class_name, None)
            if not (isinstance(cls, type) and issubclass(cls, base)) or cls is base:
                continue
            snake = source.snake(class_name)
            for name in (class_name, snake, snake.removesuffix(source.suffix)):
                names.setdefault(name, f"{module_name}:{class_name}")
    return names


def _llm_foundry_registry(section: str) -> Any:
    """llm-foundry's registry of ``section`` (its entry points included), or None where llm-foundry is not
    installed."""
    if importlib.util.find_spec("llmfoundry") is None:
        return None
    return getattr(importlib.import_module("llmfoundry.registry"), _LLM_FOUNDRY_REGISTRIES[section])


def _llm_foundry_component(section: str, name: str) -> type | None:
    """The class llm-foundry's registry holds under ``name``, where llm-foundry is installed."""
    registry = _llm_foundry_registry(section)
    return registry.get(name) if registry is not None and name in registry.get_all() else None


def component_class(section: str, name: str) -> type:
    """The class a recipe's ``loggers`` or ``callbacks`` entry ``name`` names.

    Looked up in order: this package's names (:data:`LOGGERS`, :data:`CALLBACKS`), a ``"module:Class"`` path, every
    public Composer class of the section (:func:`composer_components`), llm-foundry's registry of the section
    (where llm-foundry is installed; packages register there through ``llmfoundry_loggers`` /
    ``llmfoundry_callbacks`` entry points).

    Raises:
        RecipeError: no such name (with a suggestion), an optional package is missing, or a path cannot be imported.
    """
    key = f"{section}.{name}"
    builders = LOGGERS if section == "loggers" else CALLBACKS
    builder = builders.get(name)
    if builder is not None:
        if builder.package is not None and importlib.util.find_spec(builder.package) is None:
            raise RecipeError(f"recipe key '{key}' needs the {builder.package} package: "
                              f"pip install 'mosaicml[{builder.package}]'")
        return load_class(builder.target)
    if ":" in name:
        return _load_path(key, name)
    composer = composer_components(section)
    if name in composer:
        return load_class(composer[name])
    found = _llm_foundry_component(section, name)
    if found is not None:
        return found
    known = sorted({*builders, *(n for n in composer if n.islower())})
    raise RecipeError(f"recipe key '{key}': no {section[:-1]} named {name!r}{did_you_mean(name, known)}; "
                      f"known: {', '.join(known)}, llm-foundry's registered names where it is installed, or a "
                      "'module:Class' path")


def _load_path(key: str, path: str) -> Callable[..., Any]:
    """The class a recipe key names by a ``"module:Class"`` path.

    Raises:
        RecipeError: the path cannot be imported, naming the key and the import error.
    """
    try:
        return load_class(path)
    except (ImportError, AttributeError, ValueError) as err:
        raise RecipeError(f"recipe key '{key}': cannot import {path!r} ('module:Class'): {err}") from None


def _component_kwargs(section: str, name: str, value: Any) -> dict | None:
    """The keyword arguments of the logger or callback ``name`` (None: switched off), checked against its class."""
    key = f"{section}.{name}"
    kwargs = _entry_kwargs(key, value)
    if kwargs is None:
        return None
    _check_arguments(key, component_class(section, name), kwargs)
    return kwargs


def optim_class(section: str, name: str) -> Callable[..., Any]:
    """The class (or factory) that the recipe's ``optimizer`` or ``scheduler`` section names with ``name``.

    Looked up in order: this package's names (:data:`OPTIMIZERS`, :data:`SCHEDULERS`), a ``"module:Class"`` path,
    llm-foundry's ``optimizers`` or ``schedulers`` registry where llm-foundry is installed (packages add to it
    through ``llmfoundry_optimizers`` / ``llmfoundry_schedulers`` entry points), every public optimizer class of
    composer.optim and torch.optim or schedule class of composer.optim (:func:`composer_components`).

    Raises:
        RecipeError: no such name (with a suggestion and the known names), or a path cannot be imported.
    """
    key = f"{section}.name"
    table = OPTIMIZERS if section == "optimizer" else SCHEDULERS
    if name in table:
        return load_class(table[name].target)
    if ":" in name:
        return _load_path(key, name)
    found = _llm_foundry_component(section, name)
    if found is not None:
        return found
    composer = composer_components(section)
    if name in composer:
        return load_class(composer[name])
    registry = _llm_foundry_registry(section)
    suffix = _COMPOSER_SECTIONS[section].suffix
    known = sorted({*table, *(n for n in composer if n.islower() and not (suffix and n.endswith(suffix))),
                    *(registry.get_all() if registry is not None else ())})
    foundry = "" if registry is not None else "llm-foundry's registered names where it is installed, "
    kind = "schedule" if section == "scheduler" else section
    raise RecipeError(f"recipe key '{key}' = {name!r} is invalid: no {kind} of that name{did_you_mean(name, known)}; "
                      f"known: {', '.join(known)} (or the class names), {foundry}or a 'module:Class' path")


#: Keys that mean the same to every optimizer or schedule that takes them: the check and what is allowed.
_SAME_MEANING: dict[str, tuple[Callable[[Any], bool], str]] = {
    "optimizer.lr": (lambda v: 0 < v < math.inf, "it must be a finite number > 0"),
    "optimizer.eps": (lambda v: 0 < v < math.inf, "it must be a finite number > 0"),
    "optimizer.weight_decay": (lambda v: 0 <= v < math.inf, "it must be a finite number >= 0"),
    "optimizer.betas": (lambda v: len(v) == 2 and all(_is_number(b) and 0 <= b < 1 for b in v),
                        "it must be two numbers in [0, 1)"),
    "scheduler.alpha_f": (lambda v: 0 <= v <= 1, "it must be in [0, 1]"),
}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _typed(key: str, parameter: inspect.Parameter | None, value: Any) -> Any:
    """The recipe value ``value`` of ``key`` in the type that ``parameter``'s annotation names: Composer durations
    (one or a list) as ``Time``, a list as a tuple, an integer or a number's text as a float; else as it is."""
    if parameter is None:  # a **kwargs argument: the class checks it
        return value
    hint = parameter.annotation
    text = hint if isinstance(hint, str) else repr(hint)
    if re.search(r"\bTime\b", text):
        if isinstance(value, (list, tuple)):
            return [_check_time(f"{key}[{i}]", v, positive=False) for i, v in enumerate(value)]
        return _check_time(key, value, positive=False)
    if isinstance(value, list) and ("tuple" in text.lower() or isinstance(parameter.default, tuple)):
        return tuple(value)
    if re.search(r"\bfloat\b", text) and (isinstance(value, int) and not isinstance(value, bool)
                                          or isinstance(value, str) and not re.search(r"\bstr\b", text)):
        try:
            return float(value)
        except ValueError:
            raise RecipeError(f"recipe key '{key}' = {value!r} is invalid; it must be a number") from None
    return value


def _add_defaults(cfg: DictConfig, section: str) -> None:
    """Add to the ``optimizer`` or ``scheduler`` section (``section``) of ``cfg`` its name's recipe defaults
    (:data:`OPTIMIZERS`, :data:`SCHEDULERS`) for the keys it leaves out."""
    name = cfg[section].get("name", DEFAULT_CLASS_NAMES[section])
    _check(isinstance(name, str), f"{section}.name", name, "it must be a name or a 'module:Class' path")
    optim_class(section, name)  # an unknown name is the error to report, not what interpolating its keys then finds
    table = OPTIMIZERS if section == "optimizer" else SCHEDULERS
    cfg[section]["name"] = name
    for key, value in (table[name].defaults if name in table else {}).items():
        if key not in cfg[section]:
            cfg[section][key] = value


def _class_section(cfg: DictConfig, section: str) -> tuple[dict[str, Any], Any]:
    """Check the recipe's ``optimizer`` or ``scheduler`` section (``section``) against the class it names.

    Returns:
        The class's keyword arguments in its types (an optimizer's besides its parameters), and the optimizer built
        on a one-element parameter, or the schedule.

    Raises:
        RecipeError: an unknown name, an argument the class does not take or needs, a value it refuses.
    """
    import torch

    options = _resolved(section, cfg[section])
    name = options.pop("name")
    cls = optim_class(section, name)
    if isinstance(cls, type) and section == "optimizer":
        _check(issubclass(cls, torch.optim.Optimizer), "optimizer.name", name,
               f"it names {cls.__name__}, not a torch.optim.Optimizer")
    elif isinstance(cls, type):
        _check(not issubclass(cls, torch.optim.lr_scheduler.LRScheduler), "scheduler.name", name,
               "it is a torch LRScheduler, which is built on the optimizer; name a Composer schedule (composer.optim: "
               "step, multi_step, exponential, ...)")
    reserved = ("params",) if section == "optimizer" else ()
    _check_arguments(section, cls, options, reserved)
    parameters = inspect.signature(cls).parameters
    required = [p for p in parameters.values() if p.default is p.empty and p.name not in reserved
                and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    missing = [p.name for p in required if p.name not in options]
    if section == "optimizer" and "lr" in parameters and "lr" not in options:
        missing.append("lr")
    if missing:
        raise RecipeError(f"recipe is missing required key(s): {', '.join(f'{section}.{k}' for k in missing)} (the "
                          f"keyword arguments of {section}.name {name!r} without a default"
                          + ("; an optimizer's lr is always required)" if section == "optimizer" else ")"))
    kwargs = {k: _typed(f"{section}.{k}", parameters.get(k), v) for k, v in options.items()}
    for k, v in kwargs.items():
        check, allowed = _SAME_MEANING.get(f"{section}.{k}", (None, ""))
        if check is not None:
            try:
                ok = (_is_number(v) or isinstance(v, tuple)) and check(v)
            except TypeError:  # a tuple of other things
                ok = False
            _check(ok, f"{section}.{k}", list(v) if isinstance(v, tuple) else v, allowed)
    try:
        with warnings.catch_warnings():  # advice on the values (Composer's on weight decay) comes when training
            warnings.simplefilter("ignore")
            built = cls([torch.nn.Parameter(torch.zeros(1))], **kwargs) if section == "optimizer" else cls(**kwargs)
    except (TypeError, ValueError) as err:
        raise RecipeError(f"recipe section '{section}' ({name}) is invalid: {err}") from None
    if section == "optimizer":
        _check(isinstance(built, torch.optim.Optimizer), "optimizer.name", name,
               f"it names {type(built).__name__}, not a torch.optim.Optimizer")
    else:
        _check(callable(built) and not isinstance(built, torch.optim.lr_scheduler.LRScheduler), "scheduler.name",
               name, f"it builds a {type(built).__name__}, not a Composer schedule (a function of the training state, "
               "e.g. a composer.optim.ComposerScheduler)")
    return kwargs, built


def build_optimizer(recipe: ValidatedRecipe, params: Any) -> Any:
    """The optimizer of ``recipe``'s ``optimizer`` section over ``params`` (a model's parameters)."""
    return optim_class("optimizer", recipe.cfg.optimizer.name)(params, **recipe.optimizer_kwargs)


def build_scheduler(recipe: ValidatedRecipe) -> Any:
    """The learning-rate schedule of ``recipe``'s ``scheduler`` section (a Composer schedule)."""
    return optim_class("scheduler", recipe.cfg.scheduler.name)(**recipe.scheduler_kwargs)


def _model_config(options: dict[str, Any]) -> GPTConfig | HFCausalLMConfig:
    name = options.pop("name", "gpt")
    if name not in MODELS:
        raise RecipeError(f"recipe key 'model.name' = {name!r} is invalid{did_you_mean(str(name), MODELS)}; "
                          f"allowed: {', '.join(MODELS)}")
    _check_arguments("model", MODELS[name], options)
    try:
        return MODELS[name](**options)
    except (ValueError, ImportError) as err:
        raise RecipeError(f"recipe section 'model' is invalid: {err}") from None


def _validate(cfg: DictConfig) -> ValidatedRecipe:
    """Check a complete schema-merged recipe's values; returns it with the model and the components' arguments.

    Raises:
        RecipeError: the first problem found, naming its key.
    """
    from composer.utils import dist

    _check(cfg.device in DEVICES, "device", cfg.device, f"allowed: {', '.join(DEVICES)}")
    _check(cfg.precision in PRECISIONS, "precision", cfg.precision, f"allowed: {', '.join(PRECISIONS)}")
    try:
        shared_gpu = check_shared_gpu(cfg.shared_gpu)
    except ValueError as err:
        raise RecipeError(f"recipe key 'shared_gpu': {err}") from None
    _check(cfg.device == "gpu" or shared_gpu is not True, "shared_gpu", cfg.shared_gpu,
           "it shares GPUs between ranks, so it needs device: gpu")
    _check(cfg.device != "cpu" or cfg.precision == "fp32", "precision", cfg.precision,
           "Composer trains on CPU in fp32 only")
    _check(0 <= cfg.seed < 2**SEED_BITS, "seed", cfg.seed, f"it must be an integer in [0, 2**{SEED_BITS})")

    model_config = _model_config(OmegaConf.to_container(cfg.model, resolve=True))

    _check_time("max_duration", cfg.max_duration, positive=True, units=MAX_DURATION_UNITS)
    for key in ("eval_interval", "save_interval", "console_log_interval"):
        _check_time(key, OmegaConf.select(cfg, key), positive=True)

    # NaN fails every comparison, so it is refused too; inf would wait forever, which this key exists to prevent.
    _check(math.isfinite(cfg.dist_timeout) and cfg.dist_timeout > 0, "dist_timeout", cfg.dist_timeout,
           "it must be a finite number of seconds > 0 (e.g. 600 for steps that take minutes)")

    world = dist.get_world_size()
    batch = cfg.global_train_batch_size
    _check(batch >= 1 and batch % world == 0, "global_train_batch_size", batch,
           f"it must be a positive multiple of the world size ({world} processes)")
    micro = cfg.device_train_microbatch_size
    _check(micro is None or (micro >= 1 and (batch // world) % micro == 0), "device_train_microbatch_size", micro,
           f"it must divide the per-device batch of {batch // world} samples")
    _check(cfg.device_eval_batch_size >= 1, "device_eval_batch_size", cfg.device_eval_batch_size, "it must be >= 1")
    _check(cfg.eval_subset_num_batches == -1 or cfg.eval_subset_num_batches >= 1, "eval_subset_num_batches",
           cfg.eval_subset_num_batches, "it must be -1 (all) or >= 1")
    _check(cfg.data.num_workers >= 0, "data.num_workers", cfg.data.num_workers, "it must be >= 0")

    optimizer_kwargs, optimizer = _class_section(cfg, "optimizer")
    scheduler_kwargs, _ = _class_section(cfg, "scheduler")
    _check(cfg.grad_clip_norm is None or cfg.grad_clip_norm > 0, "grad_clip_norm", cfg.grad_clip_norm,
           "it must be > 0, or null to disable clipping")

    if cfg.fsdp is not None:
        _check(cfg.fsdp.mixed_precision in FSDP_MIXED_PRECISION, "fsdp.mixed_precision", cfg.fsdp.mixed_precision,
               f"allowed: {', '.join(FSDP_MIXED_PRECISION)}")
        _check(cfg.fsdp.state_dict_type in FSDP_STATE_DICT_TYPES, "fsdp.state_dict_type", cfg.fsdp.state_dict_type,
               f"allowed: {', '.join(FSDP_STATE_DICT_TYPES)}")
        try:  # certain only with shared_gpu=true; auto is decided by the GPUs a run finds (recipes.train)
            check_state_dict_type(cfg.device == "gpu" and shared_gpu is True, cfg.fsdp.state_dict_type)
        except ValueError as err:
            raise RecipeError(str(err)) from None
        # Whether the group size divides the shard mesh is fully_shard's own check, at wrapping time.
        reshard = cfg.fsdp.reshard_after_forward
        _check(isinstance(reshard, bool) or (isinstance(reshard, int) and reshard >= 2), "fsdp.reshard_after_forward",
               reshard, "allowed: true, false, or an integer >= 2 (ranks of the secondary shard group, e.g. the GPUs "
               "per node)")
    _check(not cfg.autoresume or (cfg.save_folder is not None and cfg.run_name is not None), "autoresume",
           cfg.autoresume, "autoresume needs save_folder and run_name")

    components = {}
    for section in ("loggers", "callbacks"):
        enabled = {name: _component_kwargs(section, name, value) for name, value in cfg[section].items()}
        components[section] = {name: kwargs for name, kwargs in enabled.items() if kwargs is not None}

    algorithm_kwargs = {}
    for name, value in cfg.algorithms.items():
        if f"algorithms.{name}" in LLM_FOUNDRY_HINTS:
            raise RecipeError(_unknown_key_message(f"algorithms.{name}"))
        _check(name in ALGORITHMS, f"algorithms.{name}", name,
               f"known algorithms: {', '.join(ALGORITHMS)}{did_you_mean(name, ALGORITHMS)}")
        kwargs = _entry_kwargs(f"algorithms.{name}", value)
        if kwargs is None:
            continue
        _check(name not in _NEEDS_FSDP or cfg.fsdp is not None, f"algorithms.{name}", name,
               "it quantizes FSDP's collectives, so the recipe needs an 'fsdp' section (not null)")
        _check(name not in _NEEDS_DDP or cfg.fsdp is None, f"algorithms.{name}", name,
               "it replaces DDP's gradient all-reduce, which FSDP does not do: set 'fsdp: null' in the recipe (fsdp=null "
               "on the command line)")
        algorithm_kwargs[name] = kwargs
        algorithm = build_algorithm(name, kwargs)  # argument errors surface now, before anything is built
        check_optimizer = getattr(algorithm, "check_optimizer", None)
        if callable(check_optimizer):  # an algorithm that replaces or inspects the run's optimizer
            try:
                check_optimizer(optimizer)
            except ValueError as err:
                raise RecipeError(f"recipe key 'optimizer.name' = {cfg.optimizer.name!r} does not work with "
                                  f"algorithms.{name}: {err}") from None
    return ValidatedRecipe(cfg=cfg, model_config=model_config, algorithm_kwargs=algorithm_kwargs,
                           logger_kwargs=components["loggers"], callback_kwargs=components["callbacks"],
                           optimizer_kwargs=optimizer_kwargs, scheduler_kwargs=scheduler_kwargs)


# ------------------------------------------------------------------------------------------------- --help
def _type_name(hint: Any) -> str:
    """A YAML reader's name for a schema type: ``str``, ``float or null``, ``list[float]``, ``mapping``,
    ``section``."""
    args = typing.get_args(hint)
    if type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return f"{' or '.join(_type_name(a) for a in rest)} or null"
    if dataclasses.is_dataclass(hint):
        return "section"
    origin = typing.get_origin(hint)
    if origin is dict:
        return "mapping"
    if origin is list:
        return f"list[{_type_name(args[0])}]"
    return getattr(hint, "__name__", str(hint))


def _documented(obj: Any, section: str) -> dict[str, str]:
    """name -> text of the Google-style ``section`` (``"Args"``, ``"Attributes"``) of ``obj``'s docstring."""
    docs: dict[str, str] = {}
    lines = iter((inspect.getdoc(obj) or "").splitlines())
    for line in lines:
        if line == f"{section}:":
            break
    name = None
    for line in lines:
        if not line.startswith("    "):  # a blank line or the next section ends this one
            break
        entry = re.fullmatch(r"    (\w+)(?: \(.*?\))?: (.*)", line)
        if entry:
            name, docs[entry[1]] = entry[1], entry[2]
        elif name is not None:
            docs[name] += " " + line.strip()
    return docs


def _key_lines(key: str, type_name: str, default: str, doc: str) -> list[str]:
    head = f"  {key}: {type_name}" + (" (required)" if default == "required" else f" = {default}")
    return [head, *_wrapped(doc, "      ")]


def _wrapped(text: str, indent: str = "") -> list[str]:
    return textwrap.wrap(text, width=116, initial_indent=indent, subsequent_indent=indent)


def _schema_lines(cls: type, prefix: str = "") -> list[str]:
    lines = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        section = next((a for a in (hints[f.name], *typing.get_args(hints[f.name])) if dataclasses.is_dataclass(a)),
                       None)
        if f.default_factory is not dataclasses.MISSING:
            default = "the section below" if section else json.dumps(f.default_factory())
        else:
            default = "required" if f.default is MISSING else json.dumps(f.default)
        doc = f.metadata.get("doc") or (inspect.getdoc(section) if section else "")
        lines += _key_lines(prefix + f.name, _type_name(hints[f.name]), default, doc)
        if section is not None:
            lines += _schema_lines(section, f"{prefix}{f.name}.")
    return lines


def _gpt_lines() -> list[str]:
    hints, docs = typing.get_type_hints(GPTConfig), _documented(GPTConfig, "Attributes")
    lines = _key_lines("model.preset", "str or null", "null", f"start from a preset ({', '.join(GPT_PRESETS)}); "
                                                             "without one, the fields without a default are required")
    for f in dataclasses.fields(GPTConfig):
        default = "required" if f.default is dataclasses.MISSING else json.dumps(f.default)
        lines += _key_lines(f"model.{f.name}", _type_name(hints[f.name]), default, docs.get(f.name, ""))
    return lines


def _hf_lines() -> list[str]:
    docs = _documented(hf_causal_lm_config, "Args")
    lines = []
    for p in inspect.signature(hf_causal_lm_config).parameters.values():
        # Annotations are strings here (postponed evaluation): spell them as the schema's types are.
        type_name = str(p.annotation).replace("Mapping[str, Any]", "mapping").replace(" | None", " or null")
        lines += _key_lines(f"model.{p.name}", type_name, json.dumps(p.default), docs.get(p.name, ""))
    return lines


def _optim_lines() -> list[str]:
    """The ``--help`` text of the ``optimizer`` and ``scheduler`` sections (without importing torch or Composer)."""
    lines = []
    for section, table, kind, modules, examples in (
            ("optimizer", OPTIMIZERS, "optimizer", "composer.optim and torch.optim", "sgd, decoupled_sgdw, rmsprop"),
            ("scheduler", SCHEDULERS, "schedule", "composer.optim", "constant, step, multi_step, linear, "
                                                                     "cosine_annealing, exponential, polynomial")):
        lines += _wrapped(f"{section}: {{name: NAME, the other keys: keyword arguments of its class}}; a recipe "
                          "that names another class than its base keeps only the base's keys that this class takes")
        lines += _key_lines(f"{section}.name", "str", json.dumps(DEFAULT_CLASS_NAMES[section]),
                            f"the {kind}; with its recipe defaults:")
        lines += [f"      {name}: {b.target.replace(':', '.')}"
                  + (f" ({', '.join(f'{k}={json.dumps(v)}' for k, v in b.defaults.items())})" if b.defaults else "")
                  for name, b in table.items()]
        lines += _wrapped(f"and every other public {kind} class of {modules} by its name or snake-case name "
                          f"({examples}; with the class's defaults), llm-foundry's registered names where it is "
                          "installed, or a 'module:Class' path", "      ")
        if section == "optimizer":
            lines += _key_lines("optimizer.lr", "float", "required", "peak learning rate (the schedule scales it)")
        lines += [f"  {section}.*", *_wrapped("the class's other keyword arguments, checked against its signature; "
                                               "durations are Composer time strings (100ba, 0.1dur)", "      ")]
        lines.append("")
    return lines


def recipe_help() -> str:
    """The text of ``composer_qsdp.recipes.train --help``: usage, then every recipe key with its type and default."""
    lines = [
        f"usage: {USAGE}",
        "       python -m composer_qsdp.recipes.train RECIPE.yaml [key=value ...]   (one process)",
        "",
        *_wrapped("Trains the recipe, a YAML file ('base: other.yaml' extends another recipe). Each key=value "
                  "overrides a key, dotted for nested ones (model.max_seq_len=2048, fsdp=null). Everything is "
                  "checked before anything is built; an error names the key. The recipe keys, with their type "
                  "and default:"),
        "",
        *_schema_lines(TrainRecipe),
        "",
        "model, name: gpt (the default): composer_qsdp's GPT",
        *_key_lines("model.name", "str", '"gpt"', f"the model: one of {', '.join(MODELS)}"),
        *_gpt_lines(),
        "",
        *_wrapped("model, name: hf_causal_lm: a Hugging Face causal LM (the hf extra) with llm-foundry's keys; "
                  "nothing is downloaded"),
        *_hf_lines(),
        "",
        *_optim_lines(),
    ]
    for section, builders in (("loggers", LOGGERS), ("callbacks", CALLBACKS)):
        lines += _wrapped(f"{section}: {{name: {{keyword arguments of its Composer class}}}}; {{}} for the defaults; "
                          f"null or false switches off one that a base recipe enabled; {section}={{}} none at all")
        lines += [f"  {name}: {b.target.replace(':', '.')}" + (f" (needs mosaicml[{b.package}])" if b.package else "")
                  for name, b in builders.items()]
        lines += _wrapped(f"  and every other public class of {_COMPOSER_SECTIONS[section].modules[0]} by its name or "
                          "snake-case name (e.g. early_stopper, checkpoint_saver), llm-foundry's registered names "
                          "where it is installed, or a 'module:Class' path", "  ")
        lines.append("")
    lines += _wrapped("algorithms: {name: {keyword arguments of its class}}; {} for the defaults; null or false "
                      "switches off one that a base recipe enabled; algorithms={} none at all")
    lines += [f"  {name}: {target.replace(':', '.')}" for name, target in ALGORITHMS.items()]
    lines += ["", *_wrapped(
        "llm-foundry's spellings accepted: " + ", ".join(f"{a} (= {b})" for a, b in LLM_FOUNDRY_ALIASES.items())
        + ", the optimizer and scheduler sections (llm-foundry's names), model.name: hf_causal_lm with "
        "its keys, and the logger and callback names above. Refused, with what to write here instead:")]
    lines += [f"  {theirs} -> {ours}" for theirs, ours in LLM_FOUNDRY_HINTS.items()]
    return "\n".join(lines)
