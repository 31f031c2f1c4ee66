"""The running state of QSDP on one model (``QSDPHandle``) that every framework adapter drives: the per-unit
plan, seeds, the step boundary, the finite-weight check and checkpointed settings.

Framework-agnostic: units are ``(name, module, numel)`` triples an adapter found; nothing here knows FSDP or
Composer.
"""

from composer_qsdp.engine.finite_check import NonFiniteWeightError
from composer_qsdp.engine.handle import QSDPHandle, ResumeSettingsWarning
from composer_qsdp.engine.plan import Unit, UnitPlan, plan_units
from composer_qsdp.engine.speculation import SpeculationStats, SpeculativeUpdate

__all__ = ["NonFiniteWeightError", "QSDPHandle", "ResumeSettingsWarning", "SpeculationStats", "SpeculativeUpdate",
           "Unit", "UnitPlan", "plan_units"]
