"""HSDP (a 2-D replicate x shard mesh): what QSDP can and cannot quantize there, said once at install.

FSDP2 (torch 2.9-2.11, ``_fsdp_collectives.foreach_reduce``) reduces an HSDP unit's gradients in two steps: the
reduce-scatter over the shard group, through the unit's ``ReduceScatter`` comm object (QSDP's), then
``torch.distributed.all_reduce`` of the reduced shard over the replicate group, called directly in the reduce
dtype. No comm object reaches that all-reduce; ``set_all_reduce_hook`` receives its *output*, after the bytes
have crossed; ``set_requires_all_reduce(False)`` only defers it (the shards accumulate unassigned until an
all-reducing backward). So QSDP quantizes the shard group's collectives, and the replicate all-reduce, which
is the one that crosses nodes when the shard group is a node, stays in full precision.
"""

from __future__ import annotations

from collections.abc import Sequence

from composer_qsdp.comm import Topology
from composer_qsdp.fsdp2.units import managed_parameters
from composer_qsdp.engine import Unit

__all__ = ["hsdp_note"]


def hsdp_note(units: Sequence[Unit], topology: Topology) -> str | None:
    """The warning for units sharded on a 2-D (HSDP) mesh, or ``None`` when every unit's mesh is 1-D.

    Args:
        units: the FSDP2 units QSDP manages.
        topology: the run's topology (to say whether the replicas sit on different nodes).
    """
    meshes = [managed_parameters(u.module)[0].device_mesh for u in units]
    hsdp = [mesh for mesh in meshes if mesh.ndim == 2]
    if not hsdp:
        return None
    mesh = hsdp[0]
    replicate = mesh.get_group(0)
    where = "across nodes" if topology.off_node_peers(replicate) else "within a node"
    return (
        f"HSDP: {len(hsdp)} of {len(units)} FSDP units are replicated {mesh.size(0)} times ({where}) and sharded "
        f"{mesh.size(1)} ways. FSDP2 all-reduces their gradient shards over the replicate group itself "
        "(torch.distributed.all_reduce in the reduce dtype, outside the custom-collective API; set_all_reduce_hook "
        "only sees the result), so QSDP quantizes the shard group's collectives only and its byte counts leave "
        "that all-reduce out. To quantize the cross-node gradient traffic, shard over all ranks (a 1-D mesh) with "
        "the two-level gradient scheme (QSDP('tlq-hs') or QSDP('zeropp')) and reshard_after_forward=<ranks per "
        f"node> ({topology.ranks_per_node} here; ZeRO++'s hpZ), which keeps the backward weight gather inside the "
        "node as HSDP does."
    )
