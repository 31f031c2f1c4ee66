"""A DTensor's full value gathered with plain c10d collectives, for multi-rank tests that may run on CUDA over gloo.

``DTensor.full_tensor()`` and ``redistribute()`` all-gather through torch's functional collectives
(``torch.ops._c10d_functional.all_gather_into_tensor``), which reach the process group's
``allgather_into_tensor_coalesced``; gloo's implementation of that reads CUDA pointers as host memory and the
process dies with SIGSEGV (pytorch/pytorch#152645, also #132471), so ranks sharing a GPU over gloo
(:mod:`composer_qsdp.shared_gpu`) cannot call them. ``dist.all_gather_into_tensor`` carries CUDA tensors over gloo
correctly, and is what :func:`gather_full` uses.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard


def gather_full(tensor: torch.Tensor) -> torch.Tensor:
    """The full (global) value of ``tensor`` on every rank, a new tensor on its local device (collective over each
    sharded mesh dimension's group); a plain tensor comes back as a detached copy.

    Placements are ``Replicate`` or ``Shard(d)`` on each mesh dimension, sharded as ``torch.chunk`` does (the
    leading ranks hold ``ceil(n / W)`` rows, the last ones fewer or none), as ``fully_shard`` and
    ``distribute_tensor`` shard; several mesh dimensions may shard one tensor dimension (each splits the previous
    one's chunk).

    Raises:
        ValueError: a placement other than ``Replicate`` or ``Shard`` (e.g. ``Partial``), naming it.
    """
    if not isinstance(tensor, DTensor):
        return tensor.detach().clone()
    mesh, placements = tensor.device_mesh, tensor.placements
    for p in placements:
        if type(p) not in (Replicate, Shard):
            raise ValueError(f"gather_full: placement {p} of a DTensor of shape {tuple(tensor.shape)} is not "
                             "supported; allowed: Replicate, Shard(d)")
    # The size of each sharded tensor dimension before each mesh dimension splits it (this rank's chunk of the
    # outer splits), so that the gathers below undo the splits innermost first.
    sizes = list(tensor.shape)
    before: list[int] = []
    for mesh_dim, p in enumerate(placements):
        if isinstance(p, Shard):
            n, ways = sizes[p.dim], mesh.size(mesh_dim)
            chunk = math.ceil(n / ways)
            before.append(n)
            sizes[p.dim] = max(0, min(chunk, n - mesh.get_local_rank(mesh_dim) * chunk))
        else:
            before.append(-1)
    out = tensor.to_local().detach()
    for mesh_dim in reversed(range(len(placements))):
        p = placements[mesh_dim]
        if not isinstance(p, Shard):
            continue
        n, ways = before[mesh_dim], mesh.size(mesh_dim)
        chunk = math.ceil(n / ways)
        rows = out.movedim(p.dim, 0)
        padded = rows.new_zeros((chunk, *rows.shape[1:]))
        padded[:rows.shape[0]] = rows
        gathered = padded.new_empty((ways * chunk, *rows.shape[1:]))
        dist.all_gather_into_tensor(gathered, padded, group=mesh.get_group(mesh_dim))
        out = gathered[:n].movedim(0, p.dim)
    return out.clone(memory_format=torch.contiguous_format)
