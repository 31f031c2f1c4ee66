"""The FSDP1 adapter: QSDP on every flat-parameter unit of a ``FullyShardedDataParallel`` model (gradients
through FSDP1's communication hook, weights through its flat-parameter all-gather: :mod:`composer_qsdp.fsdp1.compat`).

::

    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    from composer_qsdp import QSDPConfig
    from composer_qsdp.fsdp1 import apply_qsdp

    model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}), use_orig_params=True)
    handle = apply_qsdp(model, QSDPConfig(), optimizers=optimizer)
    ...train...
    print(handle.traffic().summary())

Knows nothing of Composer or of FSDP2; the schemes it installs come from :mod:`composer_qsdp.engine`.
"""

from composer_qsdp.fsdp1.apply import FSDP1Handle, apply_qsdp, remove_qsdp
from composer_qsdp.fsdp1.units import find_units

__all__ = [
    "FSDP1Handle",
    "apply_qsdp",
    "find_units",
    "remove_qsdp",
]
