"""composer_qsdp: quantized FSDP communication (QSDP) for MosaicML Composer.

The public face::

    from composer_qsdp import QSDP, QSDPConfig, apply_qsdp

    config = QSDPConfig.from_preset("w8g4", exclude=["model.wte"])   # frozen, validated at construction
    Trainer(..., algorithms=[QSDP(config)])                          # the Composer algorithm
    handle = apply_qsdp(model, config, optimizers=opt)                # or on a model you sharded yourself

``SideConfig`` configures one side (weights or gradients); ``CodecOptions``, ``LearnedOptions``,
``DirectOptions``, ``DifferenceOptions``, ``FlatOptions``, ``LoCoOptions``, ``TwoLevelOptions`` and
``TwoLevelLoCoOptions`` are the typed options of the codecs and schemes. Names load on first access, so ``import composer_qsdp.quant`` never imports Composer.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "QSDP": "composer_qsdp.algorithms.qsdp",
    "apply_qsdp": "composer_qsdp.algorithms.qsdp",
    "remove_qsdp": "composer_qsdp.algorithms.qsdp",
    "QSDPConfig": "composer_qsdp.config",
    "SideConfig": "composer_qsdp.config",
    "CodecOptions": "composer_qsdp.config",
    "LearnedOptions": "composer_qsdp.config",
    "DirectOptions": "composer_qsdp.config",
    "DifferenceOptions": "composer_qsdp.config",
    "FlatOptions": "composer_qsdp.config",
    "LoCoOptions": "composer_qsdp.config",
    "TwoLevelOptions": "composer_qsdp.config",
    "TwoLevelLoCoOptions": "composer_qsdp.config",
}

__all__ = [
    "CodecOptions", "DifferenceOptions", "DirectOptions", "FlatOptions", "LearnedOptions", "LoCoOptions", "QSDP",
    "QSDPConfig",
    "SideConfig", "TwoLevelLoCoOptions", "TwoLevelOptions", "__version__", "apply_qsdp", "remove_qsdp",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'composer_qsdp' has no attribute {name!r}")
