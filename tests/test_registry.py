"""The lazy name -> "module:attr" registry shared by the package's name tables."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from composer_qsdp import registry
from composer_qsdp.registry import Registry


def test_lookup_imports_the_module_only_when_the_name_is_used(tmp_path, monkeypatch):
    (tmp_path / "lazy_registry_target.py").write_text("class Thing:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "lazy_registry_target", raising=False)
    table = Registry("thing")
    table.register("thing", "lazy_registry_target:Thing")
    table.register("other", "collections:OrderedDict")
    assert "lazy_registry_target" not in sys.modules
    assert table.names() == ("thing", "other")
    thing = table.lookup("thing")
    assert thing.__name__ == "Thing" and thing.__module__ == "lazy_registry_target"
    assert table.lookup("other") is __import__("collections").OrderedDict


@pytest.mark.parametrize("name", ["nope", ["thing"], None, 3, ""])
def test_unknown_names_of_any_type_raise_a_value_error_naming_them_and_the_allowed_ones(name):
    table = Registry("widget")
    table.register("b", "collections:deque")
    table.register("a", "collections:Counter")
    with pytest.raises(ValueError, match=rf"^unknown widget {re.escape(repr(name))}; allowed: a, b$"):
        table.lookup(name)


@pytest.mark.parametrize("name, target, match", [
    ("a", "collections:deque", "widget 'a' is already registered"),
    ("", "collections:deque", "widget name '' is invalid"),
    (["x"], "collections:deque", r"widget name \['x'\] is invalid"),
    ("x", "collections.deque", "target 'collections.deque' of widget 'x' is invalid; it must be 'module:attr'"),
    ("x", ":deque", "it must be 'module:attr'"),
    ("x", None, "it must be 'module:attr'"),
])  # fmt: skip
def test_register_rejects_bad_names_and_targets(name, target, match):
    table = Registry("widget")
    table.register("a", "collections:Counter")
    with pytest.raises(ValueError, match=match):
        table.register(name, target)
    assert table.names() == ("a",)


def test_a_close_unknown_name_gets_the_suggestion():
    table = Registry("codec")
    table.register("minmax", "collections:deque")
    table.register("symmetric", "collections:Counter")
    with pytest.raises(ValueError, match=r"^unknown codec 'symetric'; did you mean 'symmetric'\?; allowed: minmax, "
                                         r"symmetric$"):
        table.lookup("symetric")


def test_importing_the_registry_loads_no_other_composer_qsdp_module():
    code = "import sys, composer_qsdp.registry; print(sorted(m for m in sys.modules if m.startswith('composer_qsdp')))"
    root = Path(registry.__file__).parents[1]  # this test's source tree
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root).stdout
    # _names (the suggestions) is a bottom module too: it imports nothing of the package.
    assert loaded.strip() == "['composer_qsdp', 'composer_qsdp._names', 'composer_qsdp.registry']"


def test_check_names_without_importing_and_options_name_the_option_class(tmp_path, monkeypatch):
    (tmp_path / "lazy_options_target.py").write_text("class Thing:\n    pass\n\nclass ThingOptions:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "lazy_options_target", raising=False)
    table = Registry("thing")
    table.register("thing", "lazy_options_target:Thing", options="lazy_options_target:ThingOptions")
    table.register("bare", "collections:deque")
    assert table.check("thing") == "thing" and "lazy_options_target" not in sys.modules
    assert table.options("thing").__name__ == "ThingOptions" and table.options("bare") is None
    with pytest.raises(ValueError, match=r"^unknown thing 'thnig'; did you mean 'thing'\?; allowed: bare, thing$"):
        table.check("thnig")
    with pytest.raises(ValueError, match=r"target 'nowhere' of thing 'x' is invalid; it must be 'module:attr'"):
        table.register("x", "collections:deque", options="nowhere")
    assert table.names() == ("thing", "bare")


def test_the_package_names_every_table_in_the_registry_module():
    """One name table: every name a user types (presets, codecs, schemes, policies, candidates) is looked up in
    composer_qsdp.registry, and no other module of the package makes a table of its own."""
    assert registry.PRESETS.names()[0] == "w8g8" and "sdp4bit" in registry.PRESETS.names()
    assert registry.CODECS.names() == ("minmax", "random_shift", "learned", "symmetric", "sign")
    assert (registry.WEIGHT_SCHEMES.names(), registry.GRAD_SCHEMES.names(), registry.ALL_REDUCE_SCHEMES.names()) == (
        ("direct", "difference"), ("flat", "two_level", "loco", "two_level_loco"), ("onebit",))
    assert registry.POLICIES.names() == ("fixed", "auto")
    assert {side: table.names() for side, table in registry.CANDIDATES.items()} == {
        "weights": ("off", "w8", "qwd4", "qwd3"), "grads": ("off", "g8", "g4", "g3loco")}
    package = Path(registry.__file__).parent
    makers = sorted(str(p.relative_to(package)) for p in package.rglob("*.py")
                    if p != Path(registry.__file__) and "Registry(" in p.read_text())
    assert makers == []
