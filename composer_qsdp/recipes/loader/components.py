"""Which class a recipe's name means: this package's tables of loggers, callbacks, algorithms, models, optimizers
and schedules, Composer's and torch's public classes by name, llm-foundry's registries, and "module:Class" paths of
the modules those registries name or that the recipe's ``allow_imports`` names exactly.

Importing it loads no heavy package; a lookup imports what it names.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Optional

from composer_qsdp._names import did_you_mean
from composer_qsdp.recipes.loader.errors import RecipeError, check
from composer_qsdp.recipes.models.config import GPTConfig, gpt_config
from composer_qsdp.recipes.models.hf import HFCausalLMConfig, hf_causal_lm_config

__all__ = ["ALGORITHMS", "CALLBACKS", "CLASS_SOURCES", "LOGGERS", "MODELS", "OPTIMIZERS", "REGISTRIES",
           "PRESET_DEFAULTS", "SCHEDULERS", "SECTION_BASES", "Builder", "ClassSource", "algorithm_class",
           "check_allow_imports", "component_class", "composer_components", "load_class", "optim_class",
           "preset_options", "registry_modules"]


#: Algorithms a recipe can enable under ``algorithms: {name: {kwargs}}``: name -> "module:Class".
ALGORITHMS: dict[str, str] = {
    "qsdp": "composer_qsdp.algorithms.qsdp:QSDPFromYaml",
    "zero_one_adam": "composer_qsdp.algorithms.zero_one_adam:ZeroOneAdamDDP",
}
#: Algorithms whose keyword arguments change a named preset (``preset: sdp4bit``): name -> the preset of a section
#: that names none.
PRESET_DEFAULTS: dict[str, str] = {"qsdp": "w8g8"}



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
    "gc_monitor": Builder("composer_qsdp.recipes.gc_monitor:GCMonitor"),
    "lr_monitor": Builder("composer.callbacks:LRMonitor"),
    "memory_monitor": Builder("composer.callbacks:MemoryMonitor"),
    "optimizer_monitor": Builder("composer.callbacks:OptimizerMonitor"),
    "rank_memory": Builder("composer_qsdp.recipes.rank_memory:RankMemory"),
    "runtime_estimator": Builder("composer.callbacks:RuntimeEstimator"),
    "speed_monitor": Builder("composer.callbacks:SpeedMonitor"),
    "step_profile": Builder("composer_qsdp.recipes.step_profile:StepProfile"),
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
    """The class of the algorithm ``name`` of :data:`ALGORITHMS`, checked to be a Composer ``Algorithm``.

    Raises:
        RecipeError: the class cannot be imported.
    """
    try:
        cls = load_class(ALGORITHMS[name])
    except ImportError as err:
        raise RecipeError(f"algorithm '{name}' ({ALGORITHMS[name]}) cannot be imported: {err}") from None
    return _require_base("algorithms", f"algorithms.{name}", name, cls)


def preset_options(name: str) -> frozenset[str]:
    """The keyword arguments of the algorithm ``name`` of :data:`PRESET_DEFAULTS` that its preset sets: QSDP's
    per-side options (``weight_*``, ``grad_*``, ``bucket_size``); the others (``exclude``, ``seed``,
    ``ranks_per_node``, ...) configure the run whatever the preset."""
    from composer_qsdp.config import QSDPConfig

    run = {f.name for f in dataclasses.fields(QSDPConfig)}
    return frozenset(option for option in QSDPConfig.option_names() if option not in run)


def _snake(class_name: str) -> str:
    """``SpeedMonitor`` -> ``speed_monitor``, ``MLFlowLogger`` -> ``mlflow_logger``, ``LRMonitor`` -> ``lr_monitor``."""
    return re.sub(r"(?<!^)(?=[A-Z][a-z])", "_", class_name).lower()


def _word_snake(class_name: str) -> str:
    """``DecoupledSGDW`` -> ``decoupled_sgdw``, ``NAdam`` -> ``nadam``, ``MultiStepScheduler`` ->
    ``multi_step_scheduler``: a word starts only at a capital after a lowercase letter, so that optimizers'
    acronyms stay whole."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z][a-z])|(?<=[a-z])(?=[A-Z]{2})", "_", class_name).lower()


#: The class every component of a section must derive from ("module:Class"); anything else a recipe names there (a
#: function, another class) is refused before it is called.
SECTION_BASES = {
    "loggers": "composer.loggers:LoggerDestination",
    "callbacks": "composer.core:Callback",
    "optimizer": "torch.optim:Optimizer",
    "scheduler": "composer.optim:ComposerScheduler",
    "algorithms": "composer.core:Algorithm",
}
# What a section's components are called in messages.
_KINDS = {"loggers": "a logger", "callbacks": "a callback", "optimizer": "an optimizer", "scheduler": "a schedule",
          "algorithms": "an algorithm"}
@dataclass(frozen=True)
class ClassSource:
    """Where a section's names resolve beyond this package's tables: the public classes of ``modules`` derived from
    the section's base (:data:`SECTION_BASES`), by their name and ``snake`` name, also without ``suffix``."""

    modules: tuple[str, ...]
    suffix: str
    snake: Callable[[str], str]


CLASS_SOURCES = {
    "loggers": ClassSource(("composer.loggers",), "_logger", _snake),
    "callbacks": ClassSource(("composer.callbacks",), "", _snake),
    "optimizer": ClassSource(("composer.optim", "torch.optim"), "", _word_snake),
    "scheduler": ClassSource(("composer.optim",), "_scheduler", _word_snake),
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
    base = load_class(SECTION_BASES[section])
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


def component_class(section: str, name: str, allow_imports: Sequence[str] = ()) -> type:
    """The class a recipe's ``loggers`` or ``callbacks`` entry ``name`` names, checked to derive from the section's
    base (:data:`SECTION_BASES`) before anything calls it.

    Looked up in order: this package's names (:data:`LOGGERS`, :data:`CALLBACKS`), a ``"module:Class"`` path (of a
    module that a registry or ``allow_imports`` names: :func:`_load_path`), every public Composer class of the
    section (:func:`composer_components`), llm-foundry's registry of the section (where llm-foundry is installed;
    packages register there through ``llmfoundry_loggers`` / ``llmfoundry_callbacks`` entry points).

    Raises:
        RecipeError: no such name (with a suggestion), an optional package is missing, a path outside the allowed
            modules or that cannot be imported, or what the name finds is not a class of the section's base.
    """
    key = f"{section}.{name}"
    return _require_base(section, key, name, _find_component(section, key, name, allow_imports))


def _find_component(section: str, key: str, name: str, allow_imports: Sequence[str]) -> Any:
    builders = LOGGERS if section == "loggers" else CALLBACKS
    builder = builders.get(name)
    if builder is not None:
        if builder.package is not None and importlib.util.find_spec(builder.package) is None:
            raise RecipeError(f"recipe key '{key}' needs the {builder.package} package: "
                              f"pip install 'mosaicml[{builder.package}]'")
        return load_class(builder.target)
    if ":" in name:
        return _load_path(key, name, allow_imports)
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


#: An ``allow_imports`` entry: a module (``my_package.callbacks``) or one class of it
#: (``my_package.callbacks:StepTimer``).
_ALLOW_ENTRY = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*(:[A-Za-z_]\w*)?")


def check_allow_imports(entries: Any) -> tuple[str, ...]:
    """The recipe's ``allow_imports`` ``entries``, checked: a list of exact module names or ``"module:Class"``
    names.

    Raises:
        RecipeError: not a list, or an entry that is empty, not a string, or not dotted identifiers (with an
            optional ``:Class``), naming the entry.
    """
    allowed = "it must be a module (my_package.callbacks) or one class of it (my_package.callbacks:StepTimer)"
    if isinstance(entries, (str, bytes)) or not isinstance(entries, Sequence):
        raise RecipeError(f"recipe key 'allow_imports' = {entries!r} is invalid; it must be a list of entries: "
                          f"each {allowed.removeprefix('it must be ')}")
    for i, entry in enumerate(entries):
        check(isinstance(entry, str) and _ALLOW_ENTRY.fullmatch(entry) is not None, f"allow_imports[{i}]", entry,
              allowed)
    return tuple(entries)


#: The registries whose modules a recipe's "module:Class" paths may import without opting in, in words.
REGISTRIES = ("composer.callbacks, composer.loggers, composer.optim, torch.optim, this package's components, "
              "llm-foundry's registered classes")


def registry_modules() -> frozenset[str]:
    """The modules the registries name: those of this package's tables and the sections' bases, those whose public
    classes :func:`composer_components` lists, and where llm-foundry is installed, those of the classes its
    registries hold. Importing one runs no code that a lookup by name would not run too."""
    targets = [*ALGORITHMS.values(), *SECTION_BASES.values(),
               *(b.target for table in (LOGGERS, CALLBACKS, OPTIMIZERS, SCHEDULERS) for b in table.values())]
    modules = {target.partition(":")[0] for target in targets}
    modules.update(module for source in CLASS_SOURCES.values() for module in source.modules)
    for section in _LLM_FOUNDRY_REGISTRIES:
        registry = _llm_foundry_registry(section)
        if registry is not None:
            modules.update(getattr(obj, "__module__", "") for obj in registry.get_all().values())
    return frozenset(modules)


def _load_path(key: str, path: str, allow_imports: Sequence[str]) -> Any:
    """What a recipe key names by a ``"module:Class"`` path. Its module is imported only if a registry names it
    (:func:`registry_modules`) or an ``allow_imports`` entry names exactly it or exactly this path: an entry for a
    package covers none of its submodules, whose import would run code the recipe chose.

    Raises:
        RecipeError: the path is not allowed (before anything is imported) or cannot be imported, naming the key.
    """
    module = path.partition(":")[0]
    if module not in allow_imports and path not in allow_imports and module not in registry_modules():
        raise RecipeError(
            f"recipe key '{key}' = {path!r} is invalid; a recipe imports only the modules that the registries name "
            f"({REGISTRIES}) and those that allow_imports names exactly (importing a module runs "
            f"its code; a package's entry covers none of its submodules): to name this class, opt in with the "
            f"recipe key allow_imports, e.g. allow_imports: ['{path}']"
            + (f"; allowed now: {', '.join(allow_imports)}" if allow_imports else ""))
    try:
        return load_class(path)
    except (ImportError, AttributeError, ValueError) as err:
        raise RecipeError(f"recipe key '{key}': cannot import {path!r} ('module:Class'): {err}") from None


def optim_class(section: str, name: str, allow_imports: Sequence[str] = ()) -> type:
    """The class that the recipe's ``optimizer`` or ``scheduler`` section names with ``name``, checked to derive
    from the section's base (:data:`SECTION_BASES`: a torch ``Optimizer``, a Composer ``ComposerScheduler``)
    before anything calls it.

    Looked up in order: this package's names (:data:`OPTIMIZERS`, :data:`SCHEDULERS`), a ``"module:Class"`` path
    (of a module that a registry or ``allow_imports`` names: :func:`_load_path`), llm-foundry's ``optimizers`` or
    ``schedulers`` registry where llm-foundry is installed (packages add to it through ``llmfoundry_optimizers`` /
    ``llmfoundry_schedulers`` entry points), every public optimizer class of composer.optim and torch.optim or
    schedule class of composer.optim (:func:`composer_components`).

    Raises:
        RecipeError: no such name (with a suggestion and the known names), a path outside the allowed modules or
            that cannot be imported, or what the name finds is not a class of the section's base.
    """
    key = f"{section}.name"
    return _require_base(section, key, name, _find_optim(section, key, name, allow_imports))


def _find_optim(section: str, key: str, name: str, allow_imports: Sequence[str]) -> Any:
    table = OPTIMIZERS if section == "optimizer" else SCHEDULERS
    if name in table:
        return load_class(table[name].target)
    if ":" in name:
        return _load_path(key, name, allow_imports)
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


def _require_base(section: str, key: str, name: str, found: Any) -> type:
    """``found``, what the recipe's ``key`` names with ``name``, if it is a class derived from the section's base
    (:data:`SECTION_BASES`), by inheritance: a class that only looks like one (a ``__call__`` for a schedule) is no
    component.

    Raises:
        RecipeError: a function or other object, or a class of another base, naming the key, the object and the base.
    """
    base = load_class(SECTION_BASES[section])
    required = SECTION_BASES[section].replace(":", ".")
    if not isinstance(found, type):
        what = getattr(found, "__qualname__", None) or getattr(found, "__name__", None) or repr(found)
        raise RecipeError(f"recipe key '{key}' = {name!r} is invalid; it names {what} ({type(found).__name__}), not a "
                          f"class: {_KINDS[section]} must be a {required} subclass")
    if base not in found.__mro__:
        hint = ""
        if section == "scheduler" and "torch.optim.lr_scheduler" in {c.__module__ for c in found.__mro__}:
            hint = ("; it is a torch LRScheduler, which is built on the optimizer; name a Composer schedule "
                    "(composer.optim: step, multi_step, exponential, ...)")
        raise RecipeError(f"recipe key '{key}' = {name!r} is invalid; it names {found.__name__}, not a {required} "
                          f"subclass{hint}")
    return found
