"""What to quantize and how: ``QSDPConfig`` (one ``SideConfig`` per side) and the named presets.

Pure settings, validated at construction; nothing here installs anything or knows FSDP or Composer.
"""

from composer_qsdp.config.presets import from_recipe, option_names, recipe_names
from composer_qsdp.config.settings import ModuleFilter, QSDPConfig, SideConfig

__all__ = ["ModuleFilter", "QSDPConfig", "SideConfig", "from_recipe", "option_names", "recipe_names"]
