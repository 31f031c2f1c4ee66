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
