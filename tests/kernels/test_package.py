"""The kernels package is the bottom layer: it loads nothing else of composer_qsdp, and its package namespace loads
without Triton; the public names of kernels and quant resolve."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import composer_qsdp.kernels
import composer_qsdp.quant

_LOADED = """
import json, sys
class NoTriton:  # a machine without Triton
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "triton":
            raise ImportError("triton is not installed")
if sys.argv[1] == "no-triton":
    sys.meta_path.insert(0, NoTriton())
for module in sys.argv[2:]:
    __import__(module)
print(json.dumps(sorted(m for m in sys.modules if m.startswith(("composer_qsdp", "triton")))))
"""


def _loaded(triton: bool, *modules: str) -> list[str]:
    """The composer_qsdp and triton modules loaded by importing ``modules`` in a fresh process (from the same
    source tree as this test's), with or without Triton."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    root = Path(composer_qsdp.__file__).parents[1]
    run = subprocess.run([sys.executable, "-c", _LOADED, "triton" if triton else "no-triton", *modules],
                         capture_output=True, text=True, env=env, cwd=root, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_the_package_namespace_loads_without_triton_and_nothing_above_it():
    loaded = _loaded(False, "composer_qsdp.kernels")
    assert all(m == "composer_qsdp" or m.startswith("composer_qsdp.kernels") for m in loaded), loaded


@pytest.mark.parametrize("module", ["minmax", "symmetric", "hadamard"])
def test_kernel_modules_load_nothing_of_the_layers_above(module):
    loaded = _loaded(True, f"composer_qsdp.kernels.{module}")
    ours = [m for m in loaded if m.startswith("composer_qsdp")]
    assert f"composer_qsdp.kernels.{module}" in ours and "triton" in loaded
    assert all(m == "composer_qsdp" or m.startswith("composer_qsdp.kernels") for m in ours), ours


@pytest.mark.parametrize("package", [composer_qsdp.kernels, composer_qsdp.quant])
def test_public_names_resolve(package):
    assert package.__all__ and all(getattr(package, name) is not None for name in package.__all__)
