"""What a recipe can make the trainer run, and settings that passed the recipe check but could not run (issue 35):
every component a recipe names is a class of its section's base, checked before anything calls it; a module that no
registry names is imported only where allow_imports names exactly it or the class (issue 51: a package's entry, or
the package being a known one, imports none of its other modules); a component's required arguments,
QSDP's ranks_per_node against the world size, and a QSDP preset switched over an inherited section are settled at
load, before any process group."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import composer_qsdp.recipes.loader.components
import composer_qsdp.recipes.train
from composer_qsdp.config import from_preset
from composer_qsdp.recipes.loader import build_algorithm, build_components, build_optimizer
from composer_qsdp.recipes.train import RecipeError, load_recipe, main
from test_train import BASELINE, QSDP_RECIPE


# --------------------------------------------------------------------- what a recipe's names may call
@pytest.mark.parametrize("section, entry, required", [
    ("callbacks", "callbacks={{'subprocess:Popen': {{args: [touch, {marker}]}}}}",
     "it names Popen, not a composer.core.Callback subclass"),
    ("loggers", "loggers={{'os:system': {{command: 'touch {marker}'}}}}",
     "it names system (builtin_function_or_method), not a class: a logger must be a "
     "composer.loggers.LoggerDestination subclass"),
    ("scheduler", "scheduler={{name: 'os:system', command: 'touch {marker}'}}",
     "not a class: a schedule must be a composer.optim.ComposerScheduler subclass"),
    ("optimizer", "optimizer={{name: 'subprocess:run', args: [touch, {marker}], lr: 1}}",
     "not a class: an optimizer must be a torch.optim.Optimizer subclass"),
])
def test_a_function_or_a_class_of_another_base_is_refused_before_it_is_called(tmp_path, section, entry, required):
    """Even with its module opted in, what a section names must derive from the section's base: the command it
    would run never runs."""
    marker = tmp_path / "ran"
    overrides = ["allow_imports=[os, subprocess]", entry.format(marker=marker)]
    with pytest.raises(RecipeError) as err:
        load_recipe(BASELINE, overrides)
    assert re.match(rf"recipe key '{section}\.[^']+' = '\w+:\w+' is invalid; ", str(err.value)), str(err.value)
    assert required in str(err.value)
    assert not marker.exists()


def test_an_algorithm_class_of_another_base_is_refused(monkeypatch):
    monkeypatch.setitem(composer_qsdp.recipes.loader.components.ALGORITHMS, "qsdp", "composer.callbacks:SpeedMonitor")
    with pytest.raises(RecipeError, match=re.escape("recipe key 'algorithms.qsdp' = 'qsdp' is invalid; it names "
                                                    "SpeedMonitor, not a composer.core.Algorithm subclass")):
        load_recipe(QSDP_RECIPE)


def test_the_entrypoint_refuses_a_popen_callback_with_the_recipe_status(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(composer_qsdp.recipes.train, "train", lambda *a: pytest.fail("training started"))
    marker = tmp_path / "ran"
    assert main([str(BASELINE), f"callbacks={{'subprocess:Popen': {{args: [touch, {marker}]}}}}"]) == 2
    assert "recipe key 'callbacks.subprocess:Popen'" in capsys.readouterr().err
    assert not marker.exists()


@pytest.fixture
def side_effect_module(tmp_path, monkeypatch):
    """A module on sys.path that writes a file when it is imported, and holds a callback, an optimizer and a
    schedule; yields (its name, the file)."""
    name = f"recipe_side_effect_{tmp_path.name}"
    marker = tmp_path / "imported"
    (tmp_path / f"{name}.py").write_text(f"""
from pathlib import Path

import torch
from composer.core import Callback
from composer.optim import ConstantScheduler

Path({str(marker)!r}).write_text("imported")


class Marker(Callback):
    pass


class Sgd(torch.optim.SGD):
    pass


class Constant(ConstantScheduler):
    pass
""")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, marker
    sys.modules.pop(name, None)


def test_a_module_no_registry_names_is_not_imported_without_opting_in(side_effect_module, tmp_path):
    name, marker = side_effect_module
    for overrides in ([f"callbacks={{'{name}:Marker': {{}}}}"], [f"optimizer={{name: '{name}:Sgd', lr: 0.1}}"],
                      [f"scheduler={{name: '{name}:Constant'}}"]):
        with pytest.raises(RecipeError, match=re.escape(f"'{name}:") + ".* is invalid; a recipe imports only the "
                                              "modules that the registries name .*"
                                              + re.escape(f"allow_imports: ['{name}:")):
            load_recipe(BASELINE, overrides)
    # A recipe file that switches its base's optimizer class: the class is looked up while the files merge.
    (tmp_path / "child.yaml").write_text(f"base: {BASELINE}\noptimizer: {{name: '{name}:Sgd', lr: 0.1}}\n")
    with pytest.raises(RecipeError, match="a recipe imports only the modules that the registries name"):
        load_recipe(tmp_path / "child.yaml")
    assert not marker.exists() and name not in sys.modules

    (tmp_path / "child.yaml").write_text(f"base: {BASELINE}\nallow_imports: [{name}]\n"
                                         f"optimizer: {{name: '{name}:Sgd', lr: 0.1}}\n"
                                         f"callbacks: {{'{name}:Marker': {{}}}}\n")
    recipe = load_recipe(tmp_path / "child.yaml")
    module = sys.modules[name]
    assert marker.exists()
    assert any(type(c) is module.Marker for c in build_components(recipe, "callbacks"))
    import torch

    assert type(build_optimizer(recipe, [torch.nn.Parameter(torch.zeros(2))])) is module.Sgd


@pytest.mark.parametrize("entries, bad", [
    ("[my pkg]", "'allow_imports[0]' = 'my pkg'"),
    ("['', my_pkg]", "'allow_imports[0]' = ''"),
    ("[my_pkg, 'my_pkg.']", "'allow_imports[1]' = 'my_pkg.'"),
    ("['my_pkg:A:B']", "'allow_imports[0]' = 'my_pkg:A:B'"),
    ("['my_pkg:']", "'allow_imports[0]' = 'my_pkg:'"),
])
def test_allow_imports_entries_must_name_exact_modules_or_classes(entries, bad):
    """An empty or malformed entry is a recipe error naming it, checked before any name is looked up (an optimizer
    path included, which the loader resolves while it merges the recipe)."""
    allowed = ("is invalid; it must be a module (my_package.callbacks) or one class of it "
               "(my_package.callbacks:StepTimer)")
    for overrides in ([f"allow_imports={entries}"], [f"allow_imports={entries}", "optimizer.name=my_pkg:Opt"]):
        with pytest.raises(RecipeError, match=re.escape(f"recipe key {bad} {allowed}")):
            load_recipe(BASELINE, overrides)


def test_an_empty_allow_imports_entry_in_a_recipe_file_is_a_recipe_error(tmp_path):
    """A null entry in a file (``- `` on its own line) is refused while the files merge, naming the entry."""
    (tmp_path / "child.yaml").write_text(f"base: {BASELINE}\nallow_imports:\n  -\n"
                                         "optimizer: {name: 'my_pkg:Opt', lr: 1}\n")
    with pytest.raises(RecipeError, match=re.escape("recipe key 'allow_imports[0]' = None is invalid; it must be a "
                                                    "module")):
        load_recipe(tmp_path / "child.yaml")


@pytest.fixture
def acting_package(tmp_path, monkeypatch):
    """A package on sys.path whose submodule ``acts`` writes a file when it is imported and holds a callback
    ``Marker``; its ``__init__`` does nothing. Yields (the package's name, the file)."""
    name = f"trust_pkg_{tmp_path.name}"
    marker = tmp_path / "imported"
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text("")
    (tmp_path / name / "acts.py").write_text(f"""
from pathlib import Path

from composer.core import Callback

Path({str(marker)!r}).write_text("imported")


class Marker(Callback):
    pass
""")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, marker
    for module in (name, f"{name}.acts"):
        sys.modules.pop(module, None)


@pytest.mark.parametrize("allow", ["", "allow_imports=[{pkg}]", "allow_imports=['{pkg}.acts:Other']",
                                   "allow_imports=['{pkg}:Marker']"])
def test_a_submodule_that_acts_on_import_is_not_imported_unless_named_exactly(acting_package, allow, monkeypatch,
                                                                              capsys):
    """Neither the package's entry, nor another class's, nor nothing lets a recipe import the package's submodule:
    its code never runs, and the entrypoint ends with the recipe-error status before training."""
    pkg, marker = acting_package
    monkeypatch.setattr(composer_qsdp.recipes.train, "train", lambda *a: pytest.fail("training started"))
    overrides = [allow.format(pkg=pkg)] if allow else []
    path = f"{pkg}.acts:Marker"
    with pytest.raises(RecipeError, match=re.escape(f"recipe key 'callbacks.{path}' = '{path}' is invalid; a recipe "
                                                    "imports only the modules that the registries name")):
        load_recipe(BASELINE, [*overrides, f"callbacks={{'{path}': {{}}}}"])
    assert main([str(BASELINE), *overrides, f"callbacks={{'{path}': {{}}}}"]) == 2
    assert f"recipe key 'callbacks.{path}'" in capsys.readouterr().err
    assert not marker.exists() and f"{pkg}.acts" not in sys.modules


@pytest.mark.parametrize("allow", ["{pkg}.acts", "{pkg}.acts:Marker"])
def test_the_exact_module_or_class_is_imported(acting_package, allow):
    pkg, marker = acting_package
    recipe = load_recipe(BASELINE, [f"allow_imports=['{allow.format(pkg=pkg)}']",
                                    f"callbacks={{'{pkg}.acts:Marker': {{}}}}"])
    assert marker.exists()
    assert any(type(c) is sys.modules[f"{pkg}.acts"].Marker for c in build_components(recipe, "callbacks"))


def test_a_module_of_this_package_that_no_registry_names_is_not_imported(tmp_path, monkeypatch):
    """A module placed inside composer_qsdp (a plugin folder, a stray file) is no registry's: naming it imports
    nothing, though the package itself is this one."""
    import composer_qsdp.recipes

    marker = tmp_path / "imported"
    (tmp_path / "trust_stray.py").write_text(f"from pathlib import Path\nPath({str(marker)!r}).write_text('x')\n")
    monkeypatch.setattr(composer_qsdp.recipes, "__path__", [*composer_qsdp.recipes.__path__, str(tmp_path)])
    path = "composer_qsdp.recipes.trust_stray:Marker"
    with pytest.raises(RecipeError, match=re.escape(f"'{path}' is invalid; a recipe imports only the modules")):
        load_recipe(BASELINE, [f"callbacks={{'{path}': {{}}}}"])
    assert not marker.exists() and "composer_qsdp.recipes.trust_stray" not in sys.modules


# ------------------------------------------------------------------------- settled at load, not at set-up
@pytest.mark.parametrize("entry, missing", [
    ("early_stopper", "callbacks.early_stopper.monitor, callbacks.early_stopper.dataloader_label (the keyword "
                      "arguments of EarlyStopper without a default)"),
    ("generate", "callbacks.generate.prompts, callbacks.generate.interval (the keyword arguments of Generate "
                 "without a default)"),
])
def test_a_callback_missing_required_arguments_stops_the_entrypoint(entry, missing, monkeypatch, capsys):
    monkeypatch.setattr(composer_qsdp.recipes.train, "train", lambda *a: pytest.fail("training started"))
    assert main([str(BASELINE), f"callbacks.{entry}={{}}"]) == 2
    assert f"recipe is missing required key(s): {missing}" in capsys.readouterr().err


@pytest.mark.parametrize("recipe, overrides", [
    (QSDP_RECIPE, ["algorithms.qsdp.ranks_per_node=3"]),
    (BASELINE, ["fsdp=null", "algorithms.zero_one_adam.ranks_per_node=3"]),
])
def test_ranks_per_node_must_divide_the_world_size(recipe, overrides):
    algorithm = overrides[-1].split(".")[1]
    with pytest.raises(RecipeError, match=re.escape(f"recipe key 'algorithms.{algorithm}.ranks_per_node' = 3 is "
                                                    "invalid; it must divide the world size (4 processes): every node "
                                                    "holds equally many ranks; allowed: 1, 2, 4")):
        load_recipe(recipe, ["global_train_batch_size=8", *overrides], world_size=4)
    fits = load_recipe(recipe, ["global_train_batch_size=8", overrides[-1].replace("=3", "=2"), *overrides[:-1]],
                       world_size=4)
    assert fits.algorithm_kwargs[algorithm]["ranks_per_node"] == 2
    with pytest.raises(RecipeError, match=f"'algorithms.{algorithm}(.ranks_per_node' = 0|' is invalid: .*"
                                          "ranks_per_node=0) is invalid"):
        load_recipe(recipe, ["global_train_batch_size=8", overrides[-1].replace("=3", "=0"), *overrides[:-1]],
                    world_size=4)


# ---------------------------------------------------------------------- a preset over an inherited section
def preset_child(tmp_path: Path, qsdp: str, base: Path = QSDP_RECIPE) -> Path:
    (tmp_path / "child.yaml").write_text(f"base: {base}\nalgorithms:\n  qsdp: {qsdp}\n")
    return tmp_path / "child.yaml"


@pytest.mark.parametrize("spelling", ["replace", "dotted", "yaml"])
def test_a_preset_switch_over_the_base_qsdp_section_gives_exactly_that_preset(tmp_path, spelling):
    """gpt-tiny-qsdp.yaml sets weight_bits: 8, grad_bits: 8, codecs and bucket_size; switching its preset to
    sdp4bit must not keep them (they would override the preset's qWD weights and TLq-HS gradients)."""
    recipe = {"replace": lambda: load_recipe(QSDP_RECIPE, ["algorithms.qsdp={preset: sdp4bit}"]),
              "dotted": lambda: load_recipe(QSDP_RECIPE, ["algorithms.qsdp.preset=sdp4bit"]),
              "yaml": lambda: load_recipe(preset_child(tmp_path, "{preset: sdp4bit}"))}[spelling]()
    assert recipe.algorithm_kwargs["qsdp"] == {"preset": "sdp4bit"}
    assert build_algorithm("qsdp", recipe.algorithm_kwargs["qsdp"]).config == from_preset("sdp4bit")


def test_a_preset_switch_keeps_the_options_given_with_it_and_the_base_run_options(tmp_path):
    recipe = load_recipe(QSDP_RECIPE, ["algorithms.qsdp.preset=sdp4bit", "algorithms.qsdp.grad_bits=8"])
    assert recipe.algorithm_kwargs["qsdp"] == {"preset": "sdp4bit", "grad_bits": 8}
    assert build_algorithm("qsdp", recipe.algorithm_kwargs["qsdp"]).config == from_preset("sdp4bit", grad_bits=8)
    (tmp_path / "base.yaml").write_text(f"base: {QSDP_RECIPE}\nalgorithms:\n"
                                        "  qsdp: {preset: w8g4, grad_bits: 2, exclude: [model.wte], seed: 5}\n")
    switched = load_recipe(preset_child(tmp_path, "{preset: zeropp}", base=tmp_path / "base.yaml"))
    assert switched.algorithm_kwargs["qsdp"] == {"preset": "zeropp", "exclude": ["model.wte"], "seed": 5}
    # Without a switch, the section merges as every other does.
    same = load_recipe(preset_child(tmp_path, "{preset: w8g4, weight_bits: 6}", base=tmp_path / "base.yaml"))
    assert same.algorithm_kwargs["qsdp"] == {"preset": "w8g4", "grad_bits": 2, "exclude": ["model.wte"], "seed": 5,
                                             "weight_bits": 6}
