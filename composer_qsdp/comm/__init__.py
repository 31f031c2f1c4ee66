"""Quantized collectives over ``torch.distributed`` (NCCL or gloo), byte accounting, seeds and topology.

``quantized_all_gather`` and ``quantized_reduce_scatter`` have the semantics of ``all_gather_into_tensor``
and ``reduce_scatter_tensor`` but send :class:`~composer_qsdp.quant.Codec` wire buffers; ``plain_all_gather`` and
``plain_reduce_scatter`` are those collectives as FSDP issues them, with their byte counts (the unquantized path). ``StepSeeds`` is the
per-step noise schedule, ``Topology`` says which ranks share a node, and ``TrafficCounter``/``TrafficReport``
count bytes per rank (NCCL's convention) and per hop. Stateless: no FSDP, no Composer, no per-run state.
``two_level_reduce_scatter`` is the hierarchical reduce-scatter (ZeRO++ qgZ, SDP4Bit TLq-HS) over the intra- and
inter-node subgroups that ``node_groups`` creates once per process group and caches; ``twin_group`` is a second group
over a group's ranks, on which collectives run beside the group's own. ``destroy_process_groups`` ends a process's
groups so that it exits cleanly after gloo collectives. ``register_same_device_backend`` adds ``samedev``, the process
group of ranks sharing one GPU that exchange data through staging buffers on it (:mod:`.same_device_pg`).

``compressed_all_reduce`` is the error-feedback all-reduce of 1-bit/0-1 Adam; its caller owns the error buffers.
"""

from composer_qsdp.comm.accounting import CallTraffic, TrafficCounter, TrafficReport, call_traffic
from composer_qsdp.comm.all_gather import plain_all_gather, quantized_all_gather
from composer_qsdp.comm.node_groups import NodeGroups, node_groups
from composer_qsdp.comm.error_feedback import compressed_all_reduce, error_feedback_chunk_numel
from composer_qsdp.comm.quality import relative_error
from composer_qsdp.comm.reduce_scatter import plain_reduce_scatter, quantized_reduce_scatter
from composer_qsdp.comm.same_device_pg import register_same_device_backend
from composer_qsdp.comm.seeds import SeedStream, StepSeeds, mix_seed
from composer_qsdp.comm.segments import Segments
from composer_qsdp.comm.teardown import destroy_process_groups
from composer_qsdp.comm.topology import Topology
from composer_qsdp.comm.twin_groups import twin_group
from composer_qsdp.comm.two_level import two_level_reduce_scatter

__all__ = [
    "CallTraffic",
    "NodeGroups",
    "SeedStream",
    "Segments",
    "StepSeeds",
    "Topology",
    "TrafficCounter",
    "TrafficReport",
    "call_traffic",
    "compressed_all_reduce",
    "destroy_process_groups",
    "error_feedback_chunk_numel",
    "mix_seed",
    "node_groups",
    "plain_all_gather",
    "plain_reduce_scatter",
    "quantized_all_gather",
    "quantized_reduce_scatter",
    "relative_error",
    "twin_group",
    "two_level_reduce_scatter",
]
