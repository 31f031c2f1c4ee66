"""``QSDPConfig``: which codec, how many bits and which FSDP units, for weights and for gradients."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from composer_qsdp.quant import Codec, make_codec
from composer_qsdp.quant.codec import check_int
from composer_qsdp.quant.philox import check_seed

__all__ = ["QSDPConfig", "Side"]

#: The two quantized paths: the weight all-gather and the gradient reduce-scatter.
Side = Literal["weights", "grads"]

@dataclass(frozen=True)
class QSDPConfig:
    """Quantization of FSDP2's weight all-gathers and gradient reduce-scatters (QSDP).

    One FSDP unit (a module passed to ``fully_shard``, which communicates all parameters it manages as one
    flat buffer) is the granularity of every decision below. Unit names are the qualified names of
    ``model.named_modules()`` of the model given to :func:`~composer_qsdp.fsdp.apply_qsdp` (``''`` is that
    model itself). Patterns are ``fnmatch`` patterns on those names.

    Attributes:
        weight_bits: bits per weight code (the codec's range, 1..8), or ``None`` to all-gather weights
            unquantized.
        grad_bits: bits per gradient code, or ``None`` to reduce-scatter gradients unquantized.
        weight_codec: registry name of the weight codec (:func:`composer_qsdp.quant.codec_names`).
        grad_codec: registry name of the gradient codec.
        bucket_size: elements sharing one set of codec metadata (scale/offset), for both sides.
        weight_rounding: ``rounding`` option of the weight codec (minmax: ``"stochastic"`` or ``"nearest"``);
            ``None`` keeps the codec's default (minmax: stochastic) and is required for codecs without that
            option. Stochastic weight rounding is seeded per step, so the forward and backward all-gathers of one
            step see identical weights.
        grad_rounding: ``rounding`` option of the gradient codec, ``None`` for its default (minmax:
            stochastic, which keeps the reduced gradient unbiased).
        weight_codec_options: extra :func:`~composer_qsdp.quant.make_codec` options of the weight codec
            (e.g. ``{"hadamard": True}``).
        grad_codec_options: extra options of the gradient codec.
        min_numel: units managing fewer parameter elements (unsharded) than this stay unquantized on both
            sides: their traffic is too small to pay for the quantization error.
        exclude: patterns of unit names left unquantized on both sides (e.g. a separately wrapped embedding
            or output head).
        weight_bits_overrides: ``{pattern: bits or None}``: the first pattern matching a unit's name sets its
            weight bits (``None``: unquantized). Applies after ``exclude`` and ``min_numel``.
        grad_bits_overrides: the same for gradient bits.
        seed: base key of all rounding noise; with the step counter, the unit and the rank it determines
            every random draw, so runs are reproducible and resumable.
        check_finite: detect non-finite all-gathered weights (one fused reduction per all-gather, checked at
            the next forward) and raise :class:`~composer_qsdp.fsdp.NonFiniteWeightError`.
        error_sample_interval: every this many calls, a unit also measures the relative quantization error
            of its traffic (one extra decode); ``0`` never measures.

    Raises:
        ValueError: at construction, for any option out of range, naming the option and what is allowed.
    """

    weight_bits: int | None = 8
    grad_bits: int | None = 8
    weight_codec: str = "minmax"
    grad_codec: str = "minmax"
    bucket_size: int = 1024
    weight_rounding: str | None = None
    grad_rounding: str | None = None
    weight_codec_options: Mapping[str, Any] = field(default_factory=dict)
    grad_codec_options: Mapping[str, Any] = field(default_factory=dict)
    min_numel: int = 0
    exclude: Sequence[str] = ()
    weight_bits_overrides: Mapping[str, int | None] = field(default_factory=dict)
    grad_bits_overrides: Mapping[str, int | None] = field(default_factory=dict)
    seed: int = 0
    check_finite: bool = True
    error_sample_interval: int = 100

    def __post_init__(self) -> None:
        # Normalize containers: YAML recipes pass OmegaConf ListConfig/DictConfig.
        set_ = object.__setattr__
        set_(self, "exclude", _patterns("exclude", self.exclude))
        for name in ("weight_codec_options", "grad_codec_options"):
            options = _mapping(name, getattr(self, name))
            reserved = sorted(set(options) & {"bits", "bucket_size", "rounding"})
            if reserved:
                raise ValueError(f"{name} sets {reserved}; use the QSDPConfig fields of the same names instead")
            set_(self, name, options)
        for name in ("weight_bits_overrides", "grad_bits_overrides"):
            overrides = _mapping(name, getattr(self, name))
            _patterns(name, tuple(overrides))
            for bits in overrides.values():
                _bits_or_none(name, bits)
            set_(self, name, overrides)
        for name in ("weight_bits", "grad_bits"):
            _bits_or_none(name, getattr(self, name))
        for name in ("min_numel", "error_sample_interval"):
            check_int(name, getattr(self, name))
        check_seed(self.seed)
        if not isinstance(self.check_finite, bool):
            raise ValueError(f"check_finite={self.check_finite!r} is invalid; it must be True or False")
        # Build every codec the config can produce once, so a bad codec option fails here, not mid-training.
        for side in ("weights", "grads"):
            bits_options = {self.bits(side), *self.overrides(side).values()} - {None}
            for bits in sorted(bits_options):
                self.make_codec(side, bits)

    def bits(self, side: Side) -> int | None:
        """Default bits of ``side`` (``"weights"`` or ``"grads"``)."""
        return self.weight_bits if side == "weights" else self.grad_bits

    def overrides(self, side: Side) -> Mapping[str, int | None]:
        """Per-unit bit overrides of ``side``."""
        return self.weight_bits_overrides if side == "weights" else self.grad_bits_overrides

    def make_codec(self, side: Side, bits: int) -> Codec:
        """A fresh codec for ``side`` at ``bits`` bits.

        Raises:
            ValueError: the codec rejects its options; the message names the side and the codec.
        """
        if side == "weights":
            name, rounding, extra = self.weight_codec, self.weight_rounding, self.weight_codec_options
        else:
            name, rounding, extra = self.grad_codec, self.grad_rounding, self.grad_codec_options
        options: dict[str, Any] = {"bits": bits, "bucket_size": self.bucket_size, **extra}
        if rounding is not None:
            options["rounding"] = rounding
        try:
            return make_codec(name, **options)
        except ValueError as err:
            prefix = "weight" if side == "weights" else "grad"
            raise ValueError(f"QSDPConfig {prefix} codec {name!r} with {options}: {err}") from None


def _bits_or_none(name: str, value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"{name} has bits={value!r}; bits must be an integer (the codec's range) or None")


def _patterns(name: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ValueError(
            f"{name}={value!r} is invalid; it must be a list of fnmatch patterns of module names, "
            f"e.g. ['*.wte', 'model.lm_head']"
        )
    patterns = tuple(value)
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise ValueError(f"{name} contains {pattern!r}; patterns must be strings")
    return patterns


def _mapping(name: str, value: object) -> dict[str, Any]:
    if value is None:
        return {}
    if not hasattr(value, "items"):
        raise ValueError(f"{name}={value!r} is invalid; it must be a mapping")
    return dict(value.items())  # type: ignore[union-attr]
