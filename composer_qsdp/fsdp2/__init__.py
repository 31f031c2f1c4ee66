"""The FSDP2 adapter: QSDP's comm objects on every ``fully_shard`` unit (through FSDP2's custom collectives on torch
>= 2.9, or a proxy for its internal collective calls on torch 2.6-2.8: :mod:`composer_qsdp.fsdp2.compat`).

::

    from torch.distributed.fsdp import fully_shard
    from composer_qsdp import QSDPConfig, apply_qsdp

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    handle = apply_qsdp(model, QSDPConfig(), optimizers=optimizer)
    ...train...
    print(handle.traffic().summary())

Knows nothing of Composer; the schemes it installs come from :mod:`composer_qsdp.engine`.
"""

from composer_qsdp.fsdp2.apply import FSDP2Handle, apply_qsdp, remove_qsdp
from composer_qsdp.fsdp2.compat import HAS_CUSTOM_COMM_API, check_custom_comm_support, default_comm_path
from composer_qsdp.fsdp2.units import find_units, shard_group

__all__ = [
    "FSDP2Handle",
    "HAS_CUSTOM_COMM_API",
    "apply_qsdp",
    "check_custom_comm_support",
    "default_comm_path",
    "find_units",
    "remove_qsdp",
    "shard_group",
]
