"""``RankMemory``: every rank's peak device memory and the memory QSDP's schemes keep, one JSON file per rank.

Composer's ``memory_monitor`` logs each process's memory, and the metrics file keeps process 0's; a memory model is
checked per rank. This callback (``callbacks: {rank_memory: {out_dir: DIR}}``) rewrites ``DIR/rank_memory-rank<r>.json``
at the end of every batch (written whole, then renamed) with:

* ``peak_allocated_bytes`` / ``peak_reserved_bytes``: ``torch.cuda.max_memory_allocated()`` /
  ``max_memory_reserved()`` of this process since it started; ``None`` off the GPU. They count this process's own
  caching allocator, so each of several ranks sharing one GPU (``shared_gpu``) reads its own, where the device's
  free memory would mix them all; CUDA contexts and communication libraries' buffers are not in them;
* ``peak_allocated_by_batch``: the same after each finished batch, so a reader sees in which batch the peak was
  reached;
* ``scheme_memory_bytes``: the device bytes QSDP's schemes keep on this rank (``QSDPHandle.memory_bytes()``, logged
  as ``qsdp/scheme_memory_bytes``), and ``scheme_memory_by_side``: the same for the weights and the gradients;
* ``scheme_host_memory_bytes``: the host bytes the schemes keep in place of device memory (a weight-difference
  reference with ``reference_on_host``; ``QSDPHandle.host_memory_bytes()``, logged as
  ``qsdp/scheme_host_memory_bytes``);
* ``params``: the model's parameters (unsharded elements), and ``quantized_params``: for each side, the parameters of
  the units whose side QSDP quantizes (the ``P`` of ``docs/presets.md``'s memory table; 0 without QSDP);
* ``rank``, ``world_size``, ``device`` and ``batches`` (finished).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from composer.core import Callback, State
from composer.loggers import Logger

__all__ = ["RankMemory", "scheme_memory"]

_SIDES = ("weights", "grads")


def _handles(state: State) -> list[Any]:
    """The QSDP handles of ``state``'s algorithms (none without QSDP, or before QSDP installed)."""
    return [h for h in (getattr(a, "handle", None) for a in state.algorithms) if h is not None]


def _units(state: State) -> list[Any]:
    return [unit for handle in _handles(state) for unit in handle.units]


def scheme_memory(state: State) -> dict[str, int]:
    """Device bytes QSDP's schemes keep between steps on this rank, by side (0 without QSDP)."""
    return {side: sum(getattr(unit, side).memory_bytes() for unit in _units(state)) for side in _SIDES}


class RankMemory(Callback):
    """Write this rank's memory record at the end of every batch (module docstring).

    Args:
        out_dir: folder of ``rank_memory-rank<r>.json`` (created).
    """

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)
        self._by_batch: list[int] = []

    def batch_end(self, state: State, logger: Logger) -> None:
        joined = dist.is_available() and dist.is_initialized()
        rank = dist.get_rank() if joined else 0
        params = list(state.model.parameters())
        device = params[0].device if params else torch.device("cpu")
        gpu = device.type == "cuda"
        peak = torch.cuda.max_memory_allocated(device) if gpu else None
        if peak is not None:
            self._by_batch.append(peak)
        units = _units(state)
        record = {
            "rank": rank, "world_size": dist.get_world_size() if joined else 1, "device": str(device),
            "batches": int(state.timestamp.batch),
            "peak_allocated_bytes": peak,
            "peak_reserved_bytes": torch.cuda.max_memory_reserved(device) if gpu else None,
            "peak_allocated_by_batch": self._by_batch if gpu else None,
            "scheme_memory_bytes": sum(h.memory_bytes() for h in _handles(state)),
            "scheme_host_memory_bytes": sum(h.host_memory_bytes() for h in _handles(state)),
            "scheme_memory_by_side": scheme_memory(state),
            # DTensor parameters (FSDP2) count their global, unsharded elements.
            "params": sum(p.numel() for p in params),
            "quantized_params": {side: sum(u.numel for u in units if getattr(u, side).codec is not None)
                                 for side in _SIDES},
        }
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"rank_memory-rank{rank}.json"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(record, indent=1))
        tmp.replace(path)
