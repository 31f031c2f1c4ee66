"""A recipe's sources, read and merged: the YAML file and its ``base:`` chain, the command line's ``key=value``
overrides, llm-foundry's same-meaning spellings, all merged onto the :class:`~.schema.TrainRecipe` schema."""

from __future__ import annotations

import inspect
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf._utils import get_yaml_loader
from omegaconf.errors import ConfigKeyError, InterpolationResolutionError, OmegaConfBaseException, ValidationError

from composer_qsdp._names import did_you_mean
from composer_qsdp.recipes.loader.arguments import add_defaults, check_entry, unresolved
from composer_qsdp.recipes.loader.components import (
    PRESET_DEFAULTS,
    check_allow_imports,
    optim_class,
    preset_options,
)
from composer_qsdp.recipes.loader.errors import Problems, RecipeError
from composer_qsdp.recipes.loader.schema import (
    CLASS_SECTIONS,
    COMPONENT_SECTIONS,
    DEFAULT_CLASS_NAMES,
    LLM_FOUNDRY_ALIASES,
    LLM_FOUNDRY_HINTS,
    TrainRecipe,
)

__all__ = ["merged_recipe", "unknown_key_message"]


def _accept_llm_foundry_spellings(cfg: DictConfig, source: str) -> DictConfig:
    """Rename the llm-foundry keys of one recipe source (a file, or the command line) to ours."""
    for theirs, ours in LLM_FOUNDRY_ALIASES.items():
        if theirs in cfg:
            if ours in cfg:
                raise RecipeError(f"{source} sets both '{theirs}' (llm-foundry's spelling) and '{ours}'; keep one")
            cfg[ours] = cfg.pop(theirs)
    return cfg


#: The largest recipe file read, in bytes: recipes are a few kilobytes, and a larger file is refused before it is
#: parsed (YAML parsing is pure Python: about a second per megabyte).
MAX_RECIPE_BYTES = 256 * 1024
#: The most YAML nodes (scalars, lists, mappings) one recipe file or command-line value may hold once its aliases are
#: expanded. An alias stands for a copy of its anchor's nodes, which omegaconf makes: nested aliases grow
#: exponentially (a dozen lines can stand for billions of nodes, which omegaconf would copy for minutes). Recipes
#: hold a few hundred.
MAX_RECIPE_NODES = 20_000


def _expanded_nodes(node: yaml.Node, sizes: dict[int, int | None]) -> int:
    """The nodes of ``node`` with every alias expanded, counting each shared node once per reference; ``sizes``
    memoizes them by node (an alias is the same node object as its anchor) and holds None while a node is counted,
    so that an alias inside its own anchor, an endless expansion, is found.

    Raises:
        ValueError: an alias refers to a node that contains it.
    """
    key = id(node)
    if key in sizes:
        size = sizes[key]
        if size is None:
            raise ValueError("an alias refers to the node that contains it (an endless expansion)")
        return size
    sizes[key] = None
    children: list[yaml.Node] = []
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    elif isinstance(node, yaml.MappingNode):
        children = [child for pair in node.value for child in pair]
    # Past the limit the exact count does not matter: stop adding, so that the numbers stay small.
    size = 1
    for child in children:
        size = min(size + _expanded_nodes(child, sizes), MAX_RECIPE_NODES + 1)
    sizes[key] = size
    return size


def _bounded_yaml(text: str, source: str) -> Any:
    """``text`` parsed as omegaconf parses YAML, refused before anything is built when it holds more than
    :data:`MAX_RECIPE_NODES` nodes with its aliases expanded; ``source`` names it in errors.

    Raises:
        RecipeError: invalid YAML, an alias inside its own anchor, or too many nodes, naming ``source``.
    """
    loader = get_yaml_loader()(text)  # omegaconf's own loader: the same tags and resolution as OmegaConf.load
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        size = _expanded_nodes(node, {})
        if size > MAX_RECIPE_NODES:
            raise RecipeError(f"{source} holds more than {MAX_RECIPE_NODES} YAML nodes once its aliases (*name) are "
                              "expanded; a recipe holds a few hundred: write the values out, or use fewer nested "
                              "aliases")
        return loader.construct_document(node)
    except RecipeError:
        raise
    except (yaml.YAMLError, ValueError, RecursionError) as err:  # report the source, not a parser stack
        raise RecipeError(f"{source} is not valid YAML: {err}") from None
    finally:
        loader.dispose()


def _read_recipe(path: Path) -> DictConfig:
    """The recipe file ``path`` as omegaconf loads it, within :data:`MAX_RECIPE_BYTES` and
    :data:`MAX_RECIPE_NODES`.

    Raises:
        RecipeError: too large, invalid YAML, too many nodes, or not a mapping, naming the file.
    """
    source = f"recipe {str(path)!r}"
    with open(path, "rb") as f:
        data = f.read(MAX_RECIPE_BYTES + 1)  # never more: the file may be huge, or grow
    if len(data) > MAX_RECIPE_BYTES:
        raise RecipeError(f"{source} is larger than {MAX_RECIPE_BYTES // 1024} KiB; a recipe is a few KiB of keys")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise RecipeError(f"{source} is not UTF-8 text: {err}") from None
    content = _bounded_yaml(text, source)
    if content is None:  # an empty file: no keys (OmegaConf.load's reading)
        content = {}
    if not isinstance(content, dict):
        raise RecipeError(f"{source} must be a mapping of keys, not a {type(content).__name__}")
    try:
        return OmegaConf.create(content)
    except Exception as err:  # omegaconf's errors (a non-string key...): report the file, not a stack
        raise RecipeError(f"{source} is not a valid recipe: {err}") from None


def _load_yaml(path: Path, chain: tuple[Path, ...] = ()) -> DictConfig:
    """Load ``path``, first merging the recipe named by its ``base:`` key (recursively); ``chain``: the recipes
    that extend it."""
    path = path.resolve()
    if path in chain:
        raise RecipeError(f"recipe base chain loops: {' -> '.join(map(str, chain + (path,)))}")
    if not path.is_file():
        raise RecipeError(f"recipe file {str(path)!r} does not exist")
    cfg = _read_recipe(path)
    cfg = _accept_llm_foundry_spellings(cfg, f"recipe {str(path)!r}")
    base = cfg.pop("base", None)
    if base is None:
        return _merge_sources(OmegaConf.create(), cfg)
    if not isinstance(base, str):
        raise RecipeError(f"'base' in {str(path)!r} must be a path string, got {base!r}")
    target = (path.parent / base).resolve()
    if not target.is_file():  # name the key, what it says and the recipe that says it
        raise RecipeError(f"recipe {str(path)!r}: its 'base: {base}' names {str(target)!r}, which does not exist (a "
                          "base path is relative to the recipe that names it); fix that line")
    return _merge_sources(_load_yaml(target, chain + (path,)), cfg)


def _merge_sources(base: DictConfig, override: DictConfig) -> DictConfig:
    """``override`` (a recipe, or the command line) merged onto ``base``; a section of :data:`COMPONENT_SECTIONS`
    that ``override`` sets to ``{}``, null or false replaces the base's with an empty one instead of merging; an
    algorithm entry that names another preset than the base's gets that preset (:func:`_switch_preset`)."""
    for section in CLASS_SECTIONS:
        # A section naming another class than the base's keeps only the base's keys that this class's signature
        # names too (an optimizer's lr and weight_decay, not Adam's betas for SGD; none for one taking **kwargs).
        value, base_value = override.get(section), base.get(section)
        if isinstance(value, DictConfig) and isinstance(base_value, DictConfig) and isinstance(value.get("name"), str):
            if value.name != base_value.get("name", DEFAULT_CLASS_NAMES[section]):
                cls = optim_class(section, value.name, _allow_imports(base, override))
                takes = inspect.signature(cls).parameters
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
                check_entry(f"{section}.{name}", entry)
                base_value = base.get(section)
                if section == "algorithms" and name in PRESET_DEFAULTS and isinstance(base_value, DictConfig):
                    _switch_preset(name, base_value.get(name), entry)
    return OmegaConf.merge(base, override)


def _allow_imports(base: DictConfig, override: DictConfig) -> tuple[str, ...]:
    """The ``allow_imports`` of ``override`` merged onto ``base``, as the recipe writes them (a list replaces),
    checked (:func:`~.components.check_allow_imports`)."""
    value = override.get("allow_imports", base.get("allow_imports"))
    return () if value is None else check_allow_imports(value)


def _switch_preset(name: str, base_entry: object, entry: object) -> None:
    """Where a source's entry of the algorithm ``name`` names another ``preset`` than the entry it inherits
    (``base_entry``; none named: :data:`PRESET_DEFAULTS`), drop the inherited options that a preset sets
    (:func:`preset_options`), so that the merged entry is that preset with the source's own options: the base's
    8-bit settings must not silently override an ``sdp4bit`` that the user switched to. The inherited run options
    (``exclude``, ``seed``, ...) stay."""
    if not (isinstance(base_entry, DictConfig) and isinstance(entry, DictConfig)):
        return
    preset = entry.get("preset")
    inherited = base_entry.get("preset", PRESET_DEFAULTS[name])
    if isinstance(preset, str) and preset != inherited:
        dropped = preset_options(name) | {"preset"}
        for key in [k for k in base_entry if k in dropped]:
            base_entry.pop(key)


def unknown_key_message(key: str) -> str:
    """The error text of the unknown recipe key ``key`` (dotted): llm-foundry's key to write instead, or the keys
    its section takes, with the closest."""
    parent, _, name = key.rpartition(".")
    hint = LLM_FOUNDRY_HINTS.get(key)
    if hint is not None:
        return f"unknown recipe key '{key}' (llm-foundry's spelling); here: {hint}"
    schema = OmegaConf.structured(TrainRecipe)
    section = OmegaConf.select(schema, parent) if parent else schema
    allowed = list(section) if isinstance(section, DictConfig) else []
    where = f"; '{parent}' takes: {', '.join(allowed)}" if parent else " (composer_qsdp.recipes.train --help lists every key)"
    return f"unknown recipe key '{key}'{did_you_mean(name, allowed)}{where}"


def _schema_error(err: OmegaConfBaseException) -> RecipeError:
    """omegaconf's error merging a recipe onto the :class:`TrainRecipe` schema, as a RecipeError naming the key."""
    if isinstance(err, ConfigKeyError):
        return RecipeError(unknown_key_message(err.full_key))
    if isinstance(err, ValidationError):
        return RecipeError(f"recipe key '{err.full_key}' has the wrong type: {err.msg.splitlines()[0]}")
    return RecipeError(f"recipe key '{getattr(err, 'full_key', '?')}': {err.msg.splitlines()[0]}")


def _merge_schema(raw: DictConfig, problems: Problems) -> tuple[DictConfig, list[str]]:
    """``raw`` merged onto the :class:`TrainRecipe` schema, and the keys that could not be merged.

    Where the whole does not merge, it is merged key by key (a section of the schema's own, ``data`` or ``fsdp``,
    key by key within it), so that every unknown key and wrong type is recorded in ``problems``; the keys that
    failed keep the schema's value (a required one stays missing).
    """
    try:
        return OmegaConf.merge(OmegaConf.structured(TrainRecipe), raw), []
    except OmegaConfBaseException:
        pass  # find each problem below
    schema = OmegaConf.structured(TrainRecipe)
    cfg, failed = schema, []
    for key in raw:
        try:
            node = raw[key]
        except OmegaConfBaseException:  # a missing (???) or unresolvable value: not a section
            node = None
        section = schema.get(key) if key in schema else None
        if isinstance(section, DictConfig) and isinstance(node, DictConfig):  # a section of the schema's own
            pieces = [(f"{key}.{sub}", OmegaConf.create({key: OmegaConf.masked_copy(node, [sub])})) for sub in node]
        else:
            pieces = [(str(key), OmegaConf.masked_copy(raw, [key]))]
        for name, piece in pieces:
            try:
                cfg = OmegaConf.merge(cfg, piece)
            except OmegaConfBaseException as err:
                problems.add(_schema_error(err))
                failed.append(name)
    return cfg, failed

def _with_override_files(overrides: Sequence[str]) -> list[str]:
    """``overrides`` with each ``@FILE`` replaced by the overrides that FILE holds, one ``key=value`` a line (blank
    lines and lines starting with ``#`` skipped), in place: a later override wins, as on the command line."""
    expanded = []
    for override in overrides:
        if not override.startswith("@"):
            expanded.append(override)
            continue
        path = override[1:]
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_RECIPE_BYTES + 1)
            text = data.decode("utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise RecipeError(f"command-line overrides file {override!r} cannot be read: "
                              f"{getattr(err, 'strerror', None) or err}") from None
        if len(data) > MAX_RECIPE_BYTES:
            raise RecipeError(f"command-line overrides file {override!r} is larger than {MAX_RECIPE_BYTES // 1024} "
                              "KiB")
        expanded += [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return expanded


def _cli_overrides(overrides: Sequence[str]) -> DictConfig:
    overrides = _with_override_files(overrides)
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise RecipeError(f"command-line override(s) {', '.join(map(repr, bad))} must have the form key=value")
    cfg = OmegaConf.create()
    for override in overrides:  # OmegaConf.from_dotlist's parsing, each value bounded as a recipe file is
        key, _, value = override.partition("=")
        try:
            OmegaConf.update(cfg, key, _bounded_yaml(value, f"command-line override {key!r}"))
        except OmegaConfBaseException as err:
            raise RecipeError(f"cannot parse command-line override {override!r}: {err}") from None
    return _accept_llm_foundry_spellings(cfg, "the command line")


def _missing_message(missing: Sequence[str], path: str | os.PathLike) -> str:
    """The error text of the required keys ``missing``; for the shards' location, how to give or build them."""
    message = f"recipe is missing required key(s): {', '.join(missing)}"
    if "data.remote" in missing:
        message += (" (data.remote: the URL of the recipe's token shards, e.g. data.remote=s3://BUCKET/DIR; or "
                    "data.remote=null data.local=DIR for shards on this machine, which the error then names with "
                    "the command that builds them. To try the recipe on this machine's CPU with the bundled "
                    f"sample instead: make try RECIPE={os.fspath(path)}, docs/recipes.md)")
    return message


def merged_recipe(path: str | os.PathLike, overrides: Sequence[str] = (),
                  problems: Problems | None = None) -> DictConfig:  # fmt: skip
    """The recipe at ``path`` (with its ``base:`` chain) and the ``key=value`` ``overrides`` merged onto the
    :class:`~.schema.TrainRecipe` schema, the optimizer's and schedule's recipe defaults added; every required key
    is set. An override ``@FILE`` adds the ``key=value`` lines of FILE there.

    Args:
        path: the recipe.
        overrides: ``key=value`` strings and ``@FILE`` names.
        problems: where to record the problems that leave the rest checkable (unknown keys, wrong types, missing
            keys: the recipe returned then lacks those), for :func:`~.validate.validate` to report with its own;
            None: raise them here, together.

    Raises:
        RecipeError: a YAML or schema problem (an unknown key, a wrong type, a missing key), naming the key; every
            such problem of the recipe in one error.
    """
    own = problems is None
    problems = Problems() if problems is None else problems
    raw = _merge_sources(_load_yaml(Path(path)), _cli_overrides(overrides))
    cfg, failed = _merge_schema(raw, problems)
    try:
        check_allow_imports(cfg.allow_imports)  # before any lookup consults it
    except RecipeError as err:
        problems.add(err)
        problems.raise_if_any()  # every lookup below depends on it
    for section in CLASS_SECTIONS:  # before any interpolation (``${scheduler.t_warmup}``) is resolved
        with problems.collect():
            add_defaults(cfg, section)
    # Merging never lets '???' replace a schema default, so look for it in the recipe as written too.
    with problems.collect():
        try:
            missing = sorted(OmegaConf.missing_keys(raw) | OmegaConf.missing_keys(cfg))
        except InterpolationResolutionError as err:
            raise unresolved(err, "") from None
        # A key that failed to merge is reported as that failure, not again as missing.
        missing = [key for key in missing if not any(key == f or key.startswith(f + ".") for f in failed)]
        if missing:
            for key in missing:  # where a schema default hid the recipe's '???': unset, so that no check reads it
                OmegaConf.update(cfg, key, "???", merge=False)
            raise RecipeError(_missing_message(missing, path))
    if own:
        problems.raise_if_any()
    return cfg
