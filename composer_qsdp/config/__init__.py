"""What to quantize and how: ``QSDPConfig`` (one ``SideConfig`` per side), the typed options of each codec and
scheme and of the automatic policy, and the named presets (``QSDPConfig.from_preset``).

Pure settings, validated at construction; nothing here builds a scheme, installs anything or knows FSDP or
Composer (:func:`composer_qsdp.schemes.build_scheme` builds each unit's schemes from a config when QSDP installs).
"""

from composer_qsdp.config.options import (AutoOptions, CodecOptions, DifferenceOptions, DirectOptions, FlatOptions,
                                          LearnedOptions, LoCoOptions, TwoLevelLoCoOptions, TwoLevelOptions)
from composer_qsdp.config.settings import (LowBitGradientWarning, ModuleFilter, QSDPConfig, SideConfig, from_preset,
                                           option_names, preset_names)

__all__ = [
    "AutoOptions", "CodecOptions", "DifferenceOptions", "DirectOptions", "FlatOptions", "LearnedOptions", "LoCoOptions",
    "LowBitGradientWarning", "ModuleFilter",
    "QSDPConfig", "SideConfig", "TwoLevelLoCoOptions", "TwoLevelOptions", "from_preset", "option_names", "preset_names",
]
