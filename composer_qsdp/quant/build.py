"""Building codecs by name: ``make_codec(name, **options)``, from :data:`composer_qsdp.registry.CODECS`, is the only
way other layers build a codec."""

from __future__ import annotations

import inspect
from typing import Any

from composer_qsdp.quant.codec import Codec
from composer_qsdp.registry import CODECS
from composer_qsdp.validate import check_bool

__all__ = ["make_codec", "codec_names"]


def codec_names() -> tuple[str, ...]:
    """Names accepted by :func:`make_codec`."""
    return CODECS.names()


def make_codec(name: str, *, hadamard: bool = False, **options: Any) -> Codec:
    """Build a codec by name.

    Args:
        name: one of :func:`codec_names` (``"minmax"``, ``"random_shift"``, ``"learned"``, ``"symmetric"``,
            ``"sign"``).
        hadamard: rotate each bucket by a normalized Walsh-Hadamard transform before quantizing and back after
            decoding (SDP4Bit); needs a power-of-two ``bucket_size``.
        **options: keyword arguments of the codec's class, e.g. ``bits`` (bits per code), ``bucket_size``
            (elements per bucket), ``rounding``.

    Raises:
        ValueError: unknown name or invalid option, naming the value and what is allowed.
    """
    cls = CODECS.lookup(name)
    accepted = inspect.signature(cls).parameters
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(
            f"invalid option for codec {name!r}: {', '.join(unknown)}; allowed: {', '.join(accepted)}, hadamard"
        )
    codec = cls(**options)
    if check_bool("hadamard", hadamard):
        from composer_qsdp.quant.hadamard import HadamardCodec

        codec = HadamardCodec(codec)
    return codec
