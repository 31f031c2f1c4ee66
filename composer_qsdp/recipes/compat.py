"""The GPT harness's private torch, Composer and mosaicml-streaming names: the default process group's rendezvous
store, the hooks that make a checkpoint load as data, never as code, and the release of a streaming dataset.

When a collective times out, :mod:`composer_qsdp.recipes.train` has every rank that timed out report itself in the
store all ranks rendezvoused through, to name the silent ones. torch has no public reader for that store, and no
public way reaches it under every ``init_method`` (``env://``, ``file://``, ``tcp://``).

Composer 0.32 unpickles a full checkpoint with ``torch.load(..., weights_only=False)``
(``composer.utils.checkpoint._torch_load_with_validation``) and extracts a tar checkpoint without checking where
its members land (``download_checkpoint``); ``torch.distributed.checkpoint`` unpickles a sharded checkpoint's
``.metadata`` with ``pickle.load`` (``FileSystemReader.read_metadata``) and its non-tensor items with
``torch.load(..., weights_only=False)`` (``DefaultLoadPlanner.load_bytes``). None of them has a public switch, so
:func:`restricted_checkpoint_loads` replaces those four for the duration of a ``with`` block, all here:

* a full checkpoint and every non-tensor item of a sharded one load with ``torch.load(weights_only=True)`` and
  :data:`CHECKPOINT_GLOBALS` besides the tensors, containers and numbers that ``weights_only`` always allows;
* ``.metadata`` is read by an unpickler that finds only :data:`METADATA_GLOBALS`;
* a tar archive is not extracted.

Anything else is refused with :class:`UntrustedCheckpointError` at the pickle opcode that names it, before it is
called.

A run that ends before its epoch does (``max_duration`` inside one, an error, a signal) leaves each
``StreamingDataset`` it read with the prepare and ready threads of ``__iter__`` waiting for samples that nobody asks
for, and with its shared memory open until the process exits. mosaicml-streaming has no public way to end either;
:func:`release_streaming_dataset` does, through the dataset's own stop flag and thread pool.

Private names in the package live in the FSDP adapters' compat modules (:mod:`composer_qsdp.fsdp2.compat`,
:mod:`composer_qsdp.fsdp1.compat`) and here; ``tests/test_private_access.py`` keeps it so.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import io
import os
import pathlib
import pickle
import re
from collections.abc import Iterable, Iterator
from typing import IO, Any

import numpy
import torch
import torch.distributed.checkpoint.filesystem as dcp_filesystem
import torch.distributed.checkpoint.metadata as dcp_metadata
from composer.utils import checkpoint as composer_checkpoint
from composer.utils import is_tar
from streaming import StreamingDataset
from streaming.base.shared import SharedArray, SharedBarrier, SharedMemory, SharedScalar
from torch.distributed import Store, distributed_c10d
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.torch_version import TorchVersion

__all__ = ["CHECKPOINT_GLOBALS", "METADATA_GLOBALS", "UntrustedCheckpointError", "default_store",
           "load_checkpoint_file", "load_dcp_metadata", "release_streaming_dataset", "restricted_checkpoint_loads"]


def default_store() -> Store:
    """The store of the default process group (served by rank 0 for TCP rendezvous).

    Raises:
        RuntimeError: no default process group is initialized.
    """
    return distributed_c10d._get_default_store()


# ----------------------------------------------------------------------------------------------- checkpoints
_RECONSTRUCT = numpy._core.multiarray._reconstruct if hasattr(numpy, "_core") else numpy.core.multiarray._reconstruct

#: What a checkpoint of the recipes holds besides what ``torch.load(weights_only=True)`` always allows (tensors,
#: ``torch.Size``, dtypes, ``OrderedDict``, Python's containers and numbers), found by loading the checkpoints the
#: recipes write with nothing more (full and sharded; plain FSDP2, QSDP W8G8, qWD with LoCo, the automatic policy,
#: 0/1 Adam under DDP, a Hugging Face GPT-2); each entry with what needs it.
#: Numpy's ``_reconstruct`` under both module names, so that a checkpoint written under numpy 1 loads under 2.
CHECKPOINT_GLOBALS: tuple[Any, ...] = (
    datetime.timedelta,  # Composer's Timestamp wall-clock times; CheckpointSaver's checkpoint -> timestamp map
    TorchVersion,  # Composer's metadata.torch_version (a str subclass)
    numpy.ndarray,  # numpy's RNG state in Composer's per-rank rng entry: a uint32 key array,
    numpy.dtype,  # ... its dtype,
    type(numpy.dtype(numpy.uint32)),  # ... whose class is built (numpy.dtypes.UInt32DType),
    (_RECONSTRUCT, "numpy._core.multiarray._reconstruct"),  # ... and the function that rebuilds an ndarray
    (_RECONSTRUCT, "numpy.core.multiarray._reconstruct"),
)

#: The only globals a sharded checkpoint's ``.metadata`` may name: torch.distributed.checkpoint's metadata classes,
#: ``torch.Size``, the dtypes and layouts a tensor's properties name, and the path it was saved to.
METADATA_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {(dcp_metadata.__name__, name) for name in ("Metadata", "MetadataIndex", "StorageMeta", "TensorStorageMetadata",
                                                "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
                                                "_MEM_FORMAT_ENCODING")}  # the last: TensorProperties.memory_format
    | {(dcp_filesystem.__name__, "_StorageInfo"),  # where each item is in the .distcp files
       ("torch", "Size"),
       ("torch.serialization", "_get_layout"),  # a torch.layout by its name (torch.strided)
       (pathlib.PosixPath.__module__, "PosixPath")}  # StorageMeta.checkpoint_id
    | {("torch", name) for name, value in vars(torch).items() if isinstance(value, torch.dtype)})


class UntrustedCheckpointError(pickle.UnpicklingError):
    """A checkpoint file needs more than tensors and Composer's training state to load: a global outside the
    allow-list (:data:`CHECKPOINT_GLOBALS`, :data:`METADATA_GLOBALS`), which unpickling would call, or a tar
    archive's extraction. Nothing of the file was run.

    Attributes:
        path: the file.
        needs: what loading it needs (the offending global's dotted name, or what is wrong).
    """

    def __init__(self, path: str | os.PathLike, needs: str) -> None:
        self.path, self.needs = str(path), needs
        super().__init__(
            f"checkpoint file {path} needs {needs}, which a checkpoint may not load by default: unpickling it could "
            "run code, so nothing of it was loaded (a checkpoint loads tensors and Composer's training state only; "
            "docs/trust.md). If you trust whoever wrote it, set trust_checkpoint: true (recipe key) or pass "
            "trust_checkpoint=True (composer_qsdp.recipes.safe_load.checkpoint_loading) to load it as Composer "
            "does, running what it names")

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        # torch.distributed.checkpoint gathers a rank's exception to every rank by pickling it.
        return type(self), (self.path, self.needs)


def _weights_only_reason(err: pickle.UnpicklingError) -> str | None:
    """The global or type that ``torch.load(weights_only=True)`` refused, from its message; None when it refused
    something else (a damaged pickle)."""
    message = str(err)
    found = re.search(r"Unsupported global: GLOBAL (\S+) was not an allowed global", message)
    if found:
        return f"the global {found.group(1)}"
    found = re.search(r"Can only build .* but got (<class '[^']+'>)", message)
    return f"the type {found.group(1)}" if found else None


def _unsafe_globals(f: str | os.PathLike | IO[bytes]) -> list[str]:
    """The globals of the ``torch.save`` file ``f`` outside the allow-list (static: nothing is unpickled)."""
    try:
        if hasattr(f, "seek"):
            f.seek(0)
        return sorted(torch.serialization.get_unsafe_globals_in_checkpoint(f))
    except Exception:  # noqa: BLE001 - not a torch.save zip: the weights_only error is the answer
        return []


def load_checkpoint_file(f: str | os.PathLike | IO[bytes], name: str | os.PathLike, map_location: Any = "cpu") -> Any:
    """``torch.load(f, weights_only=True)`` allowing :data:`CHECKPOINT_GLOBALS` too.

    Raises:
        UntrustedCheckpointError: ``f`` names a global outside them, naming ``name`` (the file) and the global.
    """
    with torch.serialization.safe_globals(list(CHECKPOINT_GLOBALS)):
        try:
            return torch.load(f, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as err:
            unsafe = _unsafe_globals(f)
            needs = (f"the global{'s' if len(unsafe) > 1 else ''} {', '.join(unsafe)}" if unsafe
                     else _weights_only_reason(err))
            if needs is None:
                raise
            raise UntrustedCheckpointError(name, needs) from None


class _MetadataUnpickler(pickle.Unpickler):
    """Finds only :data:`METADATA_GLOBALS`."""

    def __init__(self, file: IO[bytes], name: str) -> None:
        super().__init__(file)
        self.name = name

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in METADATA_GLOBALS:
            raise UntrustedCheckpointError(self.name, f"the global {module}.{name}")
        return super().find_class(module, name)


def load_dcp_metadata(file: IO[bytes]) -> Any:
    """Unpickle a sharded checkpoint's ``.metadata`` from the open ``file``, finding only :data:`METADATA_GLOBALS`.

    Raises:
        UntrustedCheckpointError: it names another global, naming the file (``file.name``) and the global.
    """
    name = os.path.realpath(getattr(file, "name", ".metadata"))
    _read.folder = os.path.dirname(name)
    return _MetadataUnpickler(file, name).load()


class _read:
    """The folder of the ``.metadata`` read last: the sharded checkpoint whose items are being loaded."""

    folder: str | None = None


class _MetadataPickle:
    """What ``torch.distributed.checkpoint.filesystem`` sees as ``pickle`` inside :func:`restricted_checkpoint_loads`:
    ``load`` is :func:`load_dcp_metadata`, everything else (the writer's ``dump``) is :mod:`pickle`'s."""

    load = staticmethod(load_dcp_metadata)

    def __getattr__(self, name: str) -> Any:
        return getattr(pickle, name)


def _load_bytes(self: DefaultLoadPlanner, read_item: Any, value: io.BytesIO) -> None:
    """``DefaultLoadPlanner.load_bytes`` with :func:`load_checkpoint_file` for its ``torch.load``."""
    relative = self.metadata.storage_data[read_item.storage_index].relative_path if self.metadata else "?"
    name = os.path.join(_read.folder, relative) if _read.folder else relative
    loaded = load_checkpoint_file(value, f"{name} (item {read_item.dest_index.fqn})")
    if self.flatten_state_dict:
        set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
    else:
        self.state_dict[read_item.dest_index.fqn] = loaded


def _torch_load_with_validation(checkpoint_filepath: str | os.PathLike, map_location: str) -> Any:
    """Composer's full-checkpoint load (its validation hook, then ``torch.load``) with :func:`load_checkpoint_file`;
    the file is named where it really is (Composer loads it through a link in a temporary folder)."""
    path = composer_checkpoint._ensure_valid_checkpoint(checkpoint_filepath)
    return load_checkpoint_file(path, os.path.realpath(path), map_location)


def _refusing_tar(download: Any) -> Any:
    def download_checkpoint(*args: Any, **kwargs: Any) -> Any:
        path = kwargs["path"] if "path" in kwargs else args[0]
        if is_tar(path):
            raise UntrustedCheckpointError(path, "a tar archive's extraction, which Composer does without checking "
                                                 "where its members land (a member can overwrite any file)")
        return download(*args, **kwargs)

    return download_checkpoint


@contextlib.contextmanager
def restricted_checkpoint_loads() -> Iterator[None]:
    """Within the block, every checkpoint Composer or ``torch.distributed.checkpoint`` reads loads as data only
    (module docstring); process-wide, so meant around a whole run (a Trainer's construction and fit).

    Raises:
        UntrustedCheckpointError: from a load inside the block, for a checkpoint that needs more.
    """
    if dcp_filesystem.pickle is not pickle and not isinstance(dcp_filesystem.pickle, _MetadataPickle):
        raise RuntimeError("torch.distributed.checkpoint.filesystem no longer reads .metadata with pickle: "
                           "composer_qsdp.recipes.compat needs updating for this torch")
    saved = (composer_checkpoint._torch_load_with_validation, composer_checkpoint.download_checkpoint,
             dcp_filesystem.pickle, DefaultLoadPlanner.load_bytes, _read.folder)
    composer_checkpoint._torch_load_with_validation = _torch_load_with_validation
    composer_checkpoint.download_checkpoint = _refusing_tar(saved[1])
    dcp_filesystem.pickle = _MetadataPickle()
    DefaultLoadPlanner.load_bytes = _load_bytes
    try:
        yield
    finally:
        (composer_checkpoint._torch_load_with_validation, composer_checkpoint.download_checkpoint,
         dcp_filesystem.pickle, DefaultLoadPlanner.load_bytes, _read.folder) = saved


# ------------------------------------------------------------------------------------------ streaming datasets
def release_streaming_dataset(dataset: StreamingDataset) -> None:
    """Stop ``dataset``'s prefetch threads and free its shared memory for good: it cannot be read afterwards.

    Until then, a dataset whose iteration stopped mid-epoch stays alive, held by its threads, and every shared-memory
    name it opened stays open (two descriptors each) until the process exits, held by streaming's ``atexit``
    callbacks: runs in one process (tests, notebooks) pile them up to the open-file limit. The stop flag and the
    thread pool are private attributes of mosaicml-streaming 0.12 and 0.13, looked up so that a release without one
    skips it. Waits for a thread in the middle of a shard's download until that download ends.
    """
    stop = getattr(dataset, "_event", None)
    if stop is not None:
        stop.set()  # both threads check it in every loop, the ready thread also while it waits for a shard
    pool = getattr(dataset, "_executor", None)
    if pool is not None:
        pool.shutdown(wait=True)
    for shared in _shared_memory(vars(dataset).values()):
        shared.cleanup()  # closes it, and unlinks the names this process created
        # Else kept until exit, and unlinked once more then, when another dataset may have taken the name.
        atexit.unregister(shared.cleanup)


def _shared_memory(values: Iterable[object]) -> Iterator[SharedMemory]:
    """The streaming ``SharedMemory`` objects among ``values`` and inside the shared arrays, scalars and barriers
    among them: a ``StreamingDataset`` keeps each of its shared-memory names in one of these."""
    for value in values:
        if isinstance(value, SharedMemory):
            yield value
        elif isinstance(value, (SharedArray, SharedBarrier, SharedScalar)):
            yield from _shared_memory(vars(value).values())
