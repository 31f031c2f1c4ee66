"""Triton kernels for the hot codecs, the wire format they share with the torch references, and the rule that
decides when they run.

The kernels compute the same numbers as the codecs' torch references (the ``quant`` layer above), bit for bit
(same Philox stream where rounding is random). :func:`use_triton` picks the backend: CUDA tensors go to Triton,
CPU tensors to the torch reference; :func:`backend` forces one. This package imports nothing from the other
``composer_qsdp`` subpackages.

Kernel modules (``minmax``, ``learned``, ``symmetric``, ``hadamard``) import ``triton`` at import time, so this
package imports them only on demand (``from composer_qsdp.kernels import minmax``); on a CPU machine they run under
the Triton interpreter when ``TRITON_INTERPRET=1`` was set before the import. Everything exported here needs torch
only.
"""

from composer_qsdp.kernels.dispatch import backend, use_triton
from composer_qsdp.kernels.wire_format import WireFormat, aligned_rows, bucket_wire_format, packed_bytes

__all__ = ["WireFormat", "aligned_rows", "backend", "bucket_wire_format", "packed_bytes", "use_triton"]
