"""QSDP: quantized FSDP weight all-gathers and gradient reduce-scatters (Markov et al., ICML 2023).

``QSDP`` is the Composer algorithm (FSDP2 or FSDP1, picked from the run); ``apply_qsdp`` the functional form for a
model sharded by FSDP2 or FSDP1 (picked from the model). Both take a ``QSDPConfig`` or a preset name;
``QSDPFromYaml`` is what yaml recipes' ``algorithms: {qsdp: {...}}`` build through. See
``README.md`` beside this file.
"""

from composer_qsdp.algorithms.qsdp.functional import apply_qsdp, remove_qsdp
from composer_qsdp.algorithms.qsdp.qsdp import QSDP, QSDPFromYaml, QSDPResiduals, check_run, per_block_fsdp_units

__all__ = ["QSDP", "QSDPFromYaml", "QSDPResiduals", "apply_qsdp", "check_run", "per_block_fsdp_units", "remove_qsdp"]
