"""The automatic, bandwidth-aware choice of codec per unit: the pure decision (``choice``) and the runtime that
probes the network and reconfigures a :class:`~composer_qsdp.engine.QSDPHandle` (``runtime``)."""

from composer_qsdp.auto.choice import Candidate, Decision, LinkFit, UnitProfile, decide
from composer_qsdp.auto.runtime import AutoPolicy, AutoRecord
from composer_qsdp.config.options import AutoOptions

__all__ = ["AutoOptions", "AutoPolicy", "AutoRecord", "Candidate", "Decision", "LinkFit", "UnitProfile", "decide"]
