"""The functional form of QSDP: ``apply_qsdp(model, config)`` on a model already sharded by FSDP2
(``fully_shard``) or FSDP1 (``FullyShardedDataParallel``), and ``remove_qsdp(model)``."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn as nn
from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

from composer_qsdp import fsdp1, fsdp2
from composer_qsdp.config import QSDPConfig
from composer_qsdp.engine import QSDPHandle

__all__ = ["apply_qsdp", "as_config", "remove_qsdp"]


def as_config(config: QSDPConfig | str) -> QSDPConfig:
    """``config`` itself, or the preset it names (:meth:`QSDPConfig.preset_names`).

    Raises:
        ValueError: neither a ``QSDPConfig`` nor a preset name, naming the allowed presets.
    """
    if isinstance(config, QSDPConfig):
        return config
    if isinstance(config, str):
        return QSDPConfig.from_preset(config)
    raise ValueError(f"config={config!r} is invalid; it must be a QSDPConfig or a preset name "
                     f"({', '.join(QSDPConfig.preset_names())})")


def apply_qsdp(
    model: nn.Module,
    config: QSDPConfig | str = "w8g8",
    *,
    optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None = None,
) -> QSDPHandle:
    """Quantize the weight all-gathers and gradient reduce-scatters of every FSDP unit of ``model``.

    Call after sharding (FSDP2's ``fully_shard`` or FSDP1's ``FullyShardedDataParallel``; the adapter is picked
    from the model) and before the first forward.

    Example::

        from composer_qsdp import QSDPConfig, apply_qsdp

        handle = apply_qsdp(model, QSDPConfig.from_preset("w8g4"), optimizers=optimizer)
        ...  # train
        print(handle.traffic().summary())

    Args:
        model: the sharded model.
        config: a :class:`~composer_qsdp.QSDPConfig` or a preset name.
        optimizers: the optimizers stepping ``model``'s parameters: their steps are QSDP's step boundary
            (schemes with per-step state need it). ``None``: the step of any ``torch.optim.Optimizer`` that holds
            one of ``model``'s parameters.

    Returns:
        The handle: ``traffic()``, ``state_dict()`` / ``load_state_dict()`` for checkpoints, ``remove()``.

    Raises:
        ValueError: ``model`` is not sharded by FSDP, or ``config`` is neither a config nor a preset name.
    """
    config = as_config(config)
    if any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
        return fsdp1.apply_qsdp(model, config, optimizers=optimizers)
    if any(isinstance(m, FSDPModule) for m in model.modules()):
        return fsdp2.apply_qsdp(model, config, optimizers=optimizers)
    raise ValueError(f"{type(model).__name__} is not sharded by FSDP: QSDP quantizes FSDP's collectives, so shard "
                     "it first (torch.distributed.fsdp.fully_shard, or FullyShardedDataParallel)")


def remove_qsdp(model: nn.Module) -> None:
    """Undo :func:`apply_qsdp`: FSDP's own collectives again, no hooks.

    Raises:
        ValueError: QSDP is not applied to ``model``.
    """
    QSDPHandle.remove_from(model)
