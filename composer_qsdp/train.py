"""YAML training entrypoint for the GPT recipes (LLM-Foundry style).

Run it through Composer's launcher, one process per device::

    composer -n 8 -m composer_qsdp.train yamls/gpt-125m/qsdp-w8g8.yaml [key=value ...]

Each ``key=value`` (dotted for nested keys: ``model.max_seq_len=2048``, ``fsdp=null``) overrides the recipe,
omegaconf style. A recipe may start with ``base: other.yaml`` (a path relative to the recipe) to extend another
recipe; its own keys override the base's.

The whole recipe is checked against :class:`TrainRecipe` (unknown keys, missing values, wrong types) and then
semantically (value ranges, model shape, durations, algorithm arguments, batch size vs world size) before
anything is built; every problem raises :class:`RecipeError` naming the key.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
from composer import Algorithm, Evaluator, Trainer
from composer.algorithms import GradientClipping
from composer.callbacks import LRMonitor, SpeedMonitor
from composer.core import Callback, State, Time
from composer.loggers import InMemoryLogger, Logger
from composer.optim import CosineAnnealingWithWarmupScheduler, DecoupledAdamW
from composer.utils import FSDP2Config, dist, reproducibility
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from composer_qsdp.data import build_token_dataloader
from composer_qsdp.models import ComposerGPT, GPTConfig, gpt_config

__all__ = ["RecipeError", "TrainRecipe", "ValidatedRecipe", "load_recipe", "main", "train"]

#: Algorithms a recipe can enable under ``algorithms: {name: {kwargs}}``: name -> "module:Class".
ALGORITHMS: dict[str, str] = {
    "qsdp": "composer_qsdp.algorithms.qsdp:QSDP",
    "zero_one_adam": "composer_qsdp.algorithms.zero_one_adam:ZeroOneAdamDDP",
}
# Algorithms that act on FSDP's collectives and are meaningless without it.
_NEEDS_FSDP = frozenset({"qsdp"})

DEVICES = ("cpu", "gpu")
PRECISIONS = ("fp32", "amp_bf16", "amp_fp16")
FSDP_MIXED_PRECISION = ("DEFAULT", "PURE", "FULL")
FSDP_STATE_DICT_TYPES = ("sharded", "full")


class RecipeError(ValueError):
    """A recipe that cannot run: the message names the offending key and what is allowed."""


@dataclass
class DataSettings:
    """Where the MDS token shards are (written by ``python -m composer_qsdp.data.build``)."""

    local: str = MISSING  #: shard directory, or the local cache directory when ``remote`` is set
    remote: Optional[str] = None  #: URL or path of the shards (s3://, gs://, oci://, a directory)
    train_split: str = "train"
    eval_split: Optional[str] = "val"  #: None disables evaluation
    shuffle: bool = True
    num_workers: int = 0


@dataclass
class OptimizerSettings:
    """Decoupled AdamW (Composer's ``DecoupledAdamW``)."""

    lr: float = MISSING
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    weight_decay: float = 0.0


@dataclass
class SchedulerSettings:
    """Linear warm-up, then cosine decay to ``alpha_f * lr`` at the end of training."""

    t_warmup: str = "100ba"
    alpha_f: float = 0.1


@dataclass
class FSDPSettings:
    """Composer ``FSDP2Config`` fields (FSDP2 is always used when this section is present)."""

    #: true, false, or an integer k >= 2: keep a secondary weight shard over k consecutive ranks after the forward
    #: and re-gather it there in backward (ZeRO++'s hpZ with k = GPUs per node); OmegaConf 2.3 has no bool | int
    reshard_after_forward: Any = True
    mixed_precision: str = "DEFAULT"  #: DEFAULT: params in the run precision, fp32 reduce; PURE; FULL (fp32)
    state_dict_type: str = "sharded"
    activation_checkpointing: bool = False


@dataclass
class TrainRecipe:
    """Schema of a training recipe; the YAML's keys and types must match it.

    Durations are Composer time strings (``"4800ba"``, ``"1ep"``, ``"2500000000tok"``). ``model`` holds an
    optional ``preset`` (``125m``, ``350m``, ``1.3b``, ``tiny``) plus any :class:`~composer_qsdp.models.GPTConfig`
    field; ``algorithms`` maps a name of :data:`ALGORITHMS` to the keyword arguments of its class.
    """

    model: dict[str, Any] = MISSING
    data: DataSettings = field(default_factory=DataSettings)
    optimizer: OptimizerSettings = field(default_factory=OptimizerSettings)
    max_duration: str = MISSING
    global_train_batch_size: int = MISSING  #: samples per optimizer step, all ranks together
    device_train_microbatch_size: Optional[int] = None  #: samples per forward/backward; None: the device batch
    device_eval_batch_size: int = 8
    run_name: Optional[str] = None
    seed: int = 17
    device: str = "cpu"
    precision: str = "fp32"
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)
    grad_clip_norm: Optional[float] = 1.0  #: clip the global gradient L2 norm to this; None disables
    fsdp: Optional[FSDPSettings] = field(default_factory=FSDPSettings)  #: None: no sharding (DDP or 1 process)
    algorithms: dict[str, dict[str, Any]] = field(default_factory=dict)
    eval_interval: str = "500ba"
    eval_subset_num_batches: int = -1  #: batches per evaluation; -1: the whole eval split
    save_folder: Optional[str] = None  #: checkpoint directory; None saves nothing
    save_interval: str = "1000ba"
    save_num_checkpoints_to_keep: int = -1  #: -1 keeps all
    save_overwrite: bool = False
    load_path: Optional[str] = None  #: checkpoint to resume from
    autoresume: bool = False  #: resume from the newest checkpoint in save_folder (needs run_name)
    progress_bar: bool = True
    log_to_console: bool = False
    console_log_interval: str = "1ba"
    #: rank 0 writes the logged metrics, the communication summary and peak GPU memory (JSON), after every
    #: evaluation and at the end, so a run stopped early keeps its evaluations
    metrics_file: Optional[str] = None


@dataclass(frozen=True)
class ValidatedRecipe:
    """A recipe that passed every check, with the objects the checks already had to build.

    Attributes:
        cfg: the merged recipe (typed by :class:`TrainRecipe`).
        model_config: the GPT's shape.
        algorithm_kwargs: name -> keyword arguments of each enabled algorithm.
    """

    cfg: DictConfig
    model_config: GPTConfig
    algorithm_kwargs: dict[str, dict[str, Any]]


# ------------------------------------------------------------------------------------------------ loading
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
    base = cfg.pop("base", None)
    if base is None:
        return cfg
    if not isinstance(base, str):
        raise RecipeError(f"'base' in {str(path)!r} must be a path string, got {base!r}")
    return OmegaConf.merge(_load_yaml(path.parent / base, chain + (path,)), cfg)


def _merge_schema(*configs: DictConfig) -> DictConfig:
    """Merge ``configs`` onto the :class:`TrainRecipe` schema, turning omegaconf errors into RecipeErrors."""
    try:
        return OmegaConf.merge(OmegaConf.structured(TrainRecipe), *configs)
    except ConfigKeyError as err:
        raise RecipeError(f"unknown recipe key '{err.full_key}' ({err.msg.splitlines()[0]})") from None
    except ValidationError as err:
        raise RecipeError(f"recipe key '{err.full_key}' has the wrong type: {err.msg.splitlines()[0]}") from None
    except OmegaConfBaseException as err:
        raise RecipeError(f"recipe key '{getattr(err, 'full_key', '?')}': {err.msg.splitlines()[0]}") from None


def _cli_overrides(overrides: Sequence[str]) -> DictConfig:
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise RecipeError(f"command-line override(s) {', '.join(map(repr, bad))} must have the form key=value")
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except OmegaConfBaseException as err:
        raise RecipeError(f"cannot parse command-line overrides {list(overrides)}: {err}") from None


def load_recipe(path: str | os.PathLike, overrides: Sequence[str] = ()) -> ValidatedRecipe:
    """Load a YAML recipe, apply ``key=value`` overrides, and validate all of it; builds nothing heavy.

    Raises:
        RecipeError: a YAML, schema or value problem; the message names the key.
    """
    raw = OmegaConf.merge(_load_yaml(Path(path)), _cli_overrides(overrides))
    cfg = _merge_schema(raw)
    # Merging never lets '???' replace a schema default, so look for it in the recipe as written too.
    missing = sorted(OmegaConf.missing_keys(raw) | OmegaConf.missing_keys(cfg))
    if missing:
        raise RecipeError(f"recipe is missing required key(s): {', '.join(missing)}")
    return _validate(cfg)


# --------------------------------------------------------------------------------------------- validation
def _check(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise RecipeError(f"recipe key '{key}' = {value!r} is invalid; {allowed}")


def _check_time(key: str, value: str) -> None:
    try:
        Time.from_timestring(value)
    except (ValueError, TypeError):
        raise RecipeError(f"recipe key '{key}' = {value!r} is not a duration; use e.g. 4800ba, 1ep, "
                          "2500000000tok") from None


def _algorithm_class(name: str) -> type[Algorithm]:
    module_name, class_name = ALGORITHMS[name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise RecipeError(f"algorithm '{name}' ({ALGORITHMS[name]}) cannot be imported: {err}") from None
    return getattr(module, class_name)


def _build_algorithm(name: str, kwargs: dict[str, Any]) -> Algorithm:
    try:
        return _algorithm_class(name)(**kwargs)
    except (TypeError, ValueError) as err:
        raise RecipeError(f"recipe section 'algorithms.{name}' is invalid: {err}") from None


def _validate(cfg: DictConfig) -> ValidatedRecipe:
    """Check a complete schema-merged recipe's values; returns it with the model shape and algorithm arguments.

    Raises:
        RecipeError: the first problem found, naming its key.
    """
    _check(cfg.device in DEVICES, "device", cfg.device, f"allowed: {', '.join(DEVICES)}")
    _check(cfg.precision in PRECISIONS, "precision", cfg.precision, f"allowed: {', '.join(PRECISIONS)}")
    _check(cfg.device != "cpu" or cfg.precision == "fp32", "precision", cfg.precision,
           "Composer trains on CPU in fp32 only")

    model_options = OmegaConf.to_container(cfg.model)
    preset = model_options.pop("preset", None)
    try:
        model_config = gpt_config(preset, **model_options)
    except ValueError as err:
        raise RecipeError(f"recipe section 'model' is invalid: {err}") from None

    for key in ("max_duration", "eval_interval", "save_interval", "console_log_interval", "scheduler.t_warmup"):
        _check_time(key, OmegaConf.select(cfg, key))

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

    opt = cfg.optimizer
    _check(opt.lr > 0, "optimizer.lr", opt.lr, "it must be > 0")
    _check(len(opt.betas) == 2 and all(0 <= b < 1 for b in opt.betas), "optimizer.betas", list(opt.betas),
           "it must be two numbers in [0, 1)")
    _check(opt.eps > 0, "optimizer.eps", opt.eps, "it must be > 0")
    _check(opt.weight_decay >= 0, "optimizer.weight_decay", opt.weight_decay, "it must be >= 0")
    _check(0 <= cfg.scheduler.alpha_f <= 1, "scheduler.alpha_f", cfg.scheduler.alpha_f, "it must be in [0, 1]")
    _check(cfg.grad_clip_norm is None or cfg.grad_clip_norm > 0, "grad_clip_norm", cfg.grad_clip_norm,
           "it must be > 0, or null to disable clipping")

    if cfg.fsdp is not None:
        _check(cfg.fsdp.mixed_precision in FSDP_MIXED_PRECISION, "fsdp.mixed_precision", cfg.fsdp.mixed_precision,
               f"allowed: {', '.join(FSDP_MIXED_PRECISION)}")
        _check(cfg.fsdp.state_dict_type in FSDP_STATE_DICT_TYPES, "fsdp.state_dict_type", cfg.fsdp.state_dict_type,
               f"allowed: {', '.join(FSDP_STATE_DICT_TYPES)}")
        # Whether the group size divides the shard mesh is fully_shard's own check, at wrapping time.
        reshard = cfg.fsdp.reshard_after_forward
        _check(isinstance(reshard, bool) or (isinstance(reshard, int) and reshard >= 2), "fsdp.reshard_after_forward",
               reshard, "allowed: true, false, or an integer >= 2 (ranks of the secondary shard group, e.g. the GPUs "
               "per node)")
    _check(not cfg.autoresume or (cfg.save_folder is not None and cfg.run_name is not None), "autoresume",
           cfg.autoresume, "autoresume needs save_folder and run_name")

    algorithm_kwargs = {}
    for name, kwargs in cfg.algorithms.items():
        _check(name in ALGORITHMS, f"algorithms.{name}", name, f"known algorithms: {', '.join(ALGORITHMS)}")
        _check(name not in _NEEDS_FSDP or cfg.fsdp is not None, f"algorithms.{name}", name,
               "it quantizes FSDP's collectives, so the recipe needs an 'fsdp' section (not null)")
        algorithm_kwargs[name] = OmegaConf.to_container(kwargs) if kwargs is not None else {}
        _build_algorithm(name, algorithm_kwargs[name])  # argument errors surface now, before anything is built
    return ValidatedRecipe(cfg=cfg, model_config=model_config, algorithm_kwargs=algorithm_kwargs)


# ------------------------------------------------------------------------------------------------ training
def _dataloader(cfg: DictConfig, split: str, batch_size: int, max_seq_len: int, training: bool):
    # Training shuffles (unless data.shuffle is false) and keeps full batches only; evaluation reads every
    # sample in order.
    try:
        return build_token_dataloader(cfg.data.local, split, batch_size, max_seq_len, remote=cfg.data.remote,
                                      shuffle=training and cfg.data.shuffle, shuffle_seed=cfg.seed,
                                      num_workers=cfg.data.num_workers, drop_last=training)
    except ValueError as err:
        raise RecipeError(f"recipe section 'data': {err}") from None


def _traffic_reports(algorithms: Sequence[Algorithm]) -> dict[str, Any]:
    """Name -> cumulative traffic report of each algorithm that counts its FSDP communication (QSDP does)."""
    return {type(a).__name__: a.traffic() for a in algorithms if callable(getattr(a, "traffic", None))}


def _peak_memory(device: str) -> Optional[dict[str, int]]:
    """This rank's peak GPU memory since the process started (bytes), or None when not training on a GPU."""
    if device != "gpu" or not torch.cuda.is_available():
        return None
    return {"peak_allocated_bytes": torch.cuda.max_memory_allocated(),
            "peak_reserved_bytes": torch.cuda.max_memory_reserved()}


def _write_metrics(path: str, logger: InMemoryLogger, traffic: dict[str, Any],
                   memory: Optional[dict[str, int]]) -> None:
    """JSON: ``metrics`` (name -> ``[batch, value]`` pairs, batch as Composer's 0-based timestamp),
    ``communication`` (algorithm -> side -> byte counters of rank 0) and ``memory`` (rank 0's peak GPU memory in
    bytes: ``peak_allocated_bytes``, ``peak_reserved_bytes``; null on CPU)."""
    metrics = {name: [[int(ts.batch), float(value)] for ts, value in series]
               for name, series in logger.data.items() if series and _is_number(series[0][1])}
    communication = {name: {side: dataclasses.asdict(getattr(report, side)) for side in ("weights", "grads", "total")}
                     for name, report in traffic.items()}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    # Write-then-rename: a reader (or a kill) never sees a half-written file.
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps({"metrics": metrics, "communication": communication, "memory": memory}, indent=1))
    tmp.replace(path)


class _MetricsFileAfterEval(Callback):
    """Rewrites the metrics file after every evaluation, so a run killed mid-way keeps its evaluations."""

    def __init__(self, path: str, logger: InMemoryLogger, device: str) -> None:
        self.path, self.logger, self.device = path, logger, device

    def eval_end(self, state: State, logger: Logger) -> None:
        if dist.get_global_rank() == 0:
            _write_metrics(self.path, self.logger, _traffic_reports(state.algorithms), _peak_memory(self.device))


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError, RuntimeError):
        return False
    return True


def train(recipe: ValidatedRecipe) -> Trainer:
    """Build the data, model, optimizer, schedule, parallelism and algorithms of ``recipe``, then train.

    Returns:
        The finished (closed) ``Trainer``.

    Raises:
        RecipeError: the shards named in ``data`` are missing or do not fit the model.
    """
    cfg, model_config = recipe.cfg, recipe.model_config
    # The process group must exist before the streaming datasets are built: without one, each rank's
    # StreamingDataset creates temporary groups of its own, and concurrent ranks race on them at start-up.
    dist.initialize_dist(cfg.device)
    world = dist.get_world_size()
    seq_len = model_config.max_seq_len
    train_dl = _dataloader(cfg, cfg.data.train_split, cfg.global_train_batch_size // world, seq_len, training=True)
    eval_dl = None
    if cfg.data.eval_split is not None:
        eval_dl = Evaluator(label="val", metric_names=["LanguageCrossEntropy", "LanguagePerplexity"],
                            dataloader=_dataloader(cfg, cfg.data.eval_split, cfg.device_eval_batch_size, seq_len,
                                                   training=False),
                            subset_num_batches=cfg.eval_subset_num_batches)

    # Every rank must start from the same weights; FSDP then shards them.
    reproducibility.seed_all(cfg.seed)
    model = ComposerGPT(model_config)
    opt = cfg.optimizer
    optimizer = DecoupledAdamW(model.parameters(), lr=opt.lr, betas=tuple(opt.betas), eps=opt.eps,
                               weight_decay=opt.weight_decay)
    algorithms = [_build_algorithm(name, kwargs) for name, kwargs in recipe.algorithm_kwargs.items()]
    if cfg.grad_clip_norm is not None:
        algorithms.append(GradientClipping(clipping_type="norm", clipping_threshold=cfg.grad_clip_norm))
    parallelism = None
    if cfg.fsdp is not None:
        # An FSDP2Config (not a dict) selects FSDP2 in composer 0.32.1 without the FSDP_VERSION variable.
        parallelism = {"fsdp": FSDP2Config(**OmegaConf.to_container(cfg.fsdp))}
    memory_logger = InMemoryLogger()
    callbacks = [SpeedMonitor(window_size=10), LRMonitor()]
    if cfg.metrics_file is not None:
        callbacks.append(_MetricsFileAfterEval(cfg.metrics_file, memory_logger, cfg.device))

    trainer = Trainer(
        run_name=cfg.run_name,
        model=model,
        train_dataloader=train_dl,
        eval_dataloader=eval_dl,
        eval_interval=cfg.eval_interval,
        max_duration=cfg.max_duration,
        optimizers=optimizer,
        schedulers=CosineAnnealingWithWarmupScheduler(t_warmup=cfg.scheduler.t_warmup, alpha_f=cfg.scheduler.alpha_f),
        algorithms=algorithms,
        device=cfg.device,
        precision=cfg.precision,
        parallelism_config=parallelism,
        device_train_microbatch_size=cfg.device_train_microbatch_size,
        seed=cfg.seed,
        save_folder=cfg.save_folder,
        save_interval=cfg.save_interval,
        save_num_checkpoints_to_keep=cfg.save_num_checkpoints_to_keep,
        save_overwrite=cfg.save_overwrite,
        load_path=cfg.load_path,
        autoresume=cfg.autoresume,
        progress_bar=cfg.progress_bar,
        log_to_console=cfg.log_to_console,
        console_log_interval=cfg.console_log_interval,
        loggers=[memory_logger],
        callbacks=callbacks,
    )
    try:
        trainer.fit()
    finally:
        trainer.close()
    traffic = _traffic_reports(trainer.state.algorithms)
    if dist.get_global_rank() == 0:
        if cfg.metrics_file is not None:
            _write_metrics(cfg.metrics_file, memory_logger, traffic, _peak_memory(cfg.device))
        for name, report in traffic.items():
            print(f"\n{name} communication of rank 0 over {int(trainer.state.timestamp.batch)} batches:\n"
                  f"{report.summary()}")
    return trainer


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m composer_qsdp.train RECIPE.yaml [key=value ...]``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    try:
        train(load_recipe(argv[0], argv[1:]))
    except RecipeError as err:
        print(f"recipe error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
