"""``samedev``: a process-group backend for ranks that share one device, moving data through shared staging buffers.

Ranks sharing a GPU cannot use NCCL ("Duplicate GPU detected"), and gloo carries every CUDA message through host
memory and the loopback network: a GPT-350M step of two such ranks spends most of its time there. Here each rank
keeps one staging buffer on the device that every other rank of the group maps (CUDA IPC; shared memory for CPU
tensors), so a collective is a copy in, a host barrier, copies out and a second barrier. Sums are taken in rank
order in the tensors' dtype, as one deterministic reduction; with two ranks they are bit for bit gloo's and NCCL's.

Call :func:`register_same_device_backend` once per process, then ``init_process_group("samedev")``: the group
carries CPU tensors the same way (through shared-memory files), and its barriers run on a gloo group of the same
store. Every rank of a group must be on the same device. All-to-all takes equal splits only, and point-to-point
is refused: nothing this package, FSDP2 or torch's distributed checkpoints run needs it.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist
from composer_qsdp.comm.compat import completed_work

__all__ = ["BACKEND", "SameDeviceGroup", "register_same_device_backend"]

#: The backend's name in ``init_process_group`` and ``new_group``.
BACKEND = "samedev"

_REDUCE: dict[Any, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    dist.ReduceOp.SUM: torch.add, dist.ReduceOp.AVG: torch.add, dist.ReduceOp.PRODUCT: torch.mul,
    dist.ReduceOp.MAX: torch.maximum, dist.ReduceOp.MIN: torch.minimum}


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s memory as a flat uint8 view (it must be contiguous)."""
    if not tensor.is_contiguous():
        raise ValueError(f"{BACKEND} collectives take contiguous tensors, got strides {tensor.stride()}")
    return tensor.reshape(-1).view(torch.uint8)


class _Staging:
    """One rank's buffer that every rank of the group maps, grown (collectively) to the largest message."""

    def __init__(self, store: dist.Store, rank: int, size: int, device: torch.device) -> None:
        self.store, self.rank, self.size, self.device = store, rank, size, device
        self.capacity = 0
        self.generation = 0
        self.views: list[torch.Tensor] = []

    def ensure(self, nbytes: int, barrier: Callable[[], None]) -> None:
        """Every rank calls this with the same ``nbytes`` before a collective; grows all buffers together."""
        if nbytes <= self.capacity and self.views:
            return
        capacity = max(nbytes, 2 * self.capacity, 1 << 20)
        barrier()  # no rank still reads the old buffers
        self.views = []
        barrier()  # no rank still maps them: each owner can free its own
        self.generation += 1
        key = f"{self.device.type}/{self.generation}/"
        mine, shared = self._allocate(capacity)
        self.store.set(key + str(self.rank), pickle.dumps((str(self.device), shared)))
        published = [pickle.loads(self.store.get(key + str(r))) for r in range(self.size)]
        elsewhere = [f"rank {r} on {device}" for r, (device, _) in enumerate(published) if device != str(self.device)]
        if elsewhere:
            raise RuntimeError(f"{BACKEND} joins ranks of one device: rank {self.rank} is on {self.device}, "
                               f"{', '.join(elsewhere)} (use NCCL for a GPU per rank)")
        self.views = [mine if r == self.rank else self._open(shared) for r, (_, shared) in enumerate(published)]
        self.capacity = capacity
        barrier()  # every rank mapped every buffer
        if self.device.type != "cuda":
            os.unlink(shared)  # the mappings stay; nothing is left behind if a rank dies

    def _allocate(self, capacity: int) -> tuple[torch.Tensor, Any]:
        if self.device.type == "cuda":
            from torch.multiprocessing.reductions import reduce_tensor

            buffer = torch.empty(capacity, dtype=torch.uint8, device=self.device)
            return buffer, reduce_tensor(buffer)
        fd, path = tempfile.mkstemp(prefix=f"{BACKEND}-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        os.ftruncate(fd, capacity)
        os.close(fd)
        return torch.from_file(path, shared=True, size=capacity, dtype=torch.uint8), path

    def _open(self, shared: Any) -> torch.Tensor:
        if self.device.type == "cuda":
            rebuild, args = shared
            return rebuild(*args)
        return torch.from_file(shared, shared=True, size=os.path.getsize(shared), dtype=torch.uint8)


class SameDeviceGroup(dist.ProcessGroup):
    """The ``samedev`` backend of one group: see the module's docstring."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self._host = dist.ProcessGroupGloo(dist.PrefixStore("host", store), rank, size, timeout)
        self._store = dist.PrefixStore("staging", store)
        self._staging: dict[torch.device, _Staging] = {}
        self._name = ""

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return BACKEND

    # c10d names a Python process group through these (DeviceMesh reads the name back)
    def _set_group_name(self, name: str) -> None:
        self._name = name

    @property
    def group_name(self) -> str:
        return self._name

    def size(self) -> int:
        return self._size

    # --- the exchange every collective is made of ---
    def _barrier(self) -> None:
        self._host.barrier().wait()

    def _sync(self, device: torch.device) -> None:
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()

    def _exchange(self, payload: torch.Tensor | None, read: Callable[[list[torch.Tensor]], Any],
                  nbytes: int | None = None, device: torch.device | None = None) -> Any:
        """Put ``payload`` (bytes; ``nbytes`` of them on every rank) in this rank's buffer, then ``read`` every
        rank's ``nbytes`` (in rank order) once all have written; returns what ``read`` returns. A rank with nothing
        to send (scatter's receivers) passes None and its ``nbytes`` and ``device``."""
        if payload is not None:
            nbytes, device = payload.numel(), payload.device
        staging = self._staging.get(device)
        if staging is None:
            staging = self._staging[device] = _Staging(self._store, self._rank, self._size, device)
        staging.ensure(nbytes, self._barrier)
        if payload is not None:
            staging.views[self._rank][:nbytes].copy_(payload)
        self._sync(device)
        self._barrier()  # every payload is in place
        result = read([view[:nbytes] for view in staging.views])
        self._sync(device)
        self._barrier()  # every rank has read: the buffers can take the next message
        return result

    @staticmethod
    def _typed(view: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return view.view(like.dtype).view(like.shape)

    # --- collectives ---
    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        chunks = _bytes(output).chunk(self._size)
        self._exchange(_bytes(input), lambda views: [c.copy_(v) for c, v in zip(chunks, views)])
        return completed_work(output)

    def allgather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        for outputs, input in zip(output_lists, inputs):
            self._exchange(_bytes(input), lambda views, outputs=outputs: [
                _bytes(o).copy_(v) for o, v in zip(outputs, views)])
        return completed_work(output_lists)

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> Any:
        for output, input in zip(outputs, inputs):
            self._allgather_base(output, input)
        return completed_work(outputs)

    def _reduce(self, views: list[torch.Tensor], like: torch.Tensor, op: Any) -> torch.Tensor:
        op = getattr(op, "op", op)  # options hold a ReduceOp, whose .op is the RedOpType
        if op not in _REDUCE:
            raise ValueError(f"{BACKEND} reduces with {', '.join(str(o) for o in _REDUCE)}, not {op}")
        total = self._typed(views[0], like).clone()
        for view in views[1:]:
            total = _REDUCE[op](total, self._typed(view, like))
        return total / self._size if op == dist.ReduceOp.AVG else total

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        for tensor in tensors:
            self._exchange(_bytes(tensor), lambda views, t=tensor: t.copy_(self._reduce(views, t, op)))
        return completed_work(tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        return self.allreduce(tensors, opts)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        n = output.numel() * output.element_size()

        def read(views: list[torch.Tensor]) -> None:
            mine = [v[self._rank * n: (self._rank + 1) * n] for v in views]
            output.copy_(self._reduce(mine, output, op))

        self._exchange(_bytes(input), read)
        return completed_work(output)

    def reduce_scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                       opts: Any = None) -> Any:
        for output, inputs in zip(outputs, input_lists):
            self._reduce_scatter_base(output, torch.cat([t.reshape(-1) for t in inputs]), opts)
        return completed_work(outputs)

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> Any:
        for output, input in zip(outputs, inputs):
            self._reduce_scatter_base(output, input, opts)
        return completed_work(outputs)

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_splits: list[int],
                      input_splits: list[int], opts: Any = None) -> Any:
        if output_splits or input_splits:
            even = input.shape[0] // self._size if input.dim() else 0
            if any(s != even for s in [*output_splits, *input_splits]):
                raise ValueError(f"{BACKEND} all-to-all takes equal splits, got input {input_splits} / output "
                                 f"{output_splits}")
        n = output.numel() * output.element_size() // self._size
        chunks = _bytes(output).chunk(self._size)
        self._exchange(_bytes(input), lambda views: [
            c.copy_(v[self._rank * n: (self._rank + 1) * n]) for c, v in zip(chunks, views)])
        return completed_work(output)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        root = opts.rootRank if opts is not None else 0
        for tensor in tensors:
            self._exchange(_bytes(tensor), lambda views, t=tensor: None if self._rank == root else
                           _bytes(t).copy_(views[root]))
        return completed_work(tensors)

    def gather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        root = opts.rootRank if opts is not None else 0
        for i, input in enumerate(inputs):
            outputs = output_lists[i] if self._rank == root else []
            self._exchange(_bytes(input), lambda views, outputs=outputs: [
                _bytes(o).copy_(v) for o, v in zip(outputs, views)])
        return completed_work(output_lists)

    def scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any = None) -> Any:
        root = opts.rootRank if opts is not None else 0
        for i, output in enumerate(outputs):
            n = output.numel() * output.element_size()
            payload = torch.cat([_bytes(t) for t in input_lists[i]]) if self._rank == root else None
            self._exchange(payload, lambda views, o=output: _bytes(o).copy_(views[root][self._rank * n:
                                                                                        (self._rank + 1) * n]),
                           n * self._size, output.device)
        return completed_work(outputs)

    def barrier(self, opts: Any = None) -> Any:
        self._barrier()
        return completed_work(None)


def _create(store: dist.Store, rank: int, size: int, timeout: timedelta) -> SameDeviceGroup:
    return SameDeviceGroup(store, rank, size, timeout)


def register_same_device_backend() -> None:
    """Make ``samedev`` a ``torch.distributed`` backend in this process (again: nothing happens)."""
    if BACKEND not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu", "cuda"])
