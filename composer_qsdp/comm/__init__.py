"""Quantized collectives over ``torch.distributed`` (NCCL or gloo), byte accounting, seeds and topology.

``quantized_all_gather`` and ``quantized_reduce_scatter`` have the semantics of ``all_gather_into_tensor``
and ``reduce_scatter_tensor`` but send :class:`~composer_qsdp.quant.Codec` wire buffers. ``StepSeeds`` is the
per-step noise schedule, ``Topology`` says which ranks share a node, and ``TrafficCounter``/``TrafficReport``
count bytes per rank (NCCL's convention) and per hop. Stateless: no FSDP, no Composer, no per-run state.

``compressed_all_reduce`` is the error-feedback all-reduce of 1-bit/0-1 Adam; its caller owns the error buffers.
"""

from composer_qsdp.comm.accounting import CallTraffic, TrafficCounter, TrafficReport, call_traffic
from composer_qsdp.comm.all_gather import quantized_all_gather
from composer_qsdp.comm.error_feedback import compressed_all_reduce, error_feedback_chunk_numel
from composer_qsdp.comm.quality import relative_error
from composer_qsdp.comm.reduce_scatter import is_average, quantized_reduce_scatter
from composer_qsdp.comm.seeds import SeedStream, StepSeeds, mix_seed
from composer_qsdp.comm.topology import Topology

__all__ = [
    "CallTraffic",
    "SeedStream",
    "StepSeeds",
    "Topology",
    "TrafficCounter",
    "TrafficReport",
    "call_traffic",
    "compressed_all_reduce",
    "error_feedback_chunk_numel",
    "is_average",
    "mix_seed",
    "quantized_all_gather",
    "quantized_reduce_scatter",
    "relative_error",
]
