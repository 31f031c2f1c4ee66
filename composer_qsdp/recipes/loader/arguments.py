"""The keyword arguments a recipe gives a class: checked against its signature, turned into the types it names,
and the builders of the run's optimizer, schedule and algorithms from them."""

from __future__ import annotations

import inspect
import math
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from composer_qsdp._names import did_you_mean
from composer_qsdp.recipes.loader.components import (
    OPTIMIZERS,
    SCHEDULERS,
    algorithm_class,
    component_class,
    optim_class,
)
from composer_qsdp.recipes.loader.errors import RecipeError, check, check_time
from composer_qsdp.recipes.loader.schema import CLASS_SECTIONS, DEFAULT_CLASS_NAMES, ValidatedRecipe

__all__ = ["HostSyncOptimizerWarning", "add_defaults", "build_algorithm", "build_components", "build_optimizer", "build_scheduler",
           "check_arguments", "check_entry", "class_section", "component_kwargs", "entry_kwargs", "resolved",
           "unresolved"]


def build_algorithm(name: str, kwargs: dict[str, Any]) -> Any:
    """The algorithm ``name`` of :data:`ALGORITHMS` built with ``kwargs``.

    Raises:
        RecipeError: the class refuses the arguments.
    """
    try:
        return algorithm_class(name)(**kwargs)
    except (TypeError, ValueError) as err:
        raise RecipeError(f"recipe section 'algorithms.{name}' is invalid: {err}") from None


def check_arguments(section: str, function: Callable[..., Any], kwargs: Mapping[str, Any],
                    reserved: Sequence[str] = (), *, owner: str = "", required: Sequence[str] = (),
                    why: str = "") -> None:
    """``kwargs`` must be keyword arguments ``function`` (a class or function) accepts, none of ``reserved`` (the
    ones the recipe fills in itself), and give every one it needs: those without a default and the ``required``
    ones it takes; one that takes ``**kwargs`` checks the others itself.

    Args:
        section: the recipe key of ``kwargs`` (``"callbacks.early_stopper"``).
        owner: what a missing key's message names as the function (default: its name).
        why: the reason for ``required``, which the message gives where one of them is missing.
    """
    signature = inspect.signature(function).parameters
    parameters = [name for name in signature if name not in reserved]
    for key in kwargs:
        if key in reserved:
            raise RecipeError(f"recipe key '{section}.{key}' cannot be set: the recipe passes it; '{section}' takes: "
                              f"{', '.join(parameters)}")
    if not any(p.kind is p.VAR_KEYWORD for p in signature.values()):
        for key in kwargs:
            if key not in parameters:
                raise RecipeError(f"recipe key '{section}.{key}' is unknown{did_you_mean(key, parameters)}; "
                                  f"'{section}' takes: {', '.join(parameters)}")
    needed = [p.name for p in signature.values() if p.name not in reserved and (
        p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) or p.name in required)]
    missing = [name for name in needed if name not in kwargs]
    if missing:
        because = f"; {why}" if why and any(name in required for name in missing) else ""
        raise RecipeError(f"recipe is missing required key(s): {', '.join(f'{section}.{k}' for k in missing)} (the "
                          f"keyword arguments of {owner or getattr(function, '__name__', section)} without a default"
                          f"{because})")


def entry_kwargs(key: str, value: Any) -> dict | None:
    """The keyword arguments an entry of a :data:`COMPONENT_SECTIONS` section gives (None: switched off)."""
    if value is None or value is False:
        return None
    if value is True:
        return {}
    check_entry(key, value)
    return resolved(key, value)


def resolved(key: str, value: DictConfig) -> dict:
    """``value`` (the recipe's ``key``) as a plain dict with its interpolations resolved."""
    try:
        return OmegaConf.to_container(value, resolve=True)
    except InterpolationResolutionError as err:
        raise unresolved(err, key) from None


def unresolved(err: InterpolationResolutionError, key: str) -> RecipeError:
    """The error of an interpolation in ``key`` (or below it) that cannot be resolved, naming the key that holds it."""
    where = err.full_key or key
    if key and not where.startswith(key):
        where = f"{key}.{where}"
    message = f"recipe key '{where}' cannot be resolved: {err.msg.splitlines()[0]}"
    if any(f"'{section}." in err.msg for section in CLASS_SECTIONS):
        message += (" (an optimizer or scheduler section naming another class than its base's keeps only the base's "
                    "keys that class takes; give the value itself)")
    return RecipeError(message)


def check_entry(key: str, value: Any) -> None:
    """An entry of a :data:`COMPONENT_SECTIONS` section is a mapping of keyword arguments, or off."""
    if value is not None and not isinstance(value, (bool, DictConfig)):
        raise RecipeError(f"recipe key '{key}' = {value!r} is invalid; give its keyword arguments as a mapping "
                          "({} for the defaults), or null (or false) to switch off one that a base recipe enabled")


def component_kwargs(section: str, name: str, value: Any, allow_imports: Sequence[str] = ()) -> dict | None:
    """The keyword arguments of the logger or callback ``name`` (None: switched off), checked against its class:
    those it does not take and those it needs are refused, before anything builds it."""
    key = f"{section}.{name}"
    kwargs = entry_kwargs(key, value)
    if kwargs is None:
        return None
    check_arguments(key, component_class(section, name, allow_imports), kwargs)
    return kwargs


def build_components(recipe: ValidatedRecipe, section: str) -> list[Any]:
    """The loggers (``section="loggers"``) or callbacks (``"callbacks"``) that ``recipe`` enables, built."""
    kwargs = recipe.logger_kwargs if section == "loggers" else recipe.callback_kwargs
    return [component_class(section, name, recipe.cfg.allow_imports)(**options) for name, options in kwargs.items()]



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
            return [check_time(f"{key}[{i}]", v, positive=False) for i, v in enumerate(value)]
        return check_time(key, value, positive=False)
    if isinstance(value, list) and ("tuple" in text.lower() or isinstance(parameter.default, tuple)):
        return tuple(value)
    if re.search(r"\bfloat\b", text) and (isinstance(value, int) and not isinstance(value, bool)
                                          or isinstance(value, str) and not re.search(r"\bstr\b", text)):
        try:
            return float(value)
        except ValueError:
            raise RecipeError(f"recipe key '{key}' = {value!r} is invalid; it must be a number") from None
    return value


def add_defaults(cfg: DictConfig, section: str) -> None:
    """Add to the ``optimizer`` or ``scheduler`` section (``section``) of ``cfg`` its name's recipe defaults
    (:data:`OPTIMIZERS`, :data:`SCHEDULERS`) for the keys it leaves out."""
    name = cfg[section].get("name", DEFAULT_CLASS_NAMES[section])
    check(isinstance(name, str), f"{section}.name", name, "it must be a name or a 'module:Class' path")
    # An unknown name is the error to report, not what interpolating its keys then finds.
    optim_class(section, name, cfg.allow_imports)
    table = OPTIMIZERS if section == "optimizer" else SCHEDULERS
    cfg[section]["name"] = name
    for key, value in (table[name].defaults if name in table else {}).items():
        if key not in cfg[section]:
            cfg[section][key] = value


def class_section(cfg: DictConfig, section: str) -> tuple[dict[str, Any], Any]:
    """Check the recipe's ``optimizer`` or ``scheduler`` section (``section``) against the class it names.

    Returns:
        The class's keyword arguments in its types (an optimizer's besides its parameters), and the optimizer built
        on a one-element parameter, or the schedule.

    Raises:
        RecipeError: an unknown name, an argument the class does not take or needs, a value it refuses.
    """
    import torch

    options = resolved(section, cfg[section])
    name = options.pop("name")
    cls = optim_class(section, name, cfg.allow_imports)
    optimizer = section == "optimizer"
    check_arguments(section, cls, options, ("params",) if optimizer else (), owner=f"{section}.name {name!r}",
                    required=("lr",) if optimizer else (), why="an optimizer's lr is always required")
    parameters = inspect.signature(cls).parameters
    kwargs = {k: _typed(f"{section}.{k}", parameters.get(k), v) for k, v in options.items()}
    for k, v in kwargs.items():
        rule, allowed = _SAME_MEANING.get(f"{section}.{k}", (None, ""))
        if rule is not None:
            try:
                ok = (_is_number(v) or isinstance(v, tuple)) and rule(v)
            except TypeError:  # a tuple of other things
                ok = False
            check(ok, f"{section}.{k}", list(v) if isinstance(v, tuple) else v, allowed)
    try:
        with warnings.catch_warnings():  # advice on the values (Composer's on weight decay) comes when training
            warnings.simplefilter("ignore")
            built = cls([torch.nn.Parameter(torch.zeros(1))], **kwargs) if optimizer else cls(**kwargs)
    except (TypeError, ValueError) as err:
        raise RecipeError(f"recipe section '{section}' ({name}) is invalid: {err}") from None
    return kwargs, built


class HostSyncOptimizerWarning(UserWarning):
    """A GPU recipe's optimizer waits for the GPU on the host inside every step, leaving the GPU idle."""


# Optimizers whose step reads a device value on the host once per parameter, and the recipe name that avoids it.
# composer.optim.DecoupledAdamW calls .item() on every parameter's step count: at GPT-1.3B (299 tensors) that idled
# an H200 for a quarter of a one-GPU step (benchmarks/RESULTS.md).
_HOST_SYNCING = {"composer.optim.decoupled_weight_decay.DecoupledAdamW":
                 "name: adamw with fused: true (the same update where weight_decay is 0)"}


def build_optimizer(recipe: ValidatedRecipe, params: Any) -> Any:
    """The optimizer of ``recipe``'s ``optimizer`` section over ``params`` (a model's parameters).

    Warns with :class:`HostSyncOptimizerWarning` where a GPU recipe's optimizer syncs the host once per parameter.
    """
    cls = optim_class("optimizer", recipe.cfg.optimizer.name, recipe.cfg.allow_imports)
    instead = _HOST_SYNCING.get(f"{cls.__module__}.{cls.__qualname__}")
    if instead is not None and recipe.cfg.device == "gpu":
        warnings.warn(f"optimizer.name={recipe.cfg.optimizer.name!r} ({cls.__name__}) reads every parameter's step "
                      f"count on the host, a GPU sync per parameter per step that leaves the GPU idle; use "
                      f"{instead}", HostSyncOptimizerWarning, stacklevel=2)
    return cls(params, **recipe.optimizer_kwargs)


def build_scheduler(recipe: ValidatedRecipe) -> Any:
    """The learning-rate schedule of ``recipe``'s ``scheduler`` section (a Composer schedule)."""
    return optim_class("scheduler", recipe.cfg.scheduler.name, recipe.cfg.allow_imports)(**recipe.scheduler_kwargs)

