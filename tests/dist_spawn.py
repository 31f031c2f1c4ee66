"""Run a test function on W spawned processes joined by a real ``torch.distributed`` process group.

``run_ranks(fn, world_size, *args, backend=...)`` spawns ``world_size`` processes; rank ``r`` runs
``fn(RankInfo, *args)`` inside an initialized default group and the call returns every rank's result (tensors
moved to CPU), or raises with the failing rank's traceback. ``backend`` is ``"gloo"`` (CPU tensors) or
``"nccl"`` (one GPU per rank, ``cuda:r``). ``fn`` must be a module-level function of an importable module.
Test modules parametrize a module-scoped fixture with :func:`spawn_params` to run once per backend and size.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import queue
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch



def spawn_params(world_sizes: tuple[int, ...], slow_sizes: tuple[int, ...] = ()) -> list:
    """``(backend, world_size)`` parameters: gloo at every size (marked ``slow`` at ``slow_sizes``), plus nccl at
    every size marked ``gpu``.

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
        backend: ``"gloo"`` or ``"nccl"``.
        device: ``cpu`` for gloo, ``cuda:rank`` for nccl.
    """

    rank: int
    world_size: int
    backend: str
    device: torch.device

    def mesh(self) -> Any:
        """A 1-D device mesh over all ranks (explicit: ``fully_shard``'s default is CUDA on GPU hosts)."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(self.device.type, (self.world_size,))


def skip_unless_backend(backend: str, world_size: int) -> None:
    """Skip the calling test when ``backend`` cannot run ``world_size`` ranks here."""
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        pytest.skip(f"nccl with {world_size} ranks needs {world_size} GPUs, found {torch.cuda.device_count()}")


def _entry(rank: int, world_size: int, backend: str, init_file: str, fn: Callable, args: tuple, results) -> None:
    import torch.distributed as dist

    try:
        torch.set_num_threads(1)
        # A parent test may have left a launcher's variables behind; Composer checks them against the group.
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
        if backend == "nccl":
            torch.cuda.set_device(rank)
            device = torch.device("cuda", rank)
        else:
            device = torch.device("cpu")
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                                device_id=device if backend == "nccl" else None)
        out = fn(RankInfo(rank, world_size, backend, device), *args)
        out = torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.detach().cpu().clone(), out)
        buf = io.BytesIO()
        torch.save(out, buf)  # bytes, not shared-memory handles, cross the queue
        results.put((rank, True, buf.getvalue()))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(fn: Callable, world_size: int, *args: Any, backend: str = "gloo", timeout_s: float = 300) -> list:
    """Run ``fn(RankInfo, *args)`` on ``world_size`` spawned ranks and return their results by rank.

    Raises:
        RuntimeError: a rank raised (its traceback is in the message) or the ranks did not finish in time.
    """
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "pg_init")
        procs = [
            ctx.Process(target=_entry, args=(r, world_size, backend, init_file, fn, args, results), daemon=True)
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        outputs: dict[int, Any] = {}
        failure: str | None = None
        try:
            while len(outputs) < world_size and failure is None:
                rank, ok, payload = results.get(timeout=timeout_s)
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
