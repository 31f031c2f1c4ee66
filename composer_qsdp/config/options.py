"""Typed options of each codec and scheme (what ``SideConfig.codec_options`` and ``SideConfig.scheme_options``
hold) and of the automatic policy (``QSDPConfig.auto_options``).

Each option class is registered beside its codec, scheme or policy in :mod:`composer_qsdp.registry`
(``options=``). A mapping (a yaml section, a dict) is turned into the option class of the codec or scheme it
configures, so a misspelled key fails at construction with the allowed keys and the closest one, and each class
checks its values with its scheme's own rules, building no scheme. A codec or scheme registered without an option
class (a plug-in) takes its options as a mapping, checked by its constructor.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from composer_qsdp._names import did_you_mean
from composer_qsdp.registry import CANDIDATES
from composer_qsdp.schemes.direct import check_direct_options
from composer_qsdp.schemes.loco import check_feedback_options
from composer_qsdp.schemes.two_level import check_two_level_options
from composer_qsdp.schemes.two_level_loco import INTRA_CODEC
from composer_qsdp.validate import check_bool, check_int

__all__ = [
    "DEFAULT_CANDIDATES", "AutoOptions", "CodecOptions", "DifferenceOptions", "DirectOptions", "FlatOptions",
    "LearnedOptions", "LoCoOptions", "TwoLevelLoCoOptions", "TwoLevelOptions", "candidate_names", "typed_options",
]


@dataclass(frozen=True)
class CodecOptions:
    """Options every codec takes (besides ``SideConfig``'s ``bits``, ``bucket_size`` and ``rounding``).

    Attributes:
        hadamard: rotate each bucket by a normalized Walsh-Hadamard transform before quantizing and back after
            decoding (SDP4Bit's smoother, §3.2); needs a power-of-two bucket size. The rotation spreads outliers,
            but it turns a bucket's mean into one large coefficient that sets the min-max step of the whole bucket.
            On weights that is the LayerNorm gains (near 1): even in buckets of their own (``align_buckets``), gains
            that training has moved apart come back with several percent of error, so rotate weights only with the
            norms and biases sent raw (``weight_scheme_options={"align_buckets": True, "unquantized_params":
            ["*ln_*", "*.bias"]}``), or rotate gradients and weight differences (mean near 0), as the presets do.
    """

    hadamard: bool = False

    def __post_init__(self) -> None:
        check_bool("hadamard", self.hadamard)


@dataclass(frozen=True)
class LearnedOptions(CodecOptions):
    """Options of the ``learned`` codec (per-bucket levels fitted to the data).

    Attributes:
        refresh_every: encodes between refits of the levels (0: fit once).
        fit_samples: elements sampled for one fit.
        fit_steps: optimization steps of one fit.
        pinned_seeds: seeds whose noise the fit holds fixed.
    """

    refresh_every: int = 1000
    fit_samples: int = 65536
    fit_steps: int = 50
    pinned_seeds: int = 1024

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("refresh_every", self.refresh_every)
        for name in ("fit_samples", "fit_steps", "pinned_seeds"):
            check_int(name, getattr(self, name), minimum=1)


@dataclass(frozen=True)
class DirectOptions:
    """Options of the ``direct`` weight all-gather (QSDP: every rank decodes the quantized shards).

    Attributes:
        align_buckets: start every parameter at a bucket boundary, so no bucket mixes two parameters.
        unquantized_params: names of parameters of a unit sent in full precision beside the codes.
    """

    align_buckets: bool = False
    unquantized_params: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_direct_options(self.align_buckets, self.unquantized_params)
        object.__setattr__(self, "unquantized_params", tuple(self.unquantized_params))


@dataclass(frozen=True)
class DifferenceOptions:
    """Options of the ``difference`` weight all-gather (SDP4Bit's qWD, §3.1).

    Attributes:
        keyframe_every: optimizer steps between full-precision gathers that reset the reference (0: only when
            needed).
        checkpoint_reference: checkpoints hold the reference, so a resume continues exactly.
        sharded_reference: each rank keeps ``1 / g`` of the reference (``g`` ranks per node: ``ranks_per_node``)
            and every gather all-gathers it within the node (ZeRO++ hpZ's idea): ``2 P / g`` bytes per GPU instead
            of ``2 P`` for ``P`` bf16 weights, the same weights bit for bit, and bf16 traffic on the fast links at
            every gather (on one node, every gather's whole traffic).
        reference_on_host: the reference lives in the host's pinned memory (replicated or sharded) and every
            gather copies it to the device and an update back: no device memory between calls, the same weights bit
            for bit, and ``e P`` bytes (``e P / g`` sharded) over the host link each way per gather.
    """

    keyframe_every: int = 0
    checkpoint_reference: bool = True
    sharded_reference: bool = False
    reference_on_host: bool = False

    def __post_init__(self) -> None:
        check_int("keyframe_every", self.keyframe_every)
        check_bool("checkpoint_reference", self.checkpoint_reference)
        check_bool("sharded_reference", self.sharded_reference)
        check_bool("reference_on_host", self.reference_on_host)


@dataclass(frozen=True)
class FlatOptions:
    """The ``flat`` gradient reduce-scatter (one quantized all-to-all, an fp32 sum) has no options."""


@dataclass(frozen=True)
class LoCoOptions:
    """Options of the ``loco`` gradient reduce-scatter: the ``flat`` one with LoCo's per-rank error feedback
    (Xie et al., "LoCo: Low-Bit Communication Adaptor for Large-scale Model Training", 2024).

    Attributes:
        beta: weight of the previous residual in its moving average, in [0, 1).
        reset_every: zero the residual every this many optimizer steps (0: never).
        residual_dtype: the residual's storage, ``"float32"``, ``"bfloat16"`` or ``"int8"`` (bytes per gradient
            element: 4, 2, or ``1 + 4 / bucket_size``: 8-bit symmetric codes, one fp32 scale per gradient bucket).
        residual_on_host: the residual lives in pinned host memory and each call copies it to the device and back:
            no device memory between calls, the same results, its bytes over the host link each way per call.
    """

    beta: float = 0.8
    reset_every: int = 0
    residual_dtype: str = "float32"
    residual_on_host: bool = False

    def __post_init__(self) -> None:
        check_feedback_options("loco", self.beta, self.reset_every, self.residual_dtype, self.residual_on_host)


@dataclass(frozen=True)
class TwoLevelOptions:
    """Options of the ``two_level`` gradient reduce-scatter (ZeRO++ qgZ, SDP4Bit TLq-HS §3.2).

    Attributes:
        intra_codec: the codec of the intra-node hop: ``"same"`` (the side's codec), ``None`` (unquantized), a
            codec name, or a mapping of ``make_codec`` options with ``name``, e.g.
            ``{"name": "symmetric", "bits": 8, "bucket_size": 128}``.
        rotation_block: elements of each Hadamard rotation kept through the local reduction (a power of two), or
            ``None`` for no rotation.
    """

    intra_codec: str | Mapping[str, Any] | None = "same"
    rotation_block: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.intra_codec, Mapping):
            object.__setattr__(self, "intra_codec", dict(self.intra_codec))
        if self.rotation_block is not None:
            check_int("rotation_block", self.rotation_block, minimum=1)
        check_two_level_options(self.intra_codec, self.rotation_block)


@dataclass(frozen=True)
class TwoLevelLoCoOptions(TwoLevelOptions):
    """Options of the ``two_level_loco`` gradient reduce-scatter: ``two_level``'s hops with LoCo's error feedback on
    the inter-node one (a residual of ``1 / L`` of the gradient per rank, ``L`` ranks per node; none on one node).

    Attributes:
        intra_codec: as :class:`TwoLevelOptions`; by default
            :data:`~composer_qsdp.schemes.two_level_loco.INTRA_CODEC` (8-bit min-max, stochastic rounding), since no
            residual corrects that hop.
        rotation_block: as :class:`TwoLevelOptions`.
        beta, reset_every, residual_dtype, residual_on_host: as :class:`LoCoOptions`, for the inter-node hop's
            residual.
    """

    intra_codec: str | Mapping[str, Any] | None = dataclasses.field(default_factory=lambda: dict(INTRA_CODEC))
    beta: float = 0.8
    reset_every: int = 0
    residual_dtype: str = "float32"
    residual_on_host: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_feedback_options("two_level_loco", self.beta, self.reset_every, self.residual_dtype,
                               self.residual_on_host)


def typed_options(kind: str, name: str, value: object, cls: type | None) -> Any:
    """``value`` (a mapping, ``None`` or an option object) as ``cls``, the option class of the codec, scheme or policy
    ``name`` (:meth:`Registry.options <composer_qsdp.registry.Registry.options>`); a mapping stays a mapping when
    ``cls`` is ``None``.

    Raises:
        ValueError: an unknown key (naming the allowed ones and the closest), a value out of range, or an option
            object of another codec or scheme.
    """
    if value is None:
        value = {}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if cls is not None and type(value) is not cls:
            raise ValueError(f"{kind} {name!r} takes {cls.__name__}, got {type(value).__name__}")
        return value
    if not isinstance(value, Mapping):
        raise ValueError(f"{kind} options {value!r} are invalid; they must be a mapping or an options object")
    if cls is None:
        return dict(value)
    allowed = [f.name for f in dataclasses.fields(cls)]
    for key in value:
        if key not in allowed:
            raise ValueError(f"unknown option {key!r} of {kind} {name!r}{did_you_mean(str(key), allowed)}; "
                             f"allowed: {', '.join(allowed) or 'none'}")
    return cls(**value)


#: The candidates (:data:`composer_qsdp.registry.CANDIDATES`) offered unless ``AutoOptions`` names others: the sides
#: of ``w8g8``, which the seed protocol has shown inside or below plain FSDP2's seed range on every cell (three
#: corpora each at GPT-125M and GPT-350M; docs/presets.md), as close to plain FSDP2 as a quantized side gets. The
#: others are opt-in: ``qwd3`` and ``g3loco`` come from ``qwd-w3g3-loco``, lossless on every cell as a whole preset,
#: but the policy's per-unit mixtures of them with ``w8``/``g8`` and ``off`` have not run the protocol; ``g4``
#: (``w8g4-paper``'s gradients) costs 0.27% on GPT-350M's ``prose``; ``qwd4`` (``qwd-w4g4``'s weights) has not run it.
DEFAULT_CANDIDATES: dict[str, tuple[str, ...]] = {"weights": ("off", "w8"), "grads": ("off", "g8")}


def candidate_names(option: str, side: str, value: object) -> tuple[str, ...]:
    """``value`` (a list of candidate names of ``side``, e.g. from YAML) as a tuple in the order of
    :data:`composer_qsdp.registry.CANDIDATES` (most accurate first).

    YAML 1.1 reads a bare ``off`` as ``False``, so ``False`` stands for ``"off"``.

    Raises:
        ValueError: not a list of names, an unknown name (naming it, the allowed ones and the closest), a repeated
            name, or no ``"off"``; the message names ``option``.
    """
    table = CANDIDATES[side]
    allowed = table.names()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ValueError(f"{option}={value!r} is invalid; it must be a list of candidate names from "
                         f"{', '.join(allowed)}")
    names = ["off" if v is False else v for v in value]
    for name in names:
        try:
            table.check(name)
        except ValueError as err:
            raise ValueError(f"{option}: {err}") from None
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated or "off" not in names:
        raise ValueError(f"{option}={list(names)!r} is invalid; it must name 'off' (the unquantized start) and each "
                         f"candidate once{f' (repeated: {repeated})' if repeated else ''}")
    return tuple(n for n in allowed if n in names)


@dataclass(frozen=True)
class AutoOptions:
    """Options of the automatic policy (``QSDPConfig(policy="auto", auto_options=...)``).

    Attributes:
        warmup_steps: optimizer steps run unquantized before deciding (>= 2; step 1 is not timed), and the length
            of the re-check window after the decision.
        recheck_tolerance: relative difference between the measured and predicted step time that triggers the one
            re-decision (> 0).
        min_gain: the smallest predicted gain (fraction of the unquantized step) worth quantizing for, in [0, 1).
        backward_ratio: backward compute per unit as a multiple of its measured forward (> 0).
        probe_max_numel: largest probe message, elements (the probe sends up to three sizes up to the largest unit,
            capped here; 2**24 elements are 32 MiB in bf16).
        probe_repeats: timed calls per probe size (>= 1; one untimed call precedes them; the median counts).
        weight_candidates, grad_candidates: the candidates to choose from per side, by name
            (:data:`composer_qsdp.registry.CANDIDATES`; a list from YAML is accepted, and a bare YAML ``off``, read as ``False``,
            is ``"off"``), ``"off"`` among them. Stored in the table's order, most accurate first, whatever order
            they are given in (ties between candidates keep the more accurate). Default:
            :data:`DEFAULT_CANDIDATES`.

    Raises:
        ValueError: an option out of range, naming the value and what is allowed.
    """

    warmup_steps: int = 4
    recheck_tolerance: float = 0.25
    min_gain: float = 0.02
    backward_ratio: float = 2.0
    probe_max_numel: int = 2**24
    probe_repeats: int = 5
    weight_candidates: tuple[str, ...] = DEFAULT_CANDIDATES["weights"]
    grad_candidates: tuple[str, ...] = DEFAULT_CANDIDATES["grads"]

    def __post_init__(self) -> None:
        for side in ("weight", "grad"):
            name = f"{side}_candidates"
            object.__setattr__(self, name, candidate_names(name, f"{side}s", getattr(self, name)))
        check_int("warmup_steps", self.warmup_steps, minimum=2)
        check_int("probe_max_numel", self.probe_max_numel, minimum=1024)
        check_int("probe_repeats", self.probe_repeats, minimum=1)
        for name, ok, allowed in (
            ("recheck_tolerance", lambda v: v > 0, "a number > 0"),
            ("min_gain", lambda v: 0 <= v < 1, "a number in [0, 1)"),
            ("backward_ratio", lambda v: v > 0, "a number > 0"),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
                raise ValueError(f"{name}={value!r} is invalid; allowed: {allowed}")
