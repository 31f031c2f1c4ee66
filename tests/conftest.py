"""Test-suite wide setup.

On a machine without CUDA the Triton kernels run under the Triton interpreter, which must be switched on
before any ``@triton.jit`` function is decorated, i.e. before ``composer_qsdp.kernels`` is imported.
The codecs still use the torch reference on CPU tensors; kernel tests call the launchers directly.

What the installed stack cannot run is decided here, once, from markers (CI runs the suite on the pinned GPU-machine
stack, and its torch-version-dependent directories on a stock Composer with the torch it resolves to, see
``.ci/run``):

* ``gpu``: needs a CUDA GPU.
* ``requires_custom_comm``: needs FSDP2's custom collectives (torch >= 2.9), as QSDP's FSDP2 path does; the
  package's own check (:func:`composer_qsdp.fsdp2.check_custom_comm_support`) decides, and its message is the
  skip reason.
* ``requires_triton_kernels``: runs the Triton kernels (compiled, or under the interpreter on CPU); they are
  verified with triton >= 3.4. triton 3.3 (torch 2.7's) generates another Philox stream than the torch reference
  reproduces, and its interpreter cannot run the kernels (no ``get_int1_ty``).
"""

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Multi-process CPU tests: 2 ranks x N intra-op threads oversubscribe small machines badly.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The benchmark drivers' shared plumbing (scripts in benchmarks/, not a package), e.g. Composer's launcher command.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import pytest  # noqa: E402

#: Oldest triton whose kernels match the torch reference (see the module docstring).
MIN_TRITON_FOR_KERNELS = (3, 4)


def missing_custom_comm() -> str | None:
    """Why this torch cannot run QSDP's FSDP2 path, or None when it can."""
    from composer_qsdp.fsdp2 import check_custom_comm_support

    try:
        check_custom_comm_support()
    except RuntimeError as err:
        return str(err)
    return None


def triton_too_old() -> str | None:
    """Why the installed triton cannot run the kernels' tests, or None when it can."""
    import triton

    version = tuple(int(part) for part in triton.__version__.split(".")[:2])
    if version >= MIN_TRITON_FOR_KERNELS:
        return None
    return (f"the Triton kernels are verified with triton >= {'.'.join(map(str, MIN_TRITON_FOR_KERNELS))}; this is "
            f"triton {triton.__version__} (another Philox stream, and its interpreter lacks int1 casts)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reasons = {
        "gpu": None if torch.cuda.is_available() else "needs a CUDA GPU (run on a CUDA host)",
        "requires_custom_comm": missing_custom_comm(),
        "requires_triton_kernels": triton_too_old(),
    }
    skips = {marker: pytest.mark.skip(reason=reason) for marker, reason in reasons.items() if reason is not None}
    for item in items:
        for marker, skip in skips.items():
            if marker in item.keywords:
                item.add_marker(skip)
                break


@pytest.fixture
def one_rank():
    """A real single-rank gloo group for fully_shard.

    In-process Composer tests leave their 1-rank default group behind (Composer never destroys it), so an
    existing 1-rank group is reused; a group this fixture created is torn down after the test.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        assert dist.get_world_size() == 1, "a multi-rank default group leaked into an in-process test"
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture(autouse=True)
def _release_streaming_datasets(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Release the streaming datasets that a test builds itself, as a recipe run releases its own
    (:func:`composer_qsdp.recipes.compat.release_streaming_dataset`).

    A dataset left behind keeps its prefetch threads and shared memory until the session ends, and every dataset
    built after it in the process attaches to that shared memory until exit too (mosaicml-streaming's look-up of a
    free shared-memory prefix), so the session's open files would grow with each later dataset up to the limit.
    """
    streaming = sys.modules.get("streaming")
    if streaming is None:  # no test module imports it: no test builds a dataset of its own
        yield
        return
    built = []
    init = streaming.StreamingDataset.__init__

    def recording(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        built.append(self)

    monkeypatch.setattr(streaming.StreamingDataset, "__init__", recording)
    yield
    if built:
        from composer_qsdp.recipes.compat import release_streaming_dataset

        for dataset in built:
            release_streaming_dataset(dataset)
