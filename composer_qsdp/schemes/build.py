"""Building schemes: by name around a codec (:func:`make_weight_scheme`, :func:`make_grad_scheme`,
:func:`make_all_reduce_scheme`, from the tables of :mod:`composer_qsdp.registry`), and a unit's scheme with its
codec from one side's settings (:func:`build_scheme`, :func:`build_codec`): the one place the settings' codec and
scheme options are put together, called once per unit when QSDP installs (``engine.plan_units``) and by the
automatic policy for its candidates.

The settings are read by attribute (:class:`SideSettings`: ``composer_qsdp.config.SideConfig`` is one); their
option objects pass on the fields that differ from their defaults, so a codec or scheme applies its own defaults.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, TypeVar

from composer_qsdp.quant import Codec, make_codec
from composer_qsdp.registry import ALL_REDUCE_SCHEMES, GRAD_SCHEMES, WEIGHT_SCHEMES, Registry
from composer_qsdp.schemes.base import AllReduceScheme, GradScheme, Scheme, WeightScheme

__all__ = [
    "SideSettings", "build_codec", "build_scheme", "make_all_reduce_scheme", "make_grad_scheme", "make_weight_scheme",
]

_S = TypeVar("_S", bound=Scheme)


class SideSettings(Protocol):
    """What :func:`build_scheme` reads of one side's settings (``composer_qsdp.config.SideConfig``'s fields)."""

    codec: str
    bucket_size: int
    rounding: str | None
    codec_options: Any
    scheme: str | None
    scheme_options: Any


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


def build_codec(settings: SideSettings, bits: int) -> Codec:
    """The codec of one side at ``bits`` bits: ``settings``' codec with its bucket size, rounding and options.

    Raises:
        ValueError: the codec rejects its options; the message names the codec and the options.
    """
    rounding = {} if settings.rounding is None else {"rounding": settings.rounding}
    extra = _kwargs(settings.codec_options)
    try:
        return make_codec(settings.codec, bits=bits, bucket_size=settings.bucket_size, **rounding, **extra)
    except (ValueError, TypeError) as err:
        options = {"bits": bits, "bucket_size": settings.bucket_size, **rounding, **extra}
        raise ValueError(f"codec {settings.codec!r} with {options}: {err}") from None


def build_scheme(
    side: str, settings: SideSettings | None, bits: int | None, scheme: str | None = None,
    error_sample_interval: int = 0,
) -> WeightScheme | GradScheme:
    """A new scheme of one unit's ``side`` (``"weights"`` or ``"grads"``), with a codec of its own.

    At ``bits`` ``None`` the unit is unquantized: the side's default scheme (the first its registry names) without a
    codec, whatever ``settings`` say. Otherwise ``scheme`` (``None``: ``settings.scheme``, else the default) around
    :func:`build_codec` at ``bits``; the configured scheme takes ``settings.scheme_options``, another one (a unit that
    a scheme override moved) its own defaults.

    Raises:
        ValueError: an unknown side, scheme or option, naming it.
    """
    table, make = _SIDES.get(side, (None, None))
    if table is None or make is None:
        raise ValueError(f"side {side!r} is invalid; allowed: {', '.join(_SIDES)}")
    default = table.names()[0]
    if bits is None:
        return make(default, None, error_sample_interval)
    assert settings is not None, "a quantized side needs its settings"
    configured = settings.scheme or default
    name = scheme or configured
    options = _kwargs(settings.scheme_options) if name == configured else {}
    return make(name, build_codec(settings, bits), error_sample_interval, **options)


_SIDES = {"weights": (WEIGHT_SCHEMES, make_weight_scheme), "grads": (GRAD_SCHEMES, make_grad_scheme)}


def _kwargs(options: Any) -> dict[str, Any]:
    """The keyword arguments ``options`` passes on: an option object's fields that differ from their defaults (so
    the codec or scheme applies its own default otherwise), or a plug-in's mapping as it is."""
    if not dataclasses.is_dataclass(options):
        return dict(options or {})
    return {f.name: getattr(options, f.name) for f in dataclasses.fields(options)
            if getattr(options, f.name) != f.default}


def _build(registry: Registry[type[_S]], name: str, codec: Codec | None, interval: int, options: dict[str, Any]) -> _S:
    cls = registry.lookup(name)
    try:
        return cls(codec, interval, **options)
    except TypeError as err:  # an unknown keyword: the documented ValueError instead
        raise ValueError(f"invalid option for the {registry.kind} {name!r}: {err}") from None
