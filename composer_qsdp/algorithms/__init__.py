"""Composer algorithms of composer_qsdp (each in its own subpackage, Composer-style)."""

from composer_qsdp.algorithms.qsdp import QSDP, apply_qsdp

__all__ = ["QSDP", "apply_qsdp"]
