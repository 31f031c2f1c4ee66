"""0/1 Adam for Composer DDP runs (Lu et al., ICLR 2023).

``ZeroOneAdamDDP`` is the Composer algorithm; ``apply_zero_one_adam`` the functional form for a plain
``DistributedDataParallel`` model; ``ZeroOneAdam`` the optimizer. See ``README.md`` beside this file.
"""

from composer_qsdp.algorithms.zero_one_adam.zero_one_adam import ZeroOneAdamDDP, to_zero_one_adam
from composer_qsdp.ddp import apply_zero_one_adam
from composer_qsdp.optim import ZeroOneAdam

__all__ = ["ZeroOneAdam", "ZeroOneAdamDDP", "apply_zero_one_adam", "to_zero_one_adam"]
