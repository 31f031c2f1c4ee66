"""Test-suite wide setup.

On a machine without CUDA the Triton kernels run under the Triton interpreter, which must be switched on
before any ``@triton.jit`` function is decorated, i.e. before ``composer_qsdp.kernels`` is imported.
The codecs still use the torch reference on CPU tensors; kernel tests call the launchers directly.
"""

import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Multi-process CPU tests: 2 ranks x N intra-op threads oversubscribe small machines badly.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The benchmark drivers' shared plumbing (scripts in benchmarks/, not a package), e.g. Composer's launcher command.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import pytest  # noqa: E402


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
