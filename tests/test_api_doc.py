"""``docs/api.md`` is the written public API: every module it covers exports exactly the names it lists, each with a
one-line contract, and every public layer package is covered."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
API_DOC = ROOT / "docs" / "api.md"

_MODULE = re.compile(r"^### `(\w+(?:\.\w+)*)`\s*$")
_NAME = re.compile(r"^- `(\w+)` — \S")

#: The subpackages the doc must cover: the layers a user or an extender imports (the harness, ``recipes``, is used
#: through its recipes and entrypoint; the bottom modules are internal).
LAYERS = ("algorithms", "auto", "comm", "config", "ddp", "engine", "fsdp1", "fsdp2", "kernels", "optim", "quant",
          "schemes")


def documented(text: str) -> dict[str, list[str]]:
    """The names listed under each ``### `module``` heading of ``text``, in order."""
    names: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("#"):
            heading = _MODULE.match(line)
            current = heading.group(1) if heading else None
            if current is not None:
                assert current not in names, f"{current} has two sections"
                names[current] = []
        elif current is not None and line.startswith("- "):
            item = _NAME.match(line)
            assert item, f"{current}: {line!r} is not '- `name` — contract'"
            names[current].append(item.group(1))
    return names


def mismatches(listed: dict[str, list[str]], exported: dict[str, list[str]]) -> list[str]:
    """What keeps each module's listed names and its ``__all__`` from agreeing (empty: they agree)."""
    problems = []
    for module, names in listed.items():
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            problems.append(f"{module}: listed twice in docs/api.md: {', '.join(duplicates)}")
        missing = sorted(set(exported[module]) - set(names))
        if missing:
            problems.append(f"{module}: in __all__, not in docs/api.md: {', '.join(missing)}")
        extra = sorted(set(names) - set(exported[module]))
        if extra:
            problems.append(f"{module}: in docs/api.md, not in __all__: {', '.join(extra)}")
    return problems


def test_the_doc_and_every_modules_all_agree():
    listed = documented(API_DOC.read_text())
    modules = {m: importlib.import_module(m) for m in listed}
    assert mismatches(listed, {m: list(module.__all__) for m, module in modules.items()}) == []
    unresolved = [f"{m}.{n}" for m, names in listed.items() for n in names if not hasattr(modules[m], n)]
    assert unresolved == []


def test_the_doc_covers_the_package_and_every_layer():
    listed = documented(API_DOC.read_text())
    assert {"composer_qsdp", *(f"composer_qsdp.{layer}" for layer in LAYERS)} <= set(listed)


def test_a_disagreement_is_named_in_both_directions():
    text = """
## A layer
### `pkg.a`
- `kept` — stays.
- `stale` — was removed from the code.
- `kept` — listed again.
### `pkg.b`
- `only` — the one name.
"""
    listed = documented(text)
    assert listed == {"pkg.a": ["kept", "stale", "kept"], "pkg.b": ["only"]}
    assert mismatches(listed, {"pkg.a": ["kept", "new"], "pkg.b": ["only"]}) == [
        "pkg.a: listed twice in docs/api.md: kept",
        "pkg.a: in __all__, not in docs/api.md: new",
        "pkg.a: in docs/api.md, not in __all__: stale",
    ]
