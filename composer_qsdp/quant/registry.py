"""Codec registry: ``make_codec(name, **options)`` is the only way other layers build a codec."""

from __future__ import annotations

import importlib
from typing import Any

from composer_qsdp.quant.codec import Codec

__all__ = ["make_codec", "codec_names"]

# name -> "module:Class"; imported lazily so a codec's dependencies load only when it is used.
_CODECS: dict[str, str] = {
    "minmax": "composer_qsdp.quant.minmax:MinMaxCodec",
    "random_shift": "composer_qsdp.quant.random_shift:RandomShiftCodec",
    "learned": "composer_qsdp.quant.learned:LearnedLevelsCodec",
    "symmetric": "composer_qsdp.quant.symmetric:SymmetricCodec",
    "sign": "composer_qsdp.quant.sign:SignCodec",
}


def codec_names() -> tuple[str, ...]:
    """Names accepted by :func:`make_codec`."""
    return tuple(_CODECS)


def make_codec(name: str, *, hadamard: bool = False, **options: Any) -> Codec:
    """Build a codec by name.

    Args:
        name: one of :func:`codec_names` (``"minmax"``, ``"random_shift"``, ``"learned"``, ``"symmetric"``,
            ``"sign"``).
        hadamard: rotate each bucket by a normalized Walsh-Hadamard transform before quantizing and back after
            decoding (SDP4Bit); needs a power-of-two ``bucket_size``.
        **options: codec options, e.g. ``bits`` (1..8), ``bucket_size`` (elements), ``rounding``.

    Raises:
        ValueError: unknown name or invalid option, naming the value and what is allowed.
    """
    if name not in _CODECS:
        raise ValueError(f"unknown codec {name!r}; allowed: {', '.join(sorted(_CODECS))}")
    module_name, class_name = _CODECS[name].split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    try:
        codec = cls(**options)
    except TypeError as err:  # unknown keyword: turn into the documented ValueError
        raise ValueError(f"invalid option for codec {name!r}: {err}") from None
    if hadamard:
        from composer_qsdp.quant.hadamard import HadamardCodec

        codec = HadamardCodec(codec)
    return codec
