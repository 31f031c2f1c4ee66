"""Composer algorithms of composer_qsdp (each in its own subpackage, Composer-style)."""

from composer_qsdp.algorithms.qsdp import QSDP, apply_qsdp
from composer_qsdp.algorithms.zero_one_adam import ZeroOneAdamDDP, apply_zero_one_adam

__all__ = ["QSDP", "ZeroOneAdamDDP", "apply_qsdp", "apply_zero_one_adam"]
