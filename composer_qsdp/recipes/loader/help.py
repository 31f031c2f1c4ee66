"""The text of ``composer_qsdp.recipes.train --help``: every recipe key with its type, default and meaning, built
from the schema and the tables without importing torch or Composer."""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import textwrap
import typing
from typing import Any

from omegaconf import MISSING

from composer_qsdp.recipes.loader.components import (
    ALGORITHMS,
    CALLBACKS,
    CLASS_SOURCES,
    LOGGERS,
    MODELS,
    OPTIMIZERS,
    REGISTRIES,
    SCHEDULERS,
    SECTION_BASES,
)
from composer_qsdp.recipes.loader.schema import (
    DEFAULT_CLASS_NAMES,
    LLM_FOUNDRY_ALIASES,
    LLM_FOUNDRY_HINTS,
    USAGE,
    TrainRecipe,
)
from composer_qsdp.recipes.models.config import GPT_PRESETS, GPTConfig
from composer_qsdp.recipes.models.hf import hf_causal_lm_config

__all__ = ["recipe_help"]


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
                          f"installed, or a 'module:Class' path (see 'Components and imports'); it must be a "
                          f"{SECTION_BASES[section].replace(':', '.')} subclass", "      ")
        if section == "optimizer":
            lines += _key_lines("optimizer.lr", "float", "required", "peak learning rate (the schedule scales it)")
        lines += [f"  {section}.*", *_wrapped("the class's other keyword arguments, checked against its signature "
                                               "(unknown and missing ones are refused); durations are Composer time "
                                               "strings (100ba, 0.1dur)", "      ")]
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
        *_key_lines("model.init_device", "str", '"cpu"', "cpu: every process builds and initialises the whole model "
                    "on its CPU (at 6.7B 27 GB of host memory per process, fp32); meta: the model is "
                    "built on the meta device and Composer's FSDP2 allocates and initialises each process's shard "
                    "on its GPU (needs device: gpu and an fsdp section; gpt only). The same distribution, but other "
                    "values than cpu with the same seed (each shard is drawn on its GPU)"),
        *_gpt_lines(),
        "",
        *_wrapped("model, name: hf_causal_lm: a Hugging Face causal LM (the hf extra) with llm-foundry's keys; "
                  "nothing is downloaded"),
        *_hf_lines(),
        "",
        *_optim_lines(),
    ]
    for section, builders, examples in (("loggers", LOGGERS, "in_memory, console"),
                                        ("callbacks", CALLBACKS, "early_stopper, checkpoint_saver")):
        lines += _wrapped(f"{section}: {{name: {{keyword arguments of its Composer class}}}}; {{}} for the defaults "
                          "(the arguments without one are required); null or false switches off one that a base "
                          f"recipe enabled; {section}={{}} none at all")
        lines += [f"  {name}: {b.target.replace(':', '.')}" + (f" (needs mosaicml[{b.package}])" if b.package else "")
                  for name, b in builders.items()]
        lines += _wrapped(f"and every other public class of {CLASS_SOURCES[section].modules[0]} by its name or "
                          f"snake-case name (e.g. {examples}), llm-foundry's registered names "
                          "where it is installed, or a 'module:Class' path (see 'Components and imports'); it must be a "
                          f"{SECTION_BASES[section].replace(':', '.')} subclass", "  ")
        lines.append("")
    lines += _wrapped("algorithms: {name: {keyword arguments of its class}}; {} for the defaults; null or false "
                      "switches off one that a base recipe enabled; algorithms={} none at all")
    lines += [f"  {name}: {target.replace(':', '.')}" for name, target in ALGORITHMS.items()]
    lines += _wrapped("algorithms.qsdp.preset names a QSDP preset (sdp4bit, zeropp, w8g4, ...); the other keys change "
                      "it: the section is QSDPConfig.from_preset(preset, **the other keys), policy and auto_options "
                      "among them. A recipe or override that names another preset than the section it inherits gets that "
                      "preset: the inherited per-side options (weight_*, grad_*, bucket_size) are dropped, the "
                      "inherited run options (exclude, seed, ranks_per_node, ...) and the options given with the new "
                      "preset kept: algorithms.qsdp={preset: sdp4bit} and algorithms.qsdp.preset=sdp4bit both "
                      "give exactly sdp4bit. ranks_per_node must divide the world size. eval_weights: exact (the "
                      "default: evaluation gathers the full-precision weights, as plain FSDP), quantized (as "
                      "training's forward), or both (a second evaluator, val_quantized, on the same eval split: "
                      "metrics/val_quantized/LanguageCrossEntropy beside metrics/val/...).", "  ")
    lines += ["", *_wrapped(
        "Components and imports: every optimizer, scheduler, logger, callback and algorithm a recipe names is "
        "resolved to a class and checked (a subclass of its section's base, given every argument without a "
        "default) before anything calls or builds it; a function or a class of another base is refused. "
        "A 'module:Class' path imports its module (which runs the module's code) only where a registry names it "
        f"({REGISTRIES}); any other module must be named exactly by allow_imports: a module "
        "(my_package.callbacks, not its package) or one class (my_package.callbacks:MyCallback), e.g. "
        "allow_imports: ['my_package.callbacks:MyCallback'] for callbacks: {'my_package.callbacks:MyCallback': {}}.")]
    lines += ["", *_wrapped(
        "llm-foundry's spellings accepted: " + ", ".join(f"{a} (= {b})" for a, b in LLM_FOUNDRY_ALIASES.items())
        + ", the optimizer and scheduler sections (llm-foundry's names), model.name: hf_causal_lm with "
        "its keys, and the logger and callback names above. Refused, with what to write here instead:")]
    lines += [f"  {theirs} -> {ours}" for theirs, ours in LLM_FOUNDRY_HINTS.items()]
    return "\n".join(lines)
