"""Which class a recipe's name means: this package's tables of loggers, callbacks, algorithms, models, optimizers
and schedules, Composer's and torch's public classes by name, llm-foundry's registries, and "module:Class" paths.

Importing it loads no heavy package; a lookup imports what it names.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Optional

from composer_qsdp._names import did_you_mean
from composer_qsdp.recipes.loader.errors import RecipeError
from composer_qsdp.recipes.models.config import GPTConfig, gpt_config
from composer_qsdp.recipes.models.hf import HFCausalLMConfig, hf_causal_lm_config

__all__ = ["ALGORITHMS", "CALLBACKS", "CLASS_SOURCES", "LOGGERS", "MODELS", "OPTIMIZERS", "SCHEDULERS", "Builder",
           "ClassSource", "algorithm_class", "component_class", "composer_components", "load_class", "optim_class"]


#: Algorithms a recipe can enable under ``algorithms: {name: {kwargs}}``: name -> "module:Class".
ALGORITHMS: dict[str, str] = {
    "qsdp": "composer_qsdp.algorithms.qsdp:QSDP",
    "zero_one_adam": "composer_qsdp.algorithms.zero_one_adam:ZeroOneAdamDDP",
}



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
}
#: Models a recipe can name with ``model.name``: name -> the function that checks the section's other keys.
MODELS: dict[str, Callable[..., GPTConfig | HFCausalLMConfig]] = {
    "gpt": gpt_config,
    "hf_causal_lm": hf_causal_lm_config,
}


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

def load_class(target: str) -> type:
    """The class named by ``"module:Class"``."""
    module_name, class_name = target.split(":")
    return getattr(importlib.import_module(module_name), class_name)


def algorithm_class(name: str) -> type:
    try:
        return load_class(ALGORITHMS[name])
    except ImportError as err:
        raise RecipeError(f"algorithm '{name}' ({ALGORITHMS[name]}) cannot be imported: {err}") from None


def _snake(class_name: str) -> str:
    """``SpeedMonitor`` -> ``speed_monitor``, ``MLFlowLogger`` -> ``mlflow_logger``, ``LRMonitor`` -> ``lr_monitor``."""
    return re.sub(r"(?<!^)(?=[A-Z][a-z])", "_", class_name).lower()


def _word_snake(class_name: str) -> str:
    """``DecoupledSGDW`` -> ``decoupled_sgdw``, ``NAdam`` -> ``nadam``, ``MultiStepScheduler`` ->
    ``multi_step_scheduler``: a word starts only at a capital after a lowercase letter, so that optimizers'
    acronyms stay whole."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z][a-z])|(?<=[a-z])(?=[A-Z]{2})", "_", class_name).lower()


@dataclass(frozen=True)
class ClassSource:
    """Where a section's names resolve beyond this package's tables: the public classes of ``modules`` derived from
    ``base`` ("module:Class"), by their name and ``snake`` name, also without ``suffix``."""

    modules: tuple[str, ...]
    base: str
    suffix: str
    snake: Callable[[str], str]


CLASS_SOURCES = {
    "loggers": ClassSource(("composer.loggers",), "composer.loggers:LoggerDestination", "_logger", _snake),
    "callbacks": ClassSource(("composer.callbacks",), "composer.core:Callback", "", _snake),
    "optimizer": ClassSource(("composer.optim", "torch.optim"), "torch.optim:Optimizer", "", _word_snake),
    "scheduler": ClassSource(("composer.optim",), "composer.optim:ComposerScheduler", "_scheduler", _word_snake),
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
    source = CLASS_SOURCES[section]
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
    suffix = CLASS_SOURCES[section].suffix
    known = sorted({*table, *(n for n in composer if n.islower() and not (suffix and n.endswith(suffix))),
                    *(registry.get_all() if registry is not None else ())})
    foundry = "" if registry is not None else "llm-foundry's registered names where it is installed, "
    kind = "schedule" if section == "scheduler" else section
    raise RecipeError(f"recipe key '{key}' = {name!r} is invalid: no {kind} of that name{did_you_mean(name, known)}; "
                      f"known: {', '.join(known)} (or the class names), {foundry}or a 'module:Class' path")

