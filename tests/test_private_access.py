"""Private torch names live in the compat modules only (issue 52, "one way in"): FSDP2's and FSDP1's internals in
``fsdp2/compat.py`` and ``fsdp1/compat.py``, the harness's rendezvous store in ``recipes/compat.py``, a process
group's timeout in ``comm/compat.py``. A torch
release that moves a private name then breaks one known file, which checks it against the installed torch.

The scan (``ast``, no import) flags in every other module of ``composer_qsdp/``:

* imports of a private torch module or name (``from torch.distributed.fsdp._flat_param import ...``,
  ``import torch._C``), and dotted strings naming one (``importlib.import_module("torch._C")``);
* private attributes reached from a name bound to a torch import (``torch._assert``,
  ``dist.distributed_c10d._get_default_store``, ``FSDPModule._get_fsdp_state``), except torch's multi-tensor ops
  (:data:`MULTI_TENSOR`, ``torch._foreach_add_``);
* private attributes of any other object (``fsdp_param._orig_size``, ``tensor._version``, ``getattr(module,
  "_handle")``) unless the package defines that name itself (a method, a ``self._x`` attribute, a module-level
  name), or it is one of :data:`FOREIGN`, the private-looking names of other libraries.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "composer_qsdp"

#: The modules allowed to read torch's private names.
COMPAT = ("composer_qsdp/fsdp2/compat.py", "composer_qsdp/fsdp1/compat.py", "composer_qsdp/recipes/compat.py",
          "composer_qsdp/comm/compat.py")

#: Private-looking attributes of other libraries than torch, which are those libraries' conventions for users.
FOREIGN = {
    "_fsdp_wrap": "Composer's per-module flag choosing FSDP units (Composer's FSDP docs)",
    "_no_split_modules": "transformers' PreTrainedModel list of block classes, read by accelerate and llm-foundry",
}

#: torch's multi-tensor ops, which torch.optim's own foreach implementations call: one launch for a list of tensors
#: where a public per-tensor loop costs a launch per parameter on an optimizer's hot path.
MULTI_TENSOR = re.compile(r"torch\._foreach_\w+")

_TORCH_PATH = re.compile(r"torch(\.\w+)+")
_ATTRIBUTE_CALLS = ("getattr", "setattr", "hasattr", "delattr")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_path(dotted: str) -> bool:
    return any(_private(part) for part in dotted.split("."))


def own_names(sources: Iterable[str]) -> set[str]:
    """The private names the package defines: module-level and class-level names, functions, classes, ``self.x``
    and ``cls.x`` attributes and import aliases. Another object's attribute of such a name is the package's own."""
    names: set[str] = set()
    for source in sources:
        tree = ast.parse(source)
        scopes = [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef))]
        for scope in scopes:
            for stmt in scope.body:
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
                names |= {t.id for target in targets if target is not None for t in ast.walk(target)
                          if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.alias):
                names.add((node.asname or node.name).split(".")[0])
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                  and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                names.add(node.attr)
    return {n for n in names if _private(n)}


def _docstrings(tree: ast.Module) -> set[int]:
    nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                  ast.ClassDef)))]
    return {id(n.body[0].value) for n in nodes
            if n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def private_accesses(source: str, own: set[str]) -> list[tuple[int, str]]:
    """``(line, what)`` for every access to a private name of torch (or of another library's object) in ``source``,
    given the private names ``own`` that the package defines itself."""
    tree = ast.parse(source)
    torch_names, other_modules = set(), set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                is_torch = alias.name.split(".")[0] == "torch"
                if is_torch and _private_path(alias.name):
                    found.append((node.lineno, f"import {alias.name}"))
                bound = alias.asname or alias.name.split(".")[0]
                (torch_names if is_torch else other_modules).add(bound)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            is_torch = node.module.split(".")[0] == "torch"
            for alias in node.names:
                if is_torch and (_private_path(node.module) or _private(alias.name)):
                    found.append((node.lineno, f"from {node.module} import {alias.name}"))
                (torch_names if is_torch else other_modules).add(alias.asname or alias.name)
    docstrings = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            root_name = root.id if isinstance(root, ast.Name) else None
            if root_name in torch_names:
                if not MULTI_TENSOR.fullmatch(ast.unparse(node)):
                    found.append((node.lineno, ast.unparse(node)))
            elif root_name not in other_modules and node.attr not in own and node.attr not in FOREIGN:
                found.append((node.lineno, ast.unparse(node)))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _ATTRIBUTE_CALLS
              and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str)):
            name = node.args[1].value
            if _private(name) and name not in own and name not in FOREIGN:
                found.append((node.lineno, f"{node.func.id}(..., {name!r})"))
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
              and _TORCH_PATH.fullmatch(node.value) and _private_path(node.value)):
            found.append((node.lineno, repr(node.value)))
    return sorted(found)


def _modules() -> dict[str, str]:
    return {path.relative_to(ROOT).as_posix(): path.read_text() for path in sorted(PACKAGE.rglob("*.py"))}


def test_private_torch_names_only_in_the_compat_modules():
    modules = _modules()
    own = own_names(modules.values())
    outside = [f"{path}:{line}: {what}" for path, source in modules.items() if path not in COMPAT
               for line, what in private_accesses(source, own)]
    assert not outside, ("private torch names outside the compat modules (move them behind a function of "
                         f"{', '.join(COMPAT)}):\n" + "\n".join(outside))


def test_the_compat_modules_exist_and_are_seen_reading_private_names():
    """The premise: the scan finds what the compat modules do (else the test above could pass on nothing)."""
    modules = _modules()
    own = own_names(modules.values())
    for path in COMPAT:
        assert private_accesses(modules[path], own), path


SYNTHETIC = '''
import importlib
import os
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather
from torch import _C

class Mine:
    def __init__(self):
        self._cache = {}

    def _helper(self):
        """torch._C is named in a docstring only."""
        return self._cache

def run(fsdp_param, module, other: Mine, t):
    """Reads ``fsdp_param._orig_size`` (a docstring: not an access)."""
    torch._assert(True, "x")
    torch._foreach_copy_([t], [t])
    store = dist.distributed_c10d._get_default_store()
    group = FSDPModule._get_fsdp_state
    size = fsdp_param._orig_size
    counter = t._version
    handle = getattr(module, "_handle", None)
    collectives = importlib.import_module("torch.distributed.fsdp._fully_shard._fsdp_collectives")
    fine = (other._helper(), other._cache, os._exit, torch.no_grad, t.__class__, module._fsdp_wrap,
            getattr(module, "_cache", None), "torch.distributed")
    return store, group, size, counter, handle, collectives, fine
'''


def test_the_scan_names_each_private_access_and_nothing_else():
    """The scan can fail: on a synthetic module, it finds every kind of private torch access, with its line, and
    passes over the package's own private names, other libraries' modules, dunders and docstrings."""
    found = private_accesses(SYNTHETIC, own_names([SYNTHETIC]))
    lines = SYNTHETIC.splitlines()
    assert [(lines[line - 1].strip().split(" = ")[0], what) for line, what in found] == [
        ("from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather",
         "from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather"),
        ("from torch import _C", "from torch import _C"),
        ('torch._assert(True, "x")', "torch._assert"),
        ("store", "dist.distributed_c10d._get_default_store"),
        ("group", "FSDPModule._get_fsdp_state"),
        ("size", "fsdp_param._orig_size"),
        ("counter", "t._version"),
        ("handle", "getattr(..., '_handle')"),
        ("collectives", "'torch.distributed.fsdp._fully_shard._fsdp_collectives'"),
    ]
