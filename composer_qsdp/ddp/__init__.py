"""DDP adapter: plain data parallelism (``DistributedDataParallel``) for optimizers that communicate themselves.

``keep_local_gradients`` is a DDP comm hook that leaves every rank's gradient local (DDP all-reduces nothing);
:func:`apply_zero_one_adam` installs it on a DDP model trained with :class:`~composer_qsdp.optim.ZeroOneAdam`.
"""

from composer_qsdp.ddp.apply import apply_zero_one_adam, check_not_sharded
from composer_qsdp.ddp.hooks import LocalGradients, keep_local_gradients

__all__ = ["LocalGradients", "apply_zero_one_adam", "check_not_sharded", "keep_local_gradients"]
