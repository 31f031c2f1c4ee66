"""DDP adapter: plain data parallelism (``DistributedDataParallel``) for optimizers that communicate themselves.

:func:`apply_zero_one_adam` installs a DDP comm hook that leaves every rank's gradient local (DDP all-reduces
nothing; :class:`LocalGradients` is its state) on a DDP model trained with :class:`~composer_qsdp.optim.ZeroOneAdam`.
"""

from composer_qsdp.ddp.apply import apply_zero_one_adam, check_not_sharded
from composer_qsdp.ddp.hooks import LocalGradients

__all__ = ["LocalGradients", "apply_zero_one_adam", "check_not_sharded"]
