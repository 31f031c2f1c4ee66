"""The recipe's schema: :class:`TrainRecipe` (every key with its type, default and ``--help`` text), the values a
key allows, llm-foundry's spellings, and :class:`ValidatedRecipe`, what a checked recipe hands to the trainer.

Importing it loads only omegaconf, so ``--help`` answers at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING, DictConfig

from composer_qsdp.recipes.models.config import GPTConfig
from composer_qsdp.recipes.models.hf import HFCausalLMConfig
from composer_qsdp.validate import SEED_BITS

__all__ = ["CLASS_SECTIONS", "COMPONENT_SECTIONS", "DEFAULT_CLASS_NAMES", "DEVICES", "FSDP_MIXED_PRECISION",
           "FSDP_STATE_DICT_TYPES", "INIT_DEVICES", "LLM_FOUNDRY_ALIASES", "LLM_FOUNDRY_HINTS", "MAX_DURATION_UNITS",
           "PRECISIONS", "USAGE", "DataSettings", "FSDPSettings", "TrainRecipe", "ValidatedRecipe"]

USAGE = "composer -n N -m composer_qsdp.recipes.train RECIPE.yaml [key=value ...]"


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
#: ``model.init_device``: where the model is built and initialised (cpu: whole on every process; meta: each
#: process's shard on its GPU, by FSDP2).
INIT_DEVICES = ("cpu", "meta")

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
    source: Optional[str] = _key(None, "what the shards are built from: a source of python -m "
                                       "composer_qsdp.recipes.data.build with its options (c4, wikipedia, 'textdir "
                                       "--input DIR'); a missing-shards error prints the whole build command")


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
    shared_gpu_transport: str = _key("gloo", "how ranks sharing a GPU exchange data: gloo (through host memory) or "
                                             "samedev (staging buffers on the GPU they share; the same numbers)")
    precision: str = _key("fp32", f"one of {', '.join(PRECISIONS)} (fp32 only on cpu)")
    deterministic_mode: bool = _key(False, "deterministic kernels (Composer's deterministic_mode: PyTorch's "
                                           "deterministic algorithms, cuDNN deterministic, cuBLAS's fixed "
                                           "workspace), so that a run repeats bit for bit on the same machine and "
                                           "software: slower, and an op without a deterministic kernel raises")
    scheduler: dict[str, Any] = _key(doc="the learning-rate schedule: its name and keyword arguments, see "
                                         "'scheduler' below",
                                     factory=lambda: {"name": DEFAULT_CLASS_NAMES["scheduler"]})
    grad_clip_norm: Optional[float] = _key(1.0, "clip the global gradient L2 norm to this; null: no clipping")
    fsdp: Optional[FSDPSettings] = _key(doc="FSDP2 sharding (llm-foundry: fsdp_config); null: none (DDP or one "
                                            "process)", factory=FSDPSettings)
    loggers: dict[str, Any] = _key(doc="Composer loggers: see 'loggers' below", factory=dict)
    callbacks: dict[str, Any] = _key(doc="Composer callbacks: see 'callbacks' below", factory=dict)
    algorithms: dict[str, Any] = _key(doc="Composer algorithms: see 'algorithms' below", factory=dict)
    allow_imports: list[str] = _key(doc="exact modules (my_package.callbacks) or classes "
                                        "(my_package.callbacks:StepTimer) that the recipe may name by 'module:Class' "
                                        "paths besides the modules the registries name; importing a module runs its "
                                        "code, so nothing else is imported (a package's entry covers none of its "
                                        "submodules)", factory=list)
    eval_interval: str = _key("500ba", "evaluate every this long (> 0)")
    eval_subset_num_batches: int = _key(-1, "batches per evaluation; -1: the whole eval split")
    dist_timeout: float = _key(300.0, "seconds the process-group set-up and every collective wait for the other "
                                      "processes; a stalled (stopped, deadlocked) or dead process ends the run "
                                      "after this long, with an error naming it where it can")
    save_folder: Optional[str] = _key(None, "checkpoint directory; null: no checkpoints")
    save_interval: str = _key("1000ba", "checkpoint every this long (> 0)")
    save_num_checkpoints_to_keep: int = _key(-1, "checkpoints kept; -1: all; N >= 1: the newest N (0: no local "
                                                 "copy, only with a remote save_folder)")
    save_overwrite: bool = _key(False, "overwrite existing checkpoints, and take over a save folder that another "
                                       "run owns (its run.json)")
    save_on_sigterm: bool = _key(True, "on SIGTERM (a preemption), save a checkpoint at the end of the current "
                                       "batch in save_folder and stop with status 143; false: stop at once, "
                                       "unsaved")
    load_path: Optional[str] = _key(None, "checkpoint to resume from")
    autoresume: bool = _key(False, "resume from the newest checkpoint in save_folder (needs run_name)")
    trust_checkpoint: bool = _key(False, "load the checkpoint (load_path, autoresume) as Composer does even where it "
                                         "needs more than tensors and Composer's training state: unpickling it then "
                                         "runs what it names; only for checkpoints whose writers you trust "
                                         "(docs/trust.md)")
    progress_bar: Optional[bool] = _key(None, "show Composer's progress bar; null: only when standard output is a "
                                               "terminal (no ANSI redraws in log files, CI logs and notebooks)")
    log_to_console: Optional[bool] = _key(None, "print the logged metrics every console_log_interval; null: when no "
                                                "progress bar is shown")
    console_log_interval: str = _key("1ba", "print metrics every this long (> 0)")
    metrics_file: Optional[str] = _key(None, "process 0 writes the logged metrics, QSDP's byte counters and the "
                                             "peak GPU memory (with the memory_monitor callback) as JSON after "
                                             "every evaluation and at the end")


#: The label of the recipe's evaluator (metrics ``metrics/val/...``).
EVAL_LABEL = "val"
#: The label of the second evaluator that ``algorithms.qsdp.eval_weights: both`` adds, over the same eval split with
#: QSDP's quantized weights (metrics ``metrics/val_quantized/...``).
QUANTIZED_EVAL_LABEL = "val_quantized"
#: What ``algorithms.qsdp.eval_weights: both`` gives QSDP: the exact weights for ``val``, the quantized ones for
#: ``val_quantized``.
BOTH_EVAL_WEIGHTS = {EVAL_LABEL: "exact", QUANTIZED_EVAL_LABEL: "quantized"}


@dataclass(frozen=True)
class ValidatedRecipe:
    """A recipe that passed every check, with the objects the checks already had to build.

    Attributes:
        cfg: the merged recipe (typed by :class:`TrainRecipe`).
        model_config: the model: a GPT's shape or a Hugging Face causal LM.
        init_device: ``model.init_device``, one of :data:`INIT_DEVICES`.
        algorithm_kwargs: name -> keyword arguments of each enabled algorithm.
        logger_kwargs: name -> keyword arguments of each enabled logger.
        callback_kwargs: name -> keyword arguments of each enabled callback.
        optimizer_kwargs: the keyword arguments of the optimizer ``cfg.optimizer.name`` besides its parameters, in
            the types its signature names (tuples, floats).
        scheduler_kwargs: the keyword arguments of the schedule ``cfg.scheduler.name``, durations as Composer
            ``Time``.
        eval_labels: the labels of the evaluators over ``data.eval_split``: ``("val",)``, and ``"val_quantized"``
            where QSDP evaluates it with the quantized weights (``algorithms.qsdp.eval_weights: both``).
    """

    cfg: DictConfig
    model_config: GPTConfig | HFCausalLMConfig
    init_device: str
    algorithm_kwargs: dict[str, dict[str, Any]]
    logger_kwargs: dict[str, dict[str, Any]]
    callback_kwargs: dict[str, dict[str, Any]]
    optimizer_kwargs: dict[str, Any]
    scheduler_kwargs: dict[str, Any]
    eval_labels: tuple[str, ...] = (EVAL_LABEL,)

