"""Schemes: how one side's tensors move (see :mod:`composer_qsdp.schemes.base`).

Weights: ``"direct"`` (:class:`DirectAllGather`, QSDP). Gradients: ``"flat"`` (:class:`FlatReduceScatter`, QSDP /
one-hop qgZ). :func:`make_weight_scheme` / :func:`make_grad_scheme` build one by name; adapters and the policy only ever talk to
:class:`WeightScheme` / :class:`GradScheme`.

All-reduce (full replicas, DDP): ``"onebit"`` (:class:`OneBitAllReduce`, 0/1 Adam), built by
:func:`make_all_reduce_scheme`.
"""

from composer_qsdp.schemes.base import AllReduceScheme, GradScheme, Scheme, WeightScheme
from composer_qsdp.schemes.direct import DirectAllGather
from composer_qsdp.schemes.flat import FlatReduceScatter
from composer_qsdp.schemes.onebit import OneBitAllReduce
from composer_qsdp.schemes.registry import (
    ALL_REDUCE_SCHEMES,
    GRAD_SCHEMES,
    WEIGHT_SCHEMES,
    make_all_reduce_scheme,
    make_grad_scheme,
    make_weight_scheme,
)

__all__ = [
    "ALL_REDUCE_SCHEMES",
    "AllReduceScheme",
    "GRAD_SCHEMES",
    "WEIGHT_SCHEMES",
    "DirectAllGather",
    "FlatReduceScatter",
    "GradScheme",
    "OneBitAllReduce",
    "Scheme",
    "WeightScheme",
    "make_all_reduce_scheme",
    "make_grad_scheme",
    "make_weight_scheme",
]
