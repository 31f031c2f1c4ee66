"""``SideConfig`` (how one side's traffic is quantized and moved) and ``QSDPConfig`` (both sides, which units,
seeds, checks and the policy): frozen plain data, validated at construction, built by name from the presets of
:mod:`composer_qsdp.config.presets` (:meth:`QSDPConfig.from_preset`, the one place presets are merged, whose flat
options the module docstring there lists).

A configuration holds no scheme or codec: :func:`composer_qsdp.schemes.build_scheme` builds each unit's from it when
QSDP installs (``composer_qsdp.engine.plan_units``). Every name it holds is checked against
:mod:`composer_qsdp.registry`."""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch.nn as nn

from composer_qsdp._names import did_you_mean
from composer_qsdp.config.options import AutoOptions, CodecOptions, typed_options
from composer_qsdp.registry import CODECS, GRAD_SCHEMES, POLICIES, PRESETS, WEIGHT_SCHEMES, Registry
from composer_qsdp.schemes import build_codec, build_scheme
from composer_qsdp.schemes.two_level import SAME
from composer_qsdp.validate import check_int, check_seed

__all__ = [
    "EVAL_WEIGHTS", "FEEDBACK_GRAD_SCHEMES", "LowBitGradientWarning", "ModuleFilter", "QSDPConfig", "SideConfig",
    "from_preset", "option_names", "preset_names",
]

#: ``filter(module, name) -> bool``: True keeps a unit quantized (torchao float8's ``module_filter_fn`` order).
ModuleFilter = Callable[[nn.Module, str], bool]
#: Gradient schemes with error feedback, which carry each call's compression error into the next call.
FEEDBACK_GRAD_SCHEMES = ("loco", "two_level_loco")
#: The preset :meth:`QSDPConfig.from_preset` starts from when none is named (and the only one ``policy="auto"`` takes):
#: the first of :data:`composer_qsdp.registry.PRESETS`, ``"w8g8"``.
DEFAULT_PRESET = PRESETS.names()[0]
#: Gradient bit widths at or below which a scheme without error feedback costs loss.
LOW_GRAD_BITS = 2
#: What :attr:`QSDPConfig.eval_weights` allows per evaluator: the exact weights, or those training's forward sees.
EVAL_WEIGHTS = ("exact", "quantized")
#: The default of :attr:`QSDPConfig.eval_weights`, and the mode of every evaluator label a mapping leaves out.
DEFAULT_EVAL_WEIGHTS = "exact"


class LowBitGradientWarning(UserWarning):
    """Gradients of 1 or 2 bits without error feedback: the compression error of every step is lost, which costs
    loss (the QSDP README's "Past 7.5x" section); the ``loco`` gradient scheme carries it over."""


@dataclass(frozen=True)
class SideConfig:
    """How one side (the weight all-gather or the gradient reduce-scatter) is quantized and moved.

    Attributes:
        bits: bits per code (the codec's range, 1..8), or ``None`` to send this side unquantized.
        codec: name of the codec (:data:`composer_qsdp.registry.CODECS`).
        bucket_size: elements sharing one set of codec metadata (scale/offset/levels).
        rounding: the codec's ``rounding`` option (min-max: ``"stochastic"`` or ``"nearest"``); ``None`` keeps
            the codec's default (min-max: stochastic) and is required for codecs without that option.
        codec_options: the codec's other options, an option object of :mod:`composer_qsdp.config.options`
            (``CodecOptions(hadamard=True)``, ``LearnedOptions(...)``) or a mapping of its fields
            (``{"hadamard": True}``), which becomes that object.
        scheme: how the traffic moves (:data:`composer_qsdp.registry.WEIGHT_SCHEMES` / ``GRAD_SCHEMES``,
            :mod:`composer_qsdp.schemes`): weights ``"direct"`` (default) or
            ``"difference"``, gradients ``"flat"`` (default), ``"loco"`` (flat with LoCo's error feedback),
            ``"two_level"`` or ``"two_level_loco"`` (two-level with LoCo's error feedback on the inter-node hop);
            ``None`` is the side's default.
        scheme_options: options of ``scheme``: its option object (``DifferenceOptions(keyframe_every=100)``,
            ``TwoLevelOptions(...)``) or a mapping of its fields. Units that ``scheme_overrides`` moves to another
            scheme take that scheme's defaults.
        bits_overrides: ``{pattern: bits or None}``: the first ``fnmatch`` pattern matching a unit's name sets
            its bits (``None``: unquantized).
        scheme_overrides: ``{pattern: scheme}``: the first pattern matching a unit's name sets its scheme, e.g.
            ``{"model.wte": "direct"}`` to keep a large embedding out of the difference scheme's replica.
    """

    bits: int | None = 8
    codec: str = "minmax"
    bucket_size: int = 1024
    rounding: str | None = None
    codec_options: CodecOptions | Mapping[str, Any] = field(default_factory=dict)
    scheme: str | None = None
    scheme_options: Any = field(default_factory=dict)
    bits_overrides: Mapping[str, int | None] = field(default_factory=dict)
    scheme_overrides: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Normalize containers: YAML recipes pass OmegaConf DictConfig.
        for name in ("bits_overrides", "scheme_overrides"):
            object.__setattr__(self, name, _mapping(name, getattr(self, name)))
        object.__setattr__(self, "codec_options", typed_options("codec", self.codec, self.codec_options,
                                                                CODECS.options(self.codec)))
        # Without a scheme name the side's default types the options, in QSDPConfig (which knows the side).
        object.__setattr__(self, "scheme_options", typed_options("scheme", self.scheme, self.scheme_options,
                                                                 _scheme_options(self.scheme)) if self.scheme else
                           _mapping("scheme_options", self.scheme_options))
        _patterns("bits_overrides", tuple(self.bits_overrides))
        _patterns("scheme_overrides", tuple(self.scheme_overrides))
        for bits in (self.bits, *self.bits_overrides.values()):
            if bits is not None and (isinstance(bits, bool) or not isinstance(bits, int)):
                raise ValueError(f"bits={bits!r} is invalid; bits must be an integer (the codec's range) or None")

    def all_bits(self) -> list[int]:
        """Every bit width this side can use (default and overrides), ascending, without ``None``."""
        return sorted({self.bits, *self.bits_overrides.values()} - {None})

    def all_schemes(self, default: str) -> list[str]:
        """Every scheme this side can use (``scheme``, else ``default``, then the overrides'), without repeats."""
        return list(dict.fromkeys([self.scheme or default, *self.scheme_overrides.values()]))


@dataclass(frozen=True)
class QSDPConfig:
    """Quantization of the weight all-gathers and gradient reduce-scatters of sharded data parallelism (QSDP).

    A unit (a module given to ``fully_shard``, which communicates all the parameters it manages as one flat
    buffer) is the granularity of every decision. Unit names are the qualified names of ``named_modules()`` of
    the model QSDP is applied to (``''`` is that model); patterns are ``fnmatch`` patterns on them.

    Plain frozen data: it builds no scheme. Every name and option is checked at construction, so a bad one fails
    here, naming it: names against :mod:`composer_qsdp.registry`, a scheme's options against its registered option
    class (a plug-in's without one by building it once), and each bit width's codec by building it once (a codec
    is a small value object, so building one is how its options are checked) and dropping it. When QSDP installs,
    :func:`composer_qsdp.schemes.build_scheme` builds each unit's own schemes and codecs from it
    (:func:`composer_qsdp.engine.plan_units`), because schemes and some codecs (learned levels) keep per-unit state.

    Attributes:
        weights: the weight all-gather (default: 8 bits, min-max, stochastic rounding, buckets of 1024).
        grads: the gradient reduce-scatter (default: the same).
        exclude: patterns of unit names left unquantized on both sides (e.g. an embedding or output head).
        module_filter: ``filter(module, name) -> bool``; a unit for which it returns False stays unquantized on
            both sides. Applied with ``exclude`` and ``min_numel``.
        min_numel: units managing fewer parameter elements (unsharded) stay unquantized on both sides: their
            traffic is too small to pay for the quantization error.
        seed: base key of all rounding noise, an integer in ``[0, 2**32)`` (:data:`~composer_qsdp.validate.SEED_BITS`,
            Composer's seed range); with the optimizer step, the microbatch, the unit and the rank it determines
            every random draw, so runs are reproducible and resumable.
        check_finite: detect non-finite all-gathered weights of the units whose weights QSDP quantizes (one fused
            reduction per such all-gather, read at a later forward without waiting for the device) and raise
            :class:`~composer_qsdp.engine.NonFiniteWeightError`. Unquantized weights are FSDP's own gather, unchecked.
        error_sample_interval: every this many calls, a unit also measures the relative quantization error of
            its traffic (one extra decode); ``0`` never measures.
        ranks_per_node: ranks sharing a node, for per-hop byte counts and topology-aware schemes; ``None``
            reads ``LOCAL_WORLD_SIZE`` from the launcher (one node when unset).
        policy: a name of :data:`composer_qsdp.registry.POLICIES`: ``"fixed"`` (the settings above) or ``"auto"``:
            start unquantized, measure the network and each unit's compute over the first steps, then choose per
            unit and side among the candidates (:mod:`composer_qsdp.auto`). Under ``"auto"`` both sides must be
            unquantized (``bits`` ``None``, no ``bits_overrides``): the policy chooses them;
            ``from_preset(policy="auto")`` builds that.
        auto_options: the automatic policy's options, an :class:`~composer_qsdp.config.options.AutoOptions` or a
            mapping of its fields (which becomes one); ``None`` is the defaults under ``"auto"`` and is required
            under ``"fixed"``.
        eval_weights: which weights Composer's evaluations (and ``Trainer.predict``, evaluator label ``"predict"``)
            compute with: ``"exact"`` (default) gathers the exact full-precision weights, as plain FSDP does, so a
            validation loss is that of the model being trained and saved; ``"quantized"`` gathers them as
            training's forward does (quantized, through each unit's scheme), which reports the loss of the
            quantized-weight model (and, unlike ``"exact"``, advances the seed schedule and scheme state as a
            training forward would). A mapping ``{evaluator label: mode}`` chooses per evaluator (Composer's
            ``Evaluator(label=...)``); labels it does not name are ``"exact"``. An evaluation is no training step:
            ``"exact"`` leaves every piece of training state as it was (:meth:`QSDPHandle.set_weight_gathers
            <composer_qsdp.engine.QSDPHandle.set_weight_gathers>`).
            Not part of the quantization settings: :meth:`summary` and checkpoints leave it out, and
            :meth:`matching_preset` ignores it (the algorithm logs it as ``qsdp/eval_weights``). Recipes also
            take ``both`` (an evaluator of each kind); here a mapping says that.
        separate_grad_group: run every unit's gradient collectives (quantized or not) on a second process group of
            the unit's ranks, created when QSDP installs, instead of the group FSDP passes them. One NCCL
            communicator runs its collectives one after another, so on a shared group a backward's weight gathers
            wait behind the gradient reduce-scatters queued before them; on two they can overlap. The results are the
            same either way (the same collectives over the same ranks); it costs one more communicator per distinct
            FSDP group (NCCL's buffers on every GPU). Not part of the quantization settings, like ``eval_weights``
            (the algorithm logs it as ``qsdp/separate_grad_group``).
        speculative_update: send each weight-difference unit's next update during the backward
            (:mod:`composer_qsdp.engine.speculation`): once a unit's gradient is reduced, its optimizer's step runs on
            copies of its shard and state, and the codes of that guess travel on a second process group while the
            backward computes; after the real step the ranks check the guess bit for bit and the next forward's
            gather uses the codes already received where it was exact, else sends the update as usual. The trained
            model is the same bit for bit; a wrong guess (a step where gradient clipping acts) costs its bytes again.
            Needs FSDP2, the optimizers named to QSDP (Composer's algorithm does), ``policy='fixed'`` and the
            ``difference`` weight scheme (replicated reference on the device). Not part of the quantization settings
            (the algorithm logs it as ``qsdp/speculative_update``).
        preset: the preset :meth:`from_preset` started from (its options may have been changed), else ``None``.
            A record of where the settings came from, not a setting: not a constructor argument, not compared.

    Raises:
        ValueError: at construction, for any option out of range, naming the option and what is allowed.

    Warns:
        LowBitGradientWarning: at construction, once, when gradients of 1 or 2 bits (default or override) move
            through a scheme without error feedback (:data:`FEEDBACK_GRAD_SCHEMES`), naming the fix.
    """

    weights: SideConfig = field(default_factory=SideConfig)
    grads: SideConfig = field(default_factory=SideConfig)
    exclude: Sequence[str] = ()
    module_filter: ModuleFilter | None = None
    min_numel: int = 0
    seed: int = 0
    check_finite: bool = True
    error_sample_interval: int = 100
    ranks_per_node: int | None = None
    policy: str = "fixed"
    auto_options: AutoOptions | Mapping[str, Any] | None = None
    eval_weights: str | Mapping[str, str] = DEFAULT_EVAL_WEIGHTS
    separate_grad_group: bool = False
    speculative_update: bool = False
    preset: str | None = field(default=None, init=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("weights", "grads"):
            if not isinstance(getattr(self, name), SideConfig):
                raise ValueError(f"{name}={getattr(self, name)!r} is invalid; it must be a SideConfig")
        object.__setattr__(self, "exclude", _patterns("exclude", self.exclude))
        if self.module_filter is not None and not callable(self.module_filter):
            raise ValueError(f"module_filter={self.module_filter!r} is invalid; it must be callable (module, name)")
        for name in ("min_numel", "error_sample_interval"):
            check_int(name, getattr(self, name))
        check_seed(self.seed)
        for name in ("check_finite", "separate_grad_group", "speculative_update"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} is invalid; it must be True or False")
        if self.ranks_per_node is not None:
            check_int("ranks_per_node", self.ranks_per_node, minimum=1)
        self._check_policy()
        object.__setattr__(self, "eval_weights", _eval_weights(self.eval_weights))
        for name, table in _SIDE_TABLES.items():
            self._check_side(name, table)
        self._check_speculation()
        self._warn_low_bit_grads()

    def _check_speculation(self) -> None:
        if not self.speculative_update:
            return
        if self.policy != "fixed":
            raise ValueError(f"speculative_update=True needs policy='fixed' (policy={self.policy!r}): the automatic "
                             "policy changes the units' schemes while it runs")
        schemes = {self.weights.scheme, *dict(self.weights.scheme_overrides or {}).values()}
        if "difference" not in schemes:
            raise ValueError(f"speculative_update=True sends weight-difference updates ahead, but no unit uses the "
                             f"'difference' weight scheme (weight_scheme={self.weights.scheme!r}); use a qWD preset "
                             "(e.g. QSDPConfig.from_preset('qwd-w3g3-loco', speculative_update=True))")
        options = self.weights.scheme_options
        for name in ("sharded_reference", "reference_on_host"):
            value = options.get(name) if isinstance(options, Mapping) else getattr(options, name, None)
            if value:
                raise ValueError(f"speculative_update=True needs the replicated reference on the device; "
                                 f"weight_scheme_options has {name}=True")

    def _check_policy(self) -> None:
        options = POLICIES.options(self.policy)
        if options is None:  # a policy without options: "fixed"
            if self.auto_options is not None:
                raise ValueError(f"auto_options={self.auto_options!r} needs policy='auto' (policy={self.policy!r})")
            return
        object.__setattr__(self, "auto_options", typed_options("policy", self.policy, self.auto_options, options))
        quantized = {side: getattr(self, side).all_bits() for side in _SIDES.values() if getattr(self, side).all_bits()}
        if quantized:
            raise ValueError(
                f"policy='auto' chooses each unit's weight and gradient bits itself and starts unquantized, but "
                f"{', '.join(f'{side} use bits {bits}' for side, bits in quantized.items())}; build it with "
                "QSDPConfig.from_preset(policy='auto', ...) or use policy='fixed'")

    def _check_side(self, name: str, table: Registry[Any]) -> None:
        """Raise what building the side ``name``'s schemes would raise, without building one (but a plug-in scheme
        registered without an option class, whose constructor is its only check)."""
        side: SideConfig = getattr(self, name)
        default = table.names()[0]
        try:
            schemes = [table.check(scheme) for scheme in side.all_schemes(default)]
            configured = side.scheme or default
            typed_options("scheme", configured, side.scheme_options, table.options(configured))
            for bits in side.all_bits():
                build_codec(side, bits)  # its constructor checks the codec's options; the codec is dropped
                for scheme in schemes:
                    if table.options(scheme) is None:  # a plug-in without an option class: its constructor checks
                        build_scheme(name, side, bits, scheme, self.error_sample_interval)
        except ValueError as err:
            raise ValueError(f"QSDPConfig {name}: {err}") from None

    def _warn_low_bit_grads(self) -> None:
        default = GRAD_SCHEMES.names()[0]
        lossy = sorted(f"{scheme} at {bits} bit(s)" for scheme in self.grads.all_schemes(default)
                       for bits in self.grads.all_bits()
                       if bits <= LOW_GRAD_BITS and scheme not in FEEDBACK_GRAD_SCHEMES)
        # two_level_loco feeds back the inter-node hop only; its intra-node hop carries the side's codes unfed when
        # told to reuse them
        if self.grads.scheme == "two_level_loco" and getattr(self.grads.scheme_options, "intra_codec", None) == SAME:
            lossy += [f"two_level_loco's intra-node hop (intra_codec='same') at {bits} bit(s)"
                      for bits in self.grads.all_bits() if bits <= LOW_GRAD_BITS]
        if lossy:
            warnings.warn(
                f"QSDPConfig: gradients of {', '.join(lossy)} without error feedback lose each step's compression "
                f"error, which costs loss; use the gradient scheme {' or '.join(map(repr, FEEDBACK_GRAD_SCHEMES))} "
                "(grad_scheme='loco', or a preset with it, e.g. QSDPConfig.from_preset('qwd-w4g2-loco')) or 3 or "
                "more gradient bits", LowBitGradientWarning, stacklevel=4)

    @classmethod
    def from_preset(cls, name: str = DEFAULT_PRESET, **options: Any) -> QSDPConfig:
        """The named preset (:meth:`preset_names`: ``"w8g8"``, ``"w8g4"``, ``"w4g4"``, ``"zeropp"``,
        ``"tlq-hs"``, ``"sdp4bit"``, ``"qwd-w4g4"``, ``"qwd-w4g2-loco"``...) with flat ``options`` changed
        (:meth:`option_names`: ``weight_bits``, ``grad_codec_options``, ``bucket_size``, ``exclude``, ...; see
        :mod:`composer_qsdp.config.presets`).

        ``policy="auto"`` (with ``auto_options``) starts from the default preset with both sides unquantized, the
        automatic policy's start; the per-side options are then the policy's to choose and cannot be given.

        Examples: ``QSDPConfig.from_preset("w8g4", weight_bucket_size=2048, exclude=["model.wte"])``,
        ``QSDPConfig.from_preset(policy="auto", auto_options={"warmup_steps": 6}, exclude=["model.wte"])``.

        Raises:
            ValueError: an unknown preset or option, naming the allowed ones and the closest, a value out of
                range, naming the flat options it came from, or per-side options or another preset with
                ``policy="auto"``.
        """
        return from_preset(name, **options)

    @staticmethod
    def preset_names() -> tuple[str, ...]:
        """The names :meth:`from_preset` accepts."""
        return preset_names()

    @staticmethod
    def option_names() -> tuple[str, ...]:
        """The flat options :meth:`from_preset` accepts."""
        return option_names()

    def matching_preset(self) -> str | None:
        """The name of the preset this configuration equals (``from_preset(name)`` with no options), else ``None``
        (a preset with changed options, or a configuration built field by field that no preset matches).
        :attr:`eval_weights` and :attr:`separate_grad_group` are no quantization settings and are not compared."""
        mine = _quantization_settings(self)
        return next((name for name in PRESETS.names() if _quantization_settings(_preset_config(name)) == mine), None)

    def eval_weights_for(self, label: str) -> str:
        """The :attr:`eval_weights` mode of the evaluator labelled ``label``: ``"exact"`` or ``"quantized"``."""
        if isinstance(self.eval_weights, str):
            return self.eval_weights
        return self.eval_weights.get(label, DEFAULT_EVAL_WEIGHTS)

    def summary(self) -> dict[str, Any]:
        """The quantization settings as plain values, for logging hyperparameters and for the algorithm's
        checkpoint state; the policy, its options and the preset's name are recorded apart from them (the
        algorithm's ``qsdp/policy`` and ``qsdp/preset``), so that the summary keeps the keys checkpoints hold."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name in _NOT_SUMMARIZED:
                continue
            value = getattr(self, f.name)
            if isinstance(value, SideConfig):
                value = {g.name: _plain(getattr(value, g.name)) for g in fields(value)}
            out[f.name] = _plain(value)
        return out


_SIDES = {"weight_": "weights", "grad_": "grads"}
_SIDE_TABLES: dict[str, Registry[Any]] = {"weights": WEIGHT_SCHEMES, "grads": GRAD_SCHEMES}
_SIDE_FIELDS = tuple(f.name for f in fields(SideConfig))
_RUN_FIELDS = tuple(f.name for f in fields(QSDPConfig) if f.init and f.name not in _SIDES.values())
_NOT_SUMMARIZED = ("policy", "auto_options", "preset", "eval_weights", "separate_grad_group", "speculative_update")
_NOT_COMPARED = ("eval_weights", "separate_grad_group", "speculative_update")


def preset_names() -> tuple[str, ...]:
    """Names accepted by :meth:`QSDPConfig.from_preset` (:data:`composer_qsdp.registry.PRESETS`)."""
    return PRESETS.names()


def option_names() -> tuple[str, ...]:
    """The flat options :meth:`QSDPConfig.from_preset` accepts (see :mod:`composer_qsdp.config.presets`)."""
    return (*(prefix + f for prefix in _SIDES for f in _SIDE_FIELDS), "bucket_size", *_RUN_FIELDS)


def from_preset(name: str = DEFAULT_PRESET, **options: Any) -> QSDPConfig:
    """:meth:`QSDPConfig.from_preset` (the method is the spelling to use; this module-level function is it)."""
    preset = PRESETS.lookup(name)
    allowed = option_names()
    for key in options:
        if key not in allowed:
            raise ValueError(f"unknown QSDP option {key!r}{did_you_mean(key, allowed)}; allowed: {', '.join(allowed)}")
    given = options
    if options.get("policy") == "auto":
        sided = sorted(key for key in options if key not in _RUN_FIELDS)
        if sided or name != DEFAULT_PRESET:
            what = sided or f"the preset {name!r}"
            raise ValueError(f"policy='auto' chooses each unit's weight and gradient settings itself, so {what} "
                             f"cannot be given with it; remove {'them' if sided else 'it'} or use policy='fixed'")
        options = {**options, "weight_bits": None, "grad_bits": None}  # the safe start: unquantized while measuring
    options = {**preset, **options, **_merged_options(preset, options)}
    sides: dict[str, dict[str, Any]] = {side: {} for side in _SIDES.values()}
    if "bucket_size" in options:
        for changes in sides.values():
            changes["bucket_size"] = options["bucket_size"]
    for prefix, side in _SIDES.items():
        sides[side].update({f: options[prefix + f] for f in _SIDE_FIELDS if prefix + f in options})
    run = {f: options[f] for f in _RUN_FIELDS if f in options}
    try:
        config = QSDPConfig(**{side: SideConfig(**changes) for side, changes in sides.items()}, **run)
    except ValueError as err:
        # The config names its own fields (weights.bits); say which of the user's flat options set them.
        named = ", ".join(f"{k}={v!r}" for k, v in given.items()) or "none"
        raise ValueError(f"QSDP preset {name!r} with options {named}: {err}") from None
    object.__setattr__(config, "preset", name)
    return config


def _merged_options(preset: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """The ``*_codec_options`` / ``*_scheme_options`` mappings of ``given`` merged key by key over the preset's:
    changing one option (``residual_dtype``) keeps the preset's others (``beta``). Where ``given`` names another codec
    or scheme, only the preset's options that the new one also takes carry over (``qwd-w3g3-loco`` with
    ``grad_scheme="two_level_loco"`` keeps its ``beta`` and int8 residual; with ``"flat"`` it has none to keep)."""
    merged = {}
    for prefix, side in _SIDES.items():
        for kind in ("codec", "scheme"):
            key, owner = f"{prefix}{kind}_options", f"{prefix}{kind}"
            base, value = preset.get(key), given.get(key, {})
            if not isinstance(base, Mapping) or not isinstance(value, Mapping):
                continue
            if owner in given and given[owner] != preset.get(owner):
                taken = _option_fields(side, kind, given[owner])
                base = {k: v for k, v in base.items() if taken is None or k in taken}
            merged[key] = {**base, **value}
    return merged


def _option_fields(side: str, kind: str, name: object) -> frozenset[str] | None:
    """The option names that ``side``'s codec or scheme ``name`` takes (none for ``None``, the side's default
    scheme or no codec); ``None`` where that is not known here (an unknown name, which the configuration then
    refuses, or one registered without an option class)."""
    if name is None:
        return frozenset()
    table = CODECS if kind == "codec" else _SIDE_TABLES[side]
    if not isinstance(name, str) or name not in table.names():
        return None
    options = table.options(name)
    return None if options is None else frozenset(f.name for f in fields(options))


@functools.cache
def _preset_config(name: str) -> QSDPConfig:
    """The preset ``name`` unchanged, built once (configurations are frozen)."""
    return from_preset(name)


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return list(value)
    if callable(value):
        return getattr(value, "__qualname__", repr(value))
    return value


def _quantization_settings(config: QSDPConfig) -> tuple[Any, ...]:
    """The compared fields of ``config`` but those that are no quantization setting (:data:`_NOT_COMPARED`)."""
    return tuple(getattr(config, f.name) for f in fields(config) if f.compare and f.name not in _NOT_COMPARED)


def _eval_weights(value: object) -> str | dict[str, str]:
    """:attr:`QSDPConfig.eval_weights` checked: a mode of :data:`EVAL_WEIGHTS`, or a plain dict of them by label."""
    allowed = ", ".join(map(repr, EVAL_WEIGHTS))
    if isinstance(value, str):
        if value == "both":
            raise ValueError(
                "eval_weights='both' is a recipe setting (algorithms.qsdp.eval_weights=both builds a second evaluator "
                "'val_quantized'); QSDPConfig takes one mode for all evaluators or a mapping by evaluator label, e.g. "
                "{'val': 'exact', 'val_quantized': 'quantized'} with Evaluators of those labels")
        if value not in EVAL_WEIGHTS:
            raise ValueError(f"eval_weights={value!r} is invalid; allowed: {allowed}, or a mapping from evaluator "
                             f"label to one of them{did_you_mean(value, EVAL_WEIGHTS)}")
        return value
    if not hasattr(value, "items"):
        raise ValueError(f"eval_weights={value!r} is invalid; it must be one of {allowed} or a mapping from "
                         "evaluator label to one of them, e.g. {'val': 'exact', 'val_quantized': 'quantized'}")
    modes = dict(value.items())  # type: ignore[union-attr]  # a yaml recipe passes an OmegaConf DictConfig
    for label, mode in modes.items():
        if not isinstance(label, str) or not label:
            raise ValueError(f"eval_weights has the label {label!r}; labels are Composer evaluator labels (strings)")
        if not isinstance(mode, str) or mode not in EVAL_WEIGHTS:
            near = did_you_mean(mode, EVAL_WEIGHTS) if isinstance(mode, str) else ""
            raise ValueError(f"eval_weights[{label!r}]={mode!r} is invalid; allowed: {allowed}{near}")
    return modes


def _scheme_options(name: str) -> type | None:
    """The option class of the scheme ``name`` of either side (``None``: unknown here, or registered without one)."""
    table = next((t for t in _SIDE_TABLES.values() if name in t.names()), None)
    return None if table is None else table.options(name)


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
