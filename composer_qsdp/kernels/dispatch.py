"""When to run a Triton kernel instead of the torch reference.

Rule: tensors on a CUDA device use the Triton kernels; anything else uses the torch reference. Two ways to
override it:

* ``with backend("torch"): ...`` / ``with backend("triton"): ...`` for a block of code (tests, debugging).
  Forcing ``"triton"`` on CPU tensors needs the Triton interpreter (``TRITON_INTERPRET=1`` set before the
  kernels are imported); that is how CI checks kernels against the reference without a GPU.
* the environment variable ``COMPOSER_QSDP_KERNELS`` (``auto``, ``triton`` or ``torch``; default ``auto``)
  for a whole process, e.g. to rule the kernels out while debugging a run on a GPU.

A codec asks :func:`use_triton` and, when it says yes, still falls back to its reference for configurations
its kernel does not cover (documented per codec).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib.util
import os
from collections.abc import Iterator

import torch

__all__ = ["BACKENDS", "backend", "interpreter_enabled", "triton_available", "use_triton"]

#: Accepted backend names.
BACKENDS = ("auto", "triton", "torch")
_ENV_VAR = "COMPOSER_QSDP_KERNELS"


def _check_backend(name: str, source: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f"{source}={name!r} is not a kernel backend; allowed: {', '.join(BACKENDS)}")
    return name


_forced: contextvars.ContextVar[str | None] = contextvars.ContextVar("composer_qsdp_kernel_backend", default=None)


@functools.cache
def triton_available() -> bool:
    """True when the ``triton`` package is installed (it need not have a GPU to import)."""
    return importlib.util.find_spec("triton") is not None


def interpreter_enabled() -> bool:
    """True when ``TRITON_INTERPRET=1``: kernels then run on CPU tensors, slowly (a fixed cost per program)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _current_backend() -> str:
    forced = _forced.get()
    if forced is not None:
        return forced
    return _check_backend(os.environ.get(_ENV_VAR, "auto"), _ENV_VAR)


def use_triton(*tensors: torch.Tensor) -> bool:
    """Whether the kernels should process ``tensors`` (True: Triton, False: torch reference).

    ``auto``: all tensors on CUDA and Triton installed. ``torch``: never. ``triton``: always, which for CPU
    tensors requires the interpreter.

    Raises:
        RuntimeError: ``triton`` is forced for CPU tensors without ``TRITON_INTERPRET=1``, or Triton is missing.
    """
    choice = _current_backend()
    if choice == "torch":
        return False
    on_cuda = all(t.is_cuda for t in tensors)
    if choice == "auto":
        return on_cuda and triton_available()
    if not triton_available():
        raise RuntimeError("the triton kernel backend is forced but the triton package is not installed")
    if not on_cuda and not interpreter_enabled():
        raise RuntimeError(
            "the triton kernel backend is forced for CPU tensors; set TRITON_INTERPRET=1 before importing "
            "composer_qsdp.kernels to run the kernels under the Triton interpreter"
        )
    return True


@contextlib.contextmanager
def backend(name: str) -> Iterator[None]:
    """Force the kernel backend (``"auto"``, ``"triton"`` or ``"torch"``) inside a ``with`` block."""
    token = _forced.set(_check_backend(name, "backend"))
    try:
        yield
    finally:
        _forced.reset(token)
