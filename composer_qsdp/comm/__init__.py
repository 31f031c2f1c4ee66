"""Quantized collectives over ``torch.distributed`` (NCCL or gloo) and their byte accounting.

``quantized_all_gather`` and ``quantized_reduce_scatter`` have the semantics of ``all_gather_into_tensor``
and ``reduce_scatter_tensor`` but send :class:`~composer_qsdp.quant.Codec` wire buffers. Knows nothing of FSDP.
"""

from composer_qsdp.comm.accounting import CallTraffic, TrafficCounter, call_traffic
from composer_qsdp.comm.all_gather import quantized_all_gather
from composer_qsdp.comm.quality import relative_error
from composer_qsdp.comm.reduce_scatter import is_average, quantized_reduce_scatter
from composer_qsdp.comm.seeds import mix_seed

__all__ = [
    "CallTraffic",
    "TrafficCounter",
    "call_traffic",
    "is_average",
    "mix_seed",
    "quantized_all_gather",
    "quantized_reduce_scatter",
    "relative_error",
]
