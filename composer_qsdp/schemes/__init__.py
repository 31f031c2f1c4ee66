"""Schemes: how one side's tensors move (see :mod:`composer_qsdp.schemes.base`).

Weights: ``"direct"`` (:class:`DirectAllGather`, QSDP), ``"difference"`` (:class:`DifferenceAllGather`,
SDP4Bit's qWD). Gradients: ``"flat"`` (:class:`FlatReduceScatter`, QSDP /
one-hop qgZ). :func:`make_weight_scheme` / :func:`make_grad_scheme` build one by name; adapters and the policy only ever talk to
:class:`WeightScheme` / :class:`GradScheme`.
Gradients also: ``"two_level"`` (:class:`TwoLevelReduceScatter`: ZeRO++ qgZ, SDP4Bit TLq-HS).
"""

from composer_qsdp.schemes.base import GatherLayout, GradScheme, Scheme, WeightScheme
from composer_qsdp.schemes.difference import DifferenceAllGather
from composer_qsdp.schemes.direct import DirectAllGather
from composer_qsdp.schemes.flat import FlatReduceScatter
from composer_qsdp.schemes.registry import GRAD_SCHEMES, WEIGHT_SCHEMES, make_grad_scheme, make_weight_scheme
from composer_qsdp.schemes.two_level import TwoLevelReduceScatter

__all__ = [
    "GRAD_SCHEMES",
    "WEIGHT_SCHEMES",
    "DifferenceAllGather",
    "DirectAllGather",
    "GatherLayout",
    "FlatReduceScatter",
    "GradScheme",
    "Scheme",
    "TwoLevelReduceScatter",
    "WeightScheme",
    "make_grad_scheme",
    "make_weight_scheme",
]
