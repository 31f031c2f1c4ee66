"""composer_qsdp: quantized FSDP communication (QSDP) for MosaicML Composer.

Top-level names::

    from composer_qsdp import QSDP                      # the Composer algorithm
    from composer_qsdp import apply_qsdp, remove_qsdp   # functional form for a plain fully_shard model
    from composer_qsdp import QSDPConfig, SideConfig    # the settings apply_qsdp takes
    from composer_qsdp import from_recipe               # a QSDPConfig from a named preset

They load on first access, so ``import composer_qsdp.quant`` (codecs, kernels) never imports Composer.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "QSDP": "composer_qsdp.algorithms.qsdp",
    "apply_qsdp": "composer_qsdp.fsdp2",
    "remove_qsdp": "composer_qsdp.fsdp2",
    "QSDPConfig": "composer_qsdp.config",
    "SideConfig": "composer_qsdp.config",
    "from_recipe": "composer_qsdp.config",
}

__all__ = ["QSDP", "QSDPConfig", "SideConfig", "__version__", "apply_qsdp", "from_recipe", "remove_qsdp"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'composer_qsdp' has no attribute {name!r}")
