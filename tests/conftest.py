"""Test-suite wide setup.

On a machine without CUDA the Triton kernels run under the Triton interpreter, which must be switched on
before any ``@triton.jit`` function is decorated, i.e. before ``composer_qsdp.kernels`` is imported.
The codecs still use the torch reference on CPU tensors; kernel tests call the launchers directly.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Multi-process CPU tests: 2 ranks x N intra-op threads oversubscribe small machines badly.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
