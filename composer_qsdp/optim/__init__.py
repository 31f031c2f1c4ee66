"""Optimizers that communicate: ``ZeroOneAdam`` (0/1 Adam) for plain data parallelism.

The optimizer owns the synchronization of the replicas (through :mod:`composer_qsdp.schemes`); the DDP adapter
(:mod:`composer_qsdp.ddp`) keeps DDP from all-reducing the gradients itself.
"""

from composer_qsdp.optim.schedule import SchedulePlan, ScheduledStep, ZeroOneSchedule
from composer_qsdp.optim.zero_one_adam import ZeroOneAdam
from composer_qsdp.optim.zero_one_options import default_bucket_size

__all__ = ["SchedulePlan", "ScheduledStep", "ZeroOneAdam", "ZeroOneSchedule", "default_bucket_size"]
