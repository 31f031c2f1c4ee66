"""QSDP: quantized FSDP weight all-gathers and gradient reduce-scatters (Markov et al., ICML 2023).

``QSDP`` is the Composer algorithm (FSDP2 or FSDP1, picked from the run); ``apply_qsdp`` the functional form for a
plain ``fully_shard`` model (``composer_qsdp.fsdp1.apply_qsdp`` for a ``FullyShardedDataParallel`` one).
See ``README.md`` beside this file.
"""

from composer_qsdp.algorithms.qsdp.qsdp import QSDP, RECIPE, check_run, per_block_fsdp_units
from composer_qsdp.fsdp2 import apply_qsdp, remove_qsdp
from composer_qsdp.policy import QSDPConfig, SideConfig, from_recipe

__all__ = ["QSDP", "RECIPE", "QSDPConfig", "SideConfig", "apply_qsdp", "check_run", "from_recipe",
           "per_block_fsdp_units", "remove_qsdp"]
