"""The device the kernel tests put their tensors on, shared by the kernel tests.

On a CUDA host the kernels compile and run there; elsewhere tests/conftest.py switches the Triton interpreter on
and they run on CPU tensors. Tests draw their inputs on the CPU (seeded ``torch.Generator``) and move them, so both
hosts check the same values.
"""

import torch

__all__ = ["DEVICE"]

#: ``"cuda"`` where a CUDA device is available, else ``"cpu"``.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
