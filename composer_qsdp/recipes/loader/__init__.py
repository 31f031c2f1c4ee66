"""Training recipes for :mod:`composer_qsdp.recipes.train`: the YAML schema, loading, validation and the key listing.

A recipe is checked against :class:`TrainRecipe` (unknown keys, missing values, wrong types) and then
semantically (value ranges, model, durations, loggers, callbacks, algorithm arguments, batch size vs world size)
before anything is built; the independent problems found are reported together, in one :class:`RecipeError`
naming each problem's key and what is allowed (:class:`Problems` gathers them).

llm-foundry's spellings are accepted where the meaning is the same (``fsdp_config``, the ``optimizer`` and
``scheduler`` sections, ``model.name: hf_causal_lm`` with its keys, the ``loggers``/``callbacks`` names); the others
are refused with the key to write instead (:data:`LLM_FOUNDRY_HINTS`).

The modules, each importing only those before it: :mod:`.errors` (:class:`RecipeError`), :mod:`.schema` (the
keys), :mod:`.components` (names -> classes), :mod:`.arguments` (a class's keyword arguments, the builders),
:mod:`.sources` (YAML files, ``base:`` chains, overrides, merging), :mod:`.validate` (the semantic checks),
:mod:`.help` (``--help``).

Importing this package loads only omegaconf, so ``--help`` answers at once; checks that need Composer or
``transformers`` import them when they run.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from composer_qsdp.recipes.loader.arguments import (
    HostSyncOptimizerWarning,
    build_algorithm,
    build_components,
    build_optimizer,
    build_scheduler,
)
from composer_qsdp.recipes.loader.components import (
    ALGORITHMS,
    CALLBACKS,
    LOGGERS,
    MODELS,
    OPTIMIZERS,
    SCHEDULERS,
    Builder,
    component_class,
    composer_components,
    load_class,
    optim_class,
)
from composer_qsdp.recipes.loader.errors import Problems, RecipeError
from composer_qsdp.recipes.loader.help import recipe_help
from composer_qsdp.recipes.loader.schema import (
    CLASS_SECTIONS,
    COMPONENT_SECTIONS,
    LLM_FOUNDRY_ALIASES,
    LLM_FOUNDRY_HINTS,
    TrainRecipe,
    ValidatedRecipe,
)
from composer_qsdp.recipes.loader.sources import merged_recipe
from composer_qsdp.recipes.loader.validate import check_machine, validate

__all__ = [
    "HostSyncOptimizerWarning",
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
    "Problems",
    "SCHEDULERS",
    "TrainRecipe",
    "ValidatedRecipe",
    "build_algorithm",
    "build_components",
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


def load_recipe(path: str | os.PathLike, overrides: Sequence[str] = (), *,
                world_size: int | None = None, machine: bool = False) -> ValidatedRecipe:  # fmt: skip
    """Load a YAML recipe, apply ``key=value`` overrides, and validate all of it; builds nothing heavy.

    Args:
        path: the recipe.
        overrides: ``key=value`` strings; ``@FILE`` adds the ``key=value`` lines of FILE there.
        world_size: the processes the run will have, for a driver that checks launches it has not started yet;
            None: this process's world.
        machine: also check what the recipe needs of this machine (:func:`check_machine`), as the entrypoint does.

    Raises:
        RecipeError: the YAML, schema and value problems (and with ``machine``, the machine's); the message names
            each problem's key, numbered where there are several. A problem that leaves nothing to check (an
            unreadable file, a missing ``base:``) is reported alone.
    """
    problems = Problems()
    return validate(merged_recipe(path, overrides, problems), world_size, problems=problems, machine=machine)
