"""Scheme names: the one table per side that maps a configuration's ``scheme`` to a class."""

from __future__ import annotations

from typing import Any, TypeVar

from composer_qsdp.quant import Codec
from composer_qsdp.schemes.base import AllReduceScheme, GradScheme, Scheme, WeightScheme
from composer_qsdp.schemes.direct import DirectAllGather
from composer_qsdp.schemes.flat import FlatReduceScatter
from composer_qsdp.schemes.onebit import OneBitAllReduce

__all__ = [
    "ALL_REDUCE_SCHEMES", "GRAD_SCHEMES", "WEIGHT_SCHEMES", "make_all_reduce_scheme", "make_grad_scheme",
    "make_weight_scheme",
]

#: Weight all-gather schemes by name; the first is the default.
WEIGHT_SCHEMES: dict[str, type[WeightScheme]] = {"direct": DirectAllGather}
#: Gradient reduce-scatter schemes by name; the first is the default.
GRAD_SCHEMES: dict[str, type[GradScheme]] = {"flat": FlatReduceScatter}
#: All-reduce schemes (full replicas: DDP) by name; the first is the default.
ALL_REDUCE_SCHEMES: dict[str, type[AllReduceScheme]] = {"onebit": OneBitAllReduce}

_S = TypeVar("_S", bound=Scheme)


def make_weight_scheme(name: str, codec: Codec | None, error_sample_interval: int = 0, **options: Any) -> WeightScheme:
    """Build the weight scheme ``name`` around ``codec`` (``None``: unquantized).

    Raises:
        ValueError: an unknown scheme or scheme option, naming it and what is allowed.
    """
    return _build(WEIGHT_SCHEMES, "weight", name, codec, error_sample_interval, options)


def make_grad_scheme(name: str, codec: Codec | None, error_sample_interval: int = 0, **options: Any) -> GradScheme:
    """Build the gradient scheme ``name`` around ``codec`` (``None``: unquantized).

    Raises:
        ValueError: an unknown scheme or scheme option, naming it and what is allowed.
    """
    return _build(GRAD_SCHEMES, "grad", name, codec, error_sample_interval, options)


def make_all_reduce_scheme(name: str, codec: Codec | None, **options: Any) -> AllReduceScheme:
    """Build the all-reduce scheme ``name`` around ``codec`` (``None``: unquantized).

    Raises:
        ValueError: an unknown scheme or scheme option, naming it and what is allowed.
    """
    return _build(ALL_REDUCE_SCHEMES, "all-reduce", name, codec, 0, options)


def _build(
    table: dict[str, type[_S]], what: str, name: str, codec: Codec | None, interval: int, options: dict[str, Any]
) -> _S:
    if not isinstance(name, str) or name not in table:
        raise ValueError(f"unknown {what} scheme {name!r}; allowed: {', '.join(table)}")
    try:
        return table[name](codec, interval, **options)
    except TypeError as err:  # an unknown keyword: the documented ValueError instead
        raise ValueError(f"invalid option for the {what} scheme {name!r}: {err}") from None
