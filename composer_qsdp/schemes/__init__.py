"""Schemes: how one side's tensors move (see :mod:`composer_qsdp.schemes.base`).

Weights: ``"direct"`` (:class:`DirectAllGather`, QSDP), ``"difference"`` (:class:`DifferenceAllGather`, SDP4Bit's
qWD). Gradients: ``"flat"`` (:class:`FlatReduceScatter`, QSDP / one-hop qgZ), ``"two_level"``
(:class:`TwoLevelReduceScatter`: ZeRO++ qgZ, SDP4Bit TLq-HS), ``"loco"`` (:class:`LoCoReduceScatter`: the flat one
with LoCo's error feedback), ``"two_level_loco"`` (:class:`TwoLevelLoCoReduceScatter`: the two-level one with LoCo's
error feedback on the inter-node hop). All-reduce (full replicas, DDP): ``"onebit"``
(:class:`OneBitAllReduce`, 0/1 Adam). :func:`make_weight_scheme`, :func:`make_grad_scheme` and
:func:`make_all_reduce_scheme` build one by name (:mod:`composer_qsdp.registry` holds the names);
:func:`build_scheme` builds a unit's scheme and codec from one side's settings, once per unit at install. Adapters
and the policy only ever talk to the base classes.
"""

from composer_qsdp.schemes.base import AllReduceScheme, GatherLayout, GradScheme, Scheme, WeightScheme
from composer_qsdp.schemes.difference import DifferenceAllGather, ShardedReferenceWarning
from composer_qsdp.schemes.direct import DirectAllGather
from composer_qsdp.schemes.flat import FlatReduceScatter
from composer_qsdp.schemes.loco import LoCoReduceScatter, LoCoResidualWarning
from composer_qsdp.schemes.onebit import OneBitAllReduce
from composer_qsdp.schemes.build import (SideSettings, build_codec, build_scheme, make_all_reduce_scheme,
                                         make_grad_scheme, make_weight_scheme)
from composer_qsdp.schemes.two_level import TwoLevelReduceScatter
from composer_qsdp.schemes.two_level_loco import TwoLevelLoCoReduceScatter

__all__ = [
    "AllReduceScheme",
    "DifferenceAllGather",
    "DirectAllGather",
    "FlatReduceScatter",
    "GatherLayout",
    "GradScheme",
    "LoCoReduceScatter",
    "LoCoResidualWarning",
    "OneBitAllReduce",
    "Scheme",
    "SideSettings",
    "ShardedReferenceWarning",
    "TwoLevelLoCoReduceScatter",
    "TwoLevelReduceScatter",
    "WeightScheme",
    "build_codec",
    "build_scheme",
    "make_all_reduce_scheme",
    "make_grad_scheme",
    "make_weight_scheme",
]
