"""What to quantize and how (``QSDPConfig``, ``SideConfig``, named presets, the per-unit plan, the automatic
bandwidth-aware policy), and the running state of QSDP on one model (``QSDPHandle``) that every framework adapter
drives.

Framework-agnostic: units are ``(name, module, numel)`` triples an adapter found; nothing here knows FSDP or
Composer.
"""

from composer_qsdp.policy.auto import Candidate, Decision, LinkFit, UnitProfile, decide
from composer_qsdp.policy.auto_runtime import POLICIES, AutoOptions, AutoPolicy, AutoRecord
from composer_qsdp.policy.config import ModuleFilter, QSDPConfig, SideConfig
from composer_qsdp.policy.finite_check import NonFiniteWeightError
from composer_qsdp.policy.handle import QSDPHandle, ResumeSettingsWarning
from composer_qsdp.policy.plan import Unit, UnitPlan, plan_units
from composer_qsdp.policy.presets import from_recipe, option_names, recipe_names

__all__ = [
    "AutoOptions",
    "AutoPolicy",
    "AutoRecord",
    "Candidate",
    "Decision",
    "LinkFit",
    "POLICIES",
    "UnitProfile",
    "decide",
    "ModuleFilter",
    "NonFiniteWeightError",
    "QSDPConfig",
    "QSDPHandle",
    "ResumeSettingsWarning",
    "SideConfig",
    "Unit",
    "UnitPlan",
    "from_recipe",
    "option_names",
    "plan_units",
    "recipe_names",
]
