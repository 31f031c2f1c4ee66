"""Triton kernels for the hot codecs, and the rule that decides when they run.

The kernels compute the same numbers as the torch references in :mod:`composer_qsdp.quant`, bit for bit
(same Philox stream where rounding is random). :mod:`composer_qsdp.kernels.dispatch` picks the backend:
CUDA tensors go to Triton, CPU tensors to the torch reference. Kernel modules import ``triton`` at import
time, so this package only imports them on demand; on a CPU machine they run under the Triton interpreter
when ``TRITON_INTERPRET=1`` was set before the import.
"""

from composer_qsdp.kernels.dispatch import backend, triton_available, use_triton

__all__ = ["backend", "triton_available", "use_triton"]
