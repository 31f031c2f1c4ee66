"""QSDP: quantized FSDP2 weight all-gathers and gradient reduce-scatters (Markov et al., ICML 2023).

``QSDP`` is the Composer algorithm; ``apply_qsdp`` the functional form for a plain ``fully_shard`` model.
See ``README.md`` beside this file.
"""

from composer_qsdp.algorithms.qsdp.qsdp import QSDP, check_run
from composer_qsdp.fsdp import QSDPConfig, apply_qsdp, remove_qsdp

__all__ = ["QSDP", "QSDPConfig", "apply_qsdp", "check_run", "remove_qsdp"]
