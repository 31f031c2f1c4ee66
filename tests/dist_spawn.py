"""Run a test function on W processes joined by a real ``torch.distributed`` process group.

``run_ranks(fn, world_size, *args, backend=...)`` starts ``world_size`` processes; rank ``r`` runs
``fn(RankInfo, *args)`` inside an initialized default group and the call returns every rank's result (tensors
moved to CPU), or raises with the failing rank's traceback. ``backend`` is ``"gloo"`` (CPU tensors) or
``"nccl"`` (CUDA tensors): NCCL with one GPU per rank (``cuda:r``) where the host has a GPU per rank, else the
shared-GPU mode of :mod:`composer_qsdp.shared_gpu` (rank ``r`` on ``cuda:(r % GPUs)``, a gloo group: NCCL refuses
two ranks on one GPU), so one GPU runs every multi-rank CUDA case with the numerics of N GPUs.
``fn`` must be a module-level function of an importable module. Test modules parametrize a module-scoped fixture
with :func:`spawn_params` to run once per backend and size.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import queue
import signal
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

#: How often (seconds) :func:`run_ranks` looks for a rank that died without reporting while it waits for results.
_POLL_S = 0.2

#: CPU ranks fork from a server process that imported these once, instead of each rank starting an interpreter and
#: importing them (0.5-1 s against 6-15 s per 2-4-rank call on 2 CPU cores). CUDA ranks start fresh interpreters:
#: a fork must not copy CUDA state.
_PRELOAD = ["torch", "torch.distributed.fsdp", "torch.distributed.checkpoint", "composer", "composer_qsdp.fsdp2",
            "composer_qsdp.fsdp1", "composer_qsdp.recipes.train"]
_CPU_RANKS = mp.get_context("forkserver")
_CPU_RANKS.set_forkserver_preload(_PRELOAD)


def spawn_params(world_sizes: tuple[int, ...], slow_sizes: tuple[int, ...] = ()) -> list:
    """``(backend, world_size)`` parameters: gloo at every size (marked ``slow`` at ``slow_sizes``), plus nccl (CUDA
    tensors; ranks share the GPUs over gloo where there are fewer GPUs than ranks) at every size marked ``gpu``.

    For ``pytest.mark.parametrize(..., indirect=True, scope="module")``, so that ``-m gpu`` selects the nccl
    runs (marks on fixture params are invisible to ``-m``).
    """
    params = [pytest.param(("gloo", w), id=f"gloo-w{w}", marks=[pytest.mark.slow] if w in slow_sizes else [])
              for w in world_sizes]
    return params + [pytest.param(("nccl", w), id=f"nccl-w{w}", marks=pytest.mark.gpu) for w in world_sizes]


@dataclass(frozen=True)
class RankInfo:
    """Where a spawned test function runs.

    Attributes:
        rank: this process's rank in the default group.
        world_size: number of ranks.
        backend: the process group's backend: ``"gloo"`` or ``"nccl"``.
        device: ``cpu`` for CPU gloo, ``cuda:rank`` for nccl, ``cuda:(rank % GPUs)`` for shared GPUs.
        shared_gpu: whether several ranks share a GPU through a gloo group (CUDA tensors over gloo).
    """

    rank: int
    world_size: int
    backend: str
    device: torch.device
    shared_gpu: bool = False

    def mesh(self) -> Any:
        """A 1-D device mesh over all ranks (explicit: ``fully_shard``'s default is CUDA on GPU hosts)."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(self.device.type, (self.world_size,))


def skip_unless_backend(backend: str, world_size: int) -> None:
    """Skip the calling test when ``backend`` cannot run ``world_size`` ranks here: CUDA ranks need one GPU at
    least (several ranks share it)."""
    if backend == "nccl" and torch.cuda.device_count() == 0:
        pytest.skip(f"CUDA ranks ({world_size}) need a GPU, found none")


def _rank_info(rank: int, world_size: int, backend: str) -> RankInfo:
    """Where rank ``rank`` runs: CPU for gloo; for ``"nccl"``, the GPU and group backend that
    :func:`composer_qsdp.shared_gpu.gpu_placement` picks for this host's GPU count."""
    if backend == "samedev":  # CUDA ranks sharing the GPUs through composer_qsdp.comm.same_device_pg
        return RankInfo(rank, world_size, backend, torch.device("cuda", 0), shared_gpu=True)  # one device a group
    if backend != "nccl":
        return RankInfo(rank, world_size, backend, torch.device("cpu"))
    from composer_qsdp.shared_gpu import gpu_placement

    placement = gpu_placement("auto", rank, world_size, torch.cuda.device_count())
    return RankInfo(rank, world_size, placement.backend, torch.device("cuda", placement.device_id),
                    placement.shared)


def _entry(rank: int, world_size: int, backend: str, init_file: str, fn: Callable, args: tuple, results,
           environ: dict[str, str]) -> None:
    import torch.distributed as dist

    try:
        # A forked rank inherits the server's environment, not the test's (which may have set variables since).
        os.environ.clear()
        os.environ.update(environ)
        torch.set_num_threads(1)
        # A parent test may have left a launcher's variables behind; Composer checks them against the group.
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
        if "samedev" in backend:
            from composer_qsdp.comm import register_same_device_backend

            register_same_device_backend()
        info = _rank_info(rank, world_size, backend)
        if info.device.type == "cuda":
            torch.cuda.set_device(info.device)
        dist.init_process_group(info.backend, init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                                device_id=info.device if info.backend == "nccl" else None)
        out = fn(info, *args)
        out = torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.detach().cpu().clone(), out)
        buf = io.BytesIO()
        torch.save(out, buf)  # bytes, not shared-memory handles, cross the queue
        results.put((rank, True, buf.getvalue()))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
    finally:
        # The queue's feeder thread sends the report: flush it before tearing the group down, which can block
        # this process (holding the interpreter) long enough that the parent times out with the report unsent.
        results.close()
        results.join_thread()
        if dist.is_initialized():
            dist.destroy_process_group()


def _death(rank: int, exitcode: int) -> str:
    """Why rank ``rank`` ended with ``exitcode`` (a negative code is the signal that killed it)."""
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = "unknown signal"
        return f"rank {rank} died with signal {-exitcode} ({name}) without reporting"
    return f"rank {rank} died with exit code {exitcode} without reporting"


def run_ranks(fn: Callable, world_size: int, *args: Any, backend: str = "gloo", timeout_s: float = 300) -> list:
    """Run ``fn(RankInfo, *args)`` on ``world_size`` spawned ranks and return their results by rank.

    A rank whose process ends without reporting (a segfault in a collective, ``os._exit``) fails the call at once,
    naming the rank and its exit code or signal; ``timeout_s`` bounds the wait for ranks that hang.

    Raises:
        RuntimeError: a rank raised (its traceback is in the message), died without reporting, or the ranks did
            not finish within ``timeout_s`` seconds.
    """
    ctx = mp.get_context("spawn") if backend in ("nccl", "samedev") else _CPU_RANKS
    results = ctx.Queue()
    environ = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "pg_init")
        procs = [
            ctx.Process(target=_entry, args=(r, world_size, backend, init_file, fn, args, results, environ),
                        daemon=True)
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        outputs: dict[int, Any] = {}
        failure: str | None = None
        deadline = time.monotonic() + timeout_s
        try:
            while len(outputs) < world_size and failure is None:
                try:
                    rank, ok, payload = results.get(timeout=_POLL_S)
                except queue.Empty:
                    # A rank puts its report before it exits, so a rank that has ended and has not reported (after
                    # one more look at the queue, which its last put may just have reached) never will.
                    dead = [r for r, p in enumerate(procs) if r not in outputs and p.exitcode is not None]
                    if dead:
                        try:
                            rank, ok, payload = results.get(timeout=_POLL_S)
                        except queue.Empty:
                            failure = "; ".join(_death(r, procs[r].exitcode) for r in dead)
                            break
                    elif time.monotonic() > deadline:
                        raise
                    else:
                        continue
                if ok:
                    outputs[rank] = torch.load(io.BytesIO(payload), weights_only=False)
                else:
                    failure = f"rank {rank} failed:\n{payload}"
        except queue.Empty:
            failure = f"ranks {sorted(set(range(world_size)) - set(outputs))} did not finish within {timeout_s} s"
        finally:
            for p in procs:
                p.join(timeout=5 if failure is None else 1)
                if p.is_alive():
                    p.kill()
                    p.join()
    if failure is not None:
        raise RuntimeError(failure)
    return [outputs[r] for r in range(world_size)]
