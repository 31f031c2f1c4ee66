"""FSDP2 integration: quantized comm objects on every ``fully_shard`` unit, per-unit policy, per-step seeds.

Needs torch >= 2.9 (``FSDPModule.set_custom_all_gather`` / ``set_custom_reduce_scatter``)::

    from torch.distributed.fsdp import fully_shard
    from composer_qsdp.fsdp import QSDPConfig, apply_qsdp

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    handle = apply_qsdp(model, QSDPConfig(weight_bits=8, grad_bits=8))
    ...train...
    print(handle.traffic().summary())

Knows nothing of Composer.
"""

from composer_qsdp.fsdp.apply import QSDPHandle, apply_qsdp, check_custom_comm_support, remove_qsdp
from composer_qsdp.fsdp.comms import QSDPAllGather, QSDPReduceScatter
from composer_qsdp.fsdp.config import QSDPConfig
from composer_qsdp.fsdp.finite_check import NonFiniteWeightError
from composer_qsdp.fsdp.policy import UnitPlan, plan_units
from composer_qsdp.fsdp.report import TrafficReport

__all__ = [
    "NonFiniteWeightError",
    "QSDPAllGather",
    "QSDPConfig",
    "QSDPHandle",
    "QSDPReduceScatter",
    "TrafficReport",
    "UnitPlan",
    "apply_qsdp",
    "check_custom_comm_support",
    "plan_units",
    "remove_qsdp",
]
