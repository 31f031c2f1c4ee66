"""Scheme names: one :class:`~composer_qsdp.registry.Registry` per side maps a configuration's ``scheme`` to a
class; the first name registered is the side's default."""

from __future__ import annotations

from typing import Any, TypeVar

from composer_qsdp.quant import Codec
from composer_qsdp.registry import Registry
from composer_qsdp.schemes.base import AllReduceScheme, GradScheme, Scheme, WeightScheme

__all__ = [
    "ALL_REDUCE_SCHEMES", "GRAD_SCHEMES", "WEIGHT_SCHEMES", "make_all_reduce_scheme", "make_grad_scheme",
    "make_weight_scheme",
]

#: Weight all-gather schemes by name; the first is the default.
WEIGHT_SCHEMES: Registry[type[WeightScheme]] = Registry("weight scheme")
WEIGHT_SCHEMES.register("direct", "composer_qsdp.schemes.direct:DirectAllGather")
WEIGHT_SCHEMES.register("difference", "composer_qsdp.schemes.difference:DifferenceAllGather")
#: Gradient reduce-scatter schemes by name; the first is the default.
GRAD_SCHEMES: Registry[type[GradScheme]] = Registry("grad scheme")
GRAD_SCHEMES.register("flat", "composer_qsdp.schemes.flat:FlatReduceScatter")
GRAD_SCHEMES.register("two_level", "composer_qsdp.schemes.two_level:TwoLevelReduceScatter")
GRAD_SCHEMES.register("loco", "composer_qsdp.schemes.loco:LoCoReduceScatter")
GRAD_SCHEMES.register("two_level_loco", "composer_qsdp.schemes.two_level_loco:TwoLevelLoCoReduceScatter")
#: All-reduce schemes (full replicas: DDP) by name; the first is the default.
ALL_REDUCE_SCHEMES: Registry[type[AllReduceScheme]] = Registry("all-reduce scheme")
ALL_REDUCE_SCHEMES.register("onebit", "composer_qsdp.schemes.onebit:OneBitAllReduce")

_S = TypeVar("_S", bound=Scheme)


def make_weight_scheme(name: str, codec: Codec | None, error_sample_interval: int = 0, **options: Any) -> WeightScheme:
    """Build the weight scheme ``name`` around ``codec`` (``None``: unquantized).

    Raises:
        ValueError: an unknown scheme or scheme option, naming it and what is allowed.
    """
    return _build(WEIGHT_SCHEMES, name, codec, error_sample_interval, options)


def make_grad_scheme(name: str, codec: Codec | None, error_sample_interval: int = 0, **options: Any) -> GradScheme:
    """Build the gradient scheme ``name`` around ``codec`` (``None``: unquantized).

    Raises:
        ValueError: an unknown scheme or scheme option, naming it and what is allowed.
    """
    return _build(GRAD_SCHEMES, name, codec, error_sample_interval, options)


def make_all_reduce_scheme(name: str, codec: Codec | None, **options: Any) -> AllReduceScheme:
    """Build the all-reduce scheme ``name`` around ``codec`` (``None``: unquantized).

    Raises:
        ValueError: an unknown scheme or scheme option, naming it and what is allowed.
    """
    return _build(ALL_REDUCE_SCHEMES, name, codec, 0, options)


def _build(registry: Registry[type[_S]], name: str, codec: Codec | None, interval: int, options: dict[str, Any]) -> _S:
    cls = registry.lookup(name)
    try:
        return cls(codec, interval, **options)
    except TypeError as err:  # an unknown keyword: the documented ValueError instead
        raise ValueError(f"invalid option for the {registry.kind} {name!r}: {err}") from None
