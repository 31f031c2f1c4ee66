"""QSDP as a Composer algorithm: quantized FSDP weight all-gathers and gradient reduce-scatters (FSDP2 or FSDP1)."""

from __future__ import annotations

import dataclasses
import logging
import os
import warnings
from pathlib import Path
from typing import Any

from composer.callbacks import CheckpointSaver
from composer.core import Algorithm, Callback, Event, State
from composer.loggers import Logger
from composer.utils import dist
from torch import nn
from torchmetrics import Metric, MetricCollection

from composer_qsdp.comm import TrafficCounter, TrafficReport
from composer_qsdp import fsdp1, fsdp2
from composer_qsdp.algorithms.qsdp.functional import as_config
from composer_qsdp.auto import AutoPolicy
from composer_qsdp.config import QSDPConfig
from composer_qsdp.config.settings import DEFAULT_PRESET
from composer_qsdp.engine import NonFiniteWeightError, QSDPHandle, ResumeSettingsWarning

__all__ = ["QSDP", "QSDPFromYaml", "QSDPResiduals", "check_run", "per_block_fsdp_units"]

log = logging.getLogger(__name__)


def check_run(fsdp_config_version: int, world_size: int) -> str | None:
    """Validate a Composer run for QSDP and pick the adapter that reaches its collectives.

    Args:
        fsdp_config_version: ``State.fsdp_config_version`` (0: no FSDP, 1: FSDP1, 2: FSDP2).
        world_size: ranks in the run.

    Returns:
        ``"fsdp1"``, ``"fsdp2-custom"`` (FSDP2's custom collectives, torch >= 2.9) or ``"fsdp2-proxy"`` (FSDP2's
        internal collectives, torch 2.6-2.8); ``None`` (after a warning) when ``world_size`` is 1: FSDP then
        communicates nothing.

    Raises:
        ValueError: the run does not use FSDP, naming how to switch it on, or an unknown ``fsdp_config_version``.
    """
    if fsdp_config_version == 0:
        raise ValueError(
            "QSDP quantizes FSDP's all-gathers and reduce-scatters, but this run does not use FSDP. Pass "
            "Trainer(parallelism_config={'fsdp': {...}}) (FSDP1; FSDP2 with the environment variable FSDP_VERSION=2 "
            "or with composer.utils.FSDP2Config), or remove the QSDP algorithm."
        )
    if fsdp_config_version not in (1, 2):
        raise ValueError(
            f"unknown fsdp_config_version={fsdp_config_version!r}; QSDP supports 1 (FSDP1) and 2 (FSDP2)"
        )
    if world_size == 1:
        warnings.warn("QSDP does nothing with world size 1: FSDP sends no traffic to quantize", stacklevel=2)
        return None
    return "fsdp1" if fsdp_config_version == 1 else f"fsdp2-{fsdp2.default_comm_path()}"


def _chooses_units(network: nn.Module) -> bool:
    """Whether ``network`` already tells Composer's FSDP wrapping which submodules are units."""
    return callable(getattr(network, "fsdp_wrap_fn", None)) or any(
        hasattr(module, "_fsdp_wrap") for module in network.modules())


def per_block_fsdp_units(model: nn.Module) -> list[str]:
    """Make each transformer block of a Hugging Face network in ``model`` its own FSDP unit, as llm-foundry does.

    Composer's FSDP wraps every direct child of a ``ComposerModel`` as one unit, and within it only the submodules
    its ``fsdp_wrap_fn`` selects. A ``transformers`` model in Composer's ``HuggingFaceModel`` has none, so it would be
    one unit: the whole model gathered at once, and QSDP's quantized collectives one per step instead of one per
    block. For each child without its own choice (no ``fsdp_wrap_fn``, no ``_fsdp_wrap`` attribute) that names its
    block classes in ``_no_split_modules`` (every ``transformers`` ``PreTrainedModel``: GPT-2's ``GPT2Block``, Llama's
    ``LlamaDecoderLayer``...), this sets an ``fsdp_wrap_fn`` selecting those classes. A single child with parameters
    and neither gets a warning naming the fix. QSDP calls it at ``Event.INIT``, before the Trainer wraps the model.

    Returns:
        The block class names now wrapped, per child: ``["model: GPT2Block"]``; empty when nothing was changed.
    """
    children = [(name, child) for name, child in model.named_children()
                if any(True for _ in child.parameters()) and not isinstance(child, (Metric, MetricCollection))]
    changed = []
    for name, child in children:
        if _chooses_units(child):
            continue
        blocks = tuple(getattr(child, "_no_split_modules", None) or ())
        if blocks:
            child.fsdp_wrap_fn = lambda module, blocks=blocks: type(module).__name__ in blocks
            changed.append(f"{name}: {', '.join(blocks)}")
        elif len(children) == 1:
            warnings.warn(
                f"QSDP: {type(child).__name__} ('{name}' of the {type(model).__name__}) has no fsdp_wrap_fn, so FSDP "
                "makes it one unit: the whole model is gathered at once and each step has one quantized all-gather "
                "and one reduce-scatter. Give it an fsdp_wrap_fn(module) -> bool that selects its blocks (e.g. "
                "`lambda m: isinstance(m, Block)`), as Composer's FSDP docs describe", stacklevel=2)
    if changed:
        log.info("QSDP: one FSDP unit per transformer block (%s)", "; ".join(changed))
    return changed


class QSDP(Algorithm):
    """Quantize FSDP's weight all-gathers and gradient reduce-scatters (QSDP, Markov et al., ICML 2023).

    Installs at ``Event.AFTER_LOAD`` (the model is wrapped and any checkpoint loaded, no forward has run), through
    the adapter of the run's FSDP (:func:`check_run`: FSDP2 by its custom collectives on torch >= 2.9 or by its
    internal collectives on torch 2.6-2.8; FSDP1 by its communication hook and flat-parameter all-gather), which it
    names in its log line and in the hyperparameter ``qsdp/adapter``. Every FSDP unit gets a quantized all-gather
    (its shard is encoded, the bytes gathered, every rank decodes all shards, so all ranks compute with identical
    weights) and a quantized reduce-scatter (gradient chunks encoded, exchanged all-to-all, decoded and summed in
    fp32). The sharded full-precision weights, the optimizer and checkpoints are untouched. The optimizer's steps
    are QSDP's step boundary. Logs bytes sent, the compression against bf16, against the same collectives
    unquantized and against plain FSDP, and sampled quantization errors at every ``BATCH_END``.

    Configure it with a :class:`~composer_qsdp.QSDPConfig` (``QSDP(QSDPConfig.from_preset("w8g4", grad_bits=3))``,
    ``QSDP(QSDPConfig.from_preset(policy="auto"))``) or a preset name (``QSDP("sdp4bit")``, the preset unchanged); a
    yaml recipe's ``algorithms: {qsdp: {preset: w8g4, grad_bits: 4}}`` becomes
    ``QSDP(QSDPConfig.from_preset("w8g4", grad_bits=4))``. The config's schemes and codecs are built when it
    installs. The config is recorded in the hyperparameters (``qsdp/config``; ``qsdp/preset`` names its preset,
    :meth:`preset_label`; ``qsdp/policy``) and in checkpoints.

    At ``Event.INIT``, before the Trainer wraps the model, a Hugging Face network without its own choice of FSDP
    units gets one unit per transformer block (:func:`per_block_fsdp_units`); otherwise Composer would make it a
    single unit.

    Its checkpoint state (seed schedule, byte counters, scheme state) records the settings it was written under. A
    resume under other settings (bits, codecs, schemes, world size) continues with the new ones and warns with
    :class:`~composer_qsdp.engine.ResumeSettingsWarning` naming each change (hyperparameter
    ``qsdp/resume_changes``); the byte counters keep their totals. A resume from a checkpoint without QSDP state
    warns too, and the counters start from zero.

    Evaluations, and ``Trainer.predict`` (dataloader label ``"predict"``), compute with the exact weights by
    default: at ``Event.EVAL_START`` (``PREDICT_START``) the handle's weight all-gathers switch to the framework's
    own gather of the full-precision shards (:meth:`QSDPHandle.set_weight_gathers
    <composer_qsdp.engine.QSDPHandle.set_weight_gathers>`), so a validation loss (a prediction) is that of the model
    trained and saved, comparable with plain FSDP's, and training continues exactly as if the evaluation had not
    happened (no seed drawn, no scheme state touched). The config's ``eval_weights`` chooses per evaluator label
    (``state.dataloader_label``): ``"quantized"`` evaluates the weights as training's forward sees them, today's
    quantized-weight loss. ``EVAL_END`` (``PREDICT_END``) restores training's gathers; if an evaluation raised
    before its end, the next ``FIT_START`` or ``BATCH_START`` does. Hyperparameter ``qsdp/eval_weights``; the config's
    ``separate_grad_group``: ``qsdp/separate_grad_group``; its ``speculative_update``: ``qsdp/speculative_update``, and
    per batch the cumulative ``qsdp/speculation/sent``, ``hits``, ``misses`` and ``paused``. With it, QSDP also acts at
    ``Event.AFTER_TRAIN_BATCH`` (every microbatch's backward is done; Composer runs them inside the optimizer's step
    closure, after its pre-step hook): the backward's last unit's update goes out then.

    Per-rank scheme state (LoCo's error-feedback residuals) stays out of the algorithm's state, which Composer
    writes from rank 0 only; at ``Event.INIT`` QSDP adds a :class:`QSDPResiduals` callback whose state holds each
    rank's piece, and which a sharded checkpoint (``fsdp.state_dict_type: sharded``) writes from every rank with no
    collective. A resume on the same number of ranks from a local sharded checkpoint folder reads them back
    exactly; a full checkpoint holds none, and another number of ranks cannot use them: the residuals then restart
    from zero with a :class:`~composer_qsdp.schemes.LoCoResidualWarning` naming why.

    Example::

        from composer import Trainer
        from composer_qsdp import QSDP, QSDPConfig

        qsdp = QSDP(QSDPConfig.from_preset("w8g4", exclude=["model.wte"]))   # or QSDP("w8g4")
        trainer = Trainer(model=model, parallelism_config={"fsdp": FSDP2Config()}, algorithms=[qsdp], ...)
        trainer.fit()
        print(qsdp.traffic().summary())

    Args:
        config: a :class:`~composer_qsdp.QSDPConfig` (its ``policy`` ``"fixed"``: these settings throughout; or
            ``"auto"``: start unquantized, measure the network and each unit's compute over the first steps, then
            choose per unit and side among the candidates of its ``auto_options``, :mod:`composer_qsdp.auto`; the
            README's "policy=auto"), or the name of a preset (:meth:`QSDPConfig.preset_names
            <composer_qsdp.QSDPConfig.preset_names>`; default ``"w8g8"``: 8-bit weights and gradients, min-max
            codec, stochastic rounding, buckets of 1024 elements).

    Raises:
        TypeError: keyword options (the removed spellings ``QSDP(weight_bits=8)``, ``QSDP(preset=...)``,
            ``QSDP(policy=...)``), naming the one spelling.
        ValueError: anything but a ``QSDPConfig`` or a preset name, or an unknown preset name, naming the allowed
            ones and the closest.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> QSDP:
        # Only to name the one spelling where a removed one is used (0.x took flat keyword options, preset=,
        # recipe=, policy=, auto_options=); __init__ itself takes the config alone.
        options = {key: value for key, value in kwargs.items() if key != "config"}
        if options:
            preset = options.pop("preset", options.pop("recipe", DEFAULT_PRESET))
            given = "".join(f", {key}={value!r}" for key, value in options.items())
            raise TypeError(f"QSDP takes one QSDPConfig or a preset name, not keyword options "
                            f"({', '.join(sorted(kwargs))}); write QSDP(QSDPConfig.from_preset({preset!r}{given}))")
        return super().__new__(cls)

    def __init__(self, config: QSDPConfig | str = DEFAULT_PRESET) -> None:
        self.config: QSDPConfig = as_config(config)
        self.handle: QSDPHandle | None = None
        self.auto: AutoPolicy | None = None
        self._loaded_state: dict[str, Any] | None = None
        self._loaded_auto: dict[str, Any] | None = None
        self._logged = _zero_report()
        self._eval_traffic = _zero_report()
        self._eval_start: TrafficReport | None = None

    @property
    def policy(self) -> str:
        """The config's policy, ``"fixed"`` or ``"auto"``."""
        return self.config.policy

    def __repr__(self) -> str:
        if self.policy == "auto":
            return "QSDP(policy='auto')"
        name = f"{self.config.preset!r}, " if self.config.preset else ""
        return f"QSDP({name}weight_bits={self.config.weights.bits}, grad_bits={self.config.grads.bits})"

    def preset_label(self) -> str:
        """What the hyperparameter ``qsdp/preset`` records: the preset's name when the config equals it exactly,
        ``"NAME+custom"`` for the preset ``NAME`` with changed options, ``"custom"`` for a ``QSDPConfig`` that no
        preset equals, ``"auto"`` under ``policy="auto"`` (the policy chooses the settings)."""
        if self.policy == "auto":
            return "auto"
        exact = self.config.matching_preset()
        if exact is not None:
            return exact
        return f"{self.config.preset}+custom" if self.config.preset else "custom"

    def match(self, event: Event, state: State) -> bool:
        if event == Event.INIT:  # before the Trainer wraps the model: the FSDP units can still be chosen
            return state.fsdp_config is not None
        if event == Event.AFTER_LOAD:
            return self.handle is None
        if self.handle is None:
            return False
        if event in _CHECKPOINT_EVENTS:  # only where a checkpoint is about to be written: the check syncs the host
            return self.config.check_finite and any(_saves_now(cb, state, event) for cb in state.callbacks)
        if event in (Event.FIT_START, Event.BATCH_START):  # after an evaluation that raised before its EVAL_END
            return self.handle.weight_gathers != "quantized"
        if event == Event.AFTER_TRAIN_BATCH:  # inside the optimizer's step closure, after the pre-step hook
            return self.handle.speculation is not None
        return event in (Event.BATCH_END, Event.FIT_END, *_EVAL_STARTS, *_EVAL_ENDS)

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        assert event in (Event.INIT, Event.AFTER_LOAD) or self.handle is not None
        if event == Event.INIT:
            per_block_fsdp_units(state.model)
            if not any(isinstance(cb, QSDPResiduals) for cb in state.callbacks):
                state.callbacks.append(QSDPResiduals(self, state))
        elif event == Event.AFTER_LOAD:
            self._install(state, logger)
        elif event == Event.BATCH_END:
            if self.auto is not None and self.auto.phase != "done":
                self._auto_step(logger)
            self._log_batch(logger)
        elif event in _CHECKPOINT_EVENTS:
            self._refuse_nonfinite_checkpoint(state)
        elif event == Event.AFTER_TRAIN_BATCH:
            self.handle.on_backward_end()
        elif event in _EVAL_STARTS:
            self._eval_start = self.handle.traffic()
            self.handle.set_weight_gathers(self.config.eval_weights_for(state.dataloader_label or ""))
        elif event in _EVAL_ENDS:
            self.handle.set_weight_gathers("quantized")
            self._log_eval(logger)
        elif event in (Event.FIT_START, Event.BATCH_START):
            log.warning("QSDP: an evaluation ended without EVAL_END (it raised); training's weight gathers restored")
            self.handle.set_weight_gathers("quantized")
            self._eval_start = None
        else:  # FIT_END: on CUDA the per-step check lags one step; settle the last one.
            self.handle.check_finite()

    def eval_traffic(self) -> TrafficReport:
        """The part of :meth:`traffic` sent between Composer's ``EVAL_START`` and ``EVAL_END`` events, and between
        ``PREDICT_START`` and ``PREDICT_END`` (every evaluation and ``Trainer.predict`` since training began, resumes
        included); the per-batch metrics leave it out.

        An evaluation of the exact weights (``eval_weights`` ``"exact"``, the default) sends every gather
        unquantized, in the gathered dtype (bf16 under bf16 mixed precision), as plain FSDP does. Under
        ``"quantized"``, with the ``difference`` weight scheme an evaluation after an optimizer step sends that
        step's weight update (the next training step then sends none) and serves every other gather from the
        reference; direct schemes send each evaluation gather quantized.
        """
        return self._eval_traffic

    def traffic(self) -> TrafficReport:
        """Cumulative bytes this rank sent through FSDP's collectives since training began (resumes included).

        Per side (``.weights``: all-gathers, ``.grads``: reduce-scatters) and ``.total``, each with ``sent``,
        ``bf16`` (what bf16 collectives would have sent), ``native`` (what the collectives that ran would have sent
        unquantized), ``served_native`` (what the calls a scheme served from its replica would have sent),
        ``ratio_vs_bf16``, ``ratio_vs_native``, ``ratio_vs_plain_fsdp`` (``(native + served_native) / sent``:
        against plain FSDP on the same stack) and ``calls``; ``.summary()`` formats them. Counted per rank with
        NCCL's convention: (W-1)/W of each collective's volume. All zero when QSDP is not installed (e.g. world size 1).
        """
        return _zero_report() if self.handle is None else self.handle.traffic()

    # ------------------------------------------------------------------ events
    def _install(self, state: State, logger: Logger) -> None:
        adapter = check_run(state.fsdp_config_version, dist.get_world_size())
        if adapter is None:
            return
        if adapter == "fsdp1":
            self.handle = fsdp1.apply_qsdp(state.model, self.config, optimizers=state.optimizers)
        else:
            self.handle = fsdp2.apply_qsdp(state.model, self.config, optimizers=state.optimizers,
                                           comm_path=adapter.removeprefix("fsdp2-"))
        if self.policy == "auto":
            self.auto = AutoPolicy(self.handle, self.config.auto_options)
            if self._loaded_auto is not None:  # the saved choice first: the handle's state belongs to its schemes
                self.auto.load_state_dict(self._loaded_auto)
                self._loaded_auto = None
        if self._loaded_state is not None:
            self.handle.load_state_dict(self._loaded_state)
            _load_residuals(self.handle, self._loaded_state, state)
            self._loaded_state = None
        elif int(state.timestamp.batch) > 0:
            # Resumed (Composer loaded a checkpoint before AFTER_LOAD) from a checkpoint of a run without QSDP.
            warnings.warn(
                f"QSDP starts at batch {int(state.timestamp.batch)} of a resumed run whose checkpoint holds no QSDP "
                "state (it was written without QSDP): the byte counters and the rounding-noise schedule start from "
                "zero, so traffic() counts from this batch on", ResumeSettingsWarning, stacklevel=2)
        self._logged = self.handle.traffic()
        quantized = sum(u.quantized for u in self.handle.units)
        log.info("QSDP installed on %d FSDP units through %s", len(self.handle.units), self.handle.describe())
        logger.log_hyperparameters({
            "qsdp/adapter": self.handle.adapter,
            "qsdp/preset": self.preset_label(),
            "qsdp/policy": self.policy,
            "qsdp/config": self.config.summary(),
            # A string, which every logger (and the recipes' metrics file) keeps: "exact", "quantized" or
            # "val=exact, val_quantized=quantized".
            "qsdp/eval_weights": (self.config.eval_weights if isinstance(self.config.eval_weights, str) else
                                  ", ".join(f"{k}={v}" for k, v in self.config.eval_weights.items())),
            "qsdp/separate_grad_group": self.config.separate_grad_group,
            "qsdp/speculative_update": self.config.speculative_update,
            "qsdp/fsdp_units": len(self.handle.units),
            "qsdp/quantized_units": quantized,
            "qsdp/resume_changes": "; ".join(self.handle.resume_changes) or "none",
        })

    def _auto_step(self, logger: Logger) -> None:
        # BATCH_END follows the optimizer step: the step boundary at which the policy may reconfigure.
        assert self.auto is not None
        record = self.auto.on_step_end()
        if record is None:
            return  # the policy itself logs its readable line (composer_qsdp.auto.runtime)
        logger.log_hyperparameters({"qsdp/auto/event": record.event, "qsdp/auto/choice": record.choice()})
        logger.log_metrics(record.metrics())

    def _log_eval(self, logger: Logger) -> None:
        assert self.handle is not None and self._eval_start is not None
        now = self.handle.traffic()
        evaluation = now - self._eval_start
        self._eval_start = None
        self._eval_traffic = self._eval_traffic + evaluation
        self._logged = self._logged + evaluation  # the next batch's metrics count training traffic only
        logger.log_metrics({
            "qsdp/eval/weights/bytes_sent": evaluation.weights.sent,
            "qsdp/eval/weights/bytes_bf16": evaluation.weights.bf16,
            "qsdp/eval/total_bytes_sent": self._eval_traffic.total.sent,
        })

    def _log_batch(self, logger: Logger) -> None:
        assert self.handle is not None
        now = self.handle.traffic()
        batch = now - self._logged
        self._logged = now
        metrics: dict[str, float] = {
            "qsdp/weights/bytes_sent": batch.weights.sent,
            "qsdp/weights/bytes_bf16": batch.weights.bf16,
            "qsdp/grads/bytes_sent": batch.grads.sent,
            "qsdp/grads/bytes_bf16": batch.grads.bf16,
            "qsdp/compression_vs_bf16": batch.total.ratio_vs_bf16,
            "qsdp/compression_vs_unquantized": batch.total.ratio_vs_native,
            "qsdp/compression_vs_plain_fsdp": batch.total.ratio_vs_plain_fsdp,
            "qsdp/total_bytes_sent": now.total.sent,
            "qsdp/weights/bytes_inter_node": batch.weights.inter_node,
            "qsdp/grads/bytes_inter_node": batch.grads.inter_node,
            "qsdp/scheme_memory_bytes": self.handle.memory_bytes(),
            "qsdp/scheme_host_memory_bytes": self.handle.host_memory_bytes(),
        }
        speculation = self.handle.speculation
        if speculation is not None:
            metrics.update({f"qsdp/speculation/{k}": v for k, v in dataclasses.asdict(speculation.stats).items()})
        for side, error in self.handle.take_quantization_errors().items():
            metrics[f"qsdp/{side}/rel_error"] = float(error)  # a host sync, only on sampling steps
        logger.log_metrics(metrics)

    def _refuse_nonfinite_checkpoint(self, state: State) -> None:
        # Algorithms run before callbacks on each event, so this runs before Composer's CheckpointSaver writes.
        bad = self.handle.nonfinite_units()
        if bad:
            saved = [path for cb in state.callbacks if isinstance(cb, CheckpointSaver) for path in cb.saved_checkpoints]
            if saved:
                resume = _load_path(saved[-1])
                last = (f"the last checkpoint written is {resume}: resume from it (load_path={resume}) with a lower "
                        "learning rate or gradient clipping")
            else:
                last = "no checkpoint was written before: start again with a lower learning rate or gradient clipping"
            raise NonFiniteWeightError(
                f"refusing to write the checkpoint at batch {int(state.timestamp.batch)}: the full-precision weights "
                f"of unit(s) {bad} hold NaN or Inf (the run has diverged); {last}."
            )

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["qsdp_config"] = self.config.summary()  # what the run was configured with, for readers of checkpoints
        if self.handle is not None:
            state["qsdp"] = self.handle.state_dict()
            for unit in state["qsdp"]["units"]:  # each rank's own: QSDPResiduals saves them from every rank
                unit["grads"].pop("residual", None)
            state["qsdp_eval_traffic"] = self._eval_traffic.state_dict()
        if self.auto is not None:
            state["qsdp_auto"] = self.auto.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # Composer loads checkpoints before AFTER_LOAD, i.e. before the handle exists: keep it until install.
        if "qsdp_auto" in state and self.policy == "auto":
            if self.auto is None:
                self._loaded_auto = state["qsdp_auto"]
            else:
                self.auto.load_state_dict(state["qsdp_auto"])
        if "qsdp_eval_traffic" in state:
            self._eval_traffic = TrafficReport.from_state_dict(state["qsdp_eval_traffic"])
        if "qsdp" in state:
            if self.handle is None:
                self._loaded_state = state["qsdp"]
            else:
                self.handle.load_state_dict(state["qsdp"])


class QSDPFromYaml(Algorithm):
    """What yaml registries build for ``algorithms: {qsdp: {...}}``: ``QSDPFromYaml(**keys)`` returns
    ``QSDP(QSDPConfig.from_preset(preset, **other keys))``, a :class:`QSDP` (``preset``: the section's ``preset`` key,
    else ``"w8g8"``; the other keys: the flat options of :meth:`QSDPConfig.from_preset
    <composer_qsdp.QSDPConfig.from_preset>`, ``policy`` and ``auto_options`` among them). This package's recipes and
    llm-foundry's (through the ``llmfoundry_algorithms`` entry point) both build it so; in Python, write ``QSDP(config)``.

    A class rather than a function because llm-foundry's registry accepts only ``Algorithm`` subclasses; no instance
    of it is ever made.

    Raises:
        ValueError: an unknown preset or option, or a value out of range (:meth:`QSDPConfig.from_preset`).
    """

    def __new__(cls, preset: str = DEFAULT_PRESET, **options: Any) -> QSDP:  # type: ignore[misc]
        return QSDP(QSDPConfig.from_preset(preset, **options))


class QSDPResiduals(Callback):
    """Carries each rank's scheme state that differs per rank (LoCo's residual pieces) into sharded checkpoints.

    Composer writes algorithm state as one object from rank 0; a callback's state dict is a mapping that
    ``torch.distributed.checkpoint`` walks, so the ``Shard(0)`` pieces in it are written by their own ranks, with no
    collective. Full checkpoints, written by rank 0 alone, get an empty state. QSDP adds this callback itself.
    """

    def __init__(self, algorithm: QSDP, state: State) -> None:
        self.algorithm, self.state = algorithm, state

    def state_dict(self) -> dict[str, Any]:
        """``{"units": {unit index: this rank's piece}}`` for a sharded checkpoint of an installed QSDP, else ``{}``
        (also while Composer builds the template it loads into: the pieces are read at install, once their sizes
        are known)."""
        handle = self.algorithm.handle
        if handle is None or not self.state.fsdp_sharded_state_dict_enabled:
            return {}
        return {"units": _pieces(handle)}


def _pieces(handle: QSDPHandle) -> dict[str, Any]:
    """Each unit's per-rank residual piece (gradient side), by unit index."""
    pieces = {}
    for i, unit in enumerate(handle.units):
        piece = unit.grads.state_dict().get("residual")
        if piece is not None:
            pieces[str(i)] = piece
    return pieces


def _load_residuals(handle: QSDPHandle, saved: dict[str, Any], state: State) -> None:
    """Read this rank's residual pieces from the local sharded checkpoint Composer resumed from, in place.

    ``handle`` has loaded ``saved``, so its schemes hold zero pieces of the saved sizes (none where the number of
    ranks changed). Where the checkpoint is not a local sharded folder or holds no pieces (a full checkpoint, one
    written before pieces existed), nothing is read and each scheme warns at its first reduce-scatter.
    """
    pieces = _pieces(handle)
    path = state.load_path
    if not pieces or not state.fsdp_sharded_state_dict_enabled or not path or not os.path.isdir(path):
        return
    import torch.distributed.checkpoint as dist_cp  # imported here: it costs seconds and only resumes need it

    reader = dist_cp.FileSystemReader(path)
    prefix = f"state.callbacks.{QSDPResiduals.__qualname__}.units."
    stored = reader.read_metadata().state_dict_metadata
    if any(prefix + i not in stored for i in pieces):
        return
    dist_cp.load({"state": {"callbacks": {QSDPResiduals.__qualname__: {"units": pieces}}}}, storage_reader=reader)
    for i, piece in pieces.items():
        handle.units[int(i)].grads.load_state_dict({**saved["units"][int(i)]["grads"], "residual": piece})


_CHECKPOINT_EVENTS = (Event.BATCH_CHECKPOINT, Event.EPOCH_CHECKPOINT, Event.ITERATION_CHECKPOINT)
# Where a forward that is no training step begins and ends: an evaluation, or Trainer.predict (label "predict").
_EVAL_STARTS = (Event.EVAL_START, Event.PREDICT_START)
_EVAL_ENDS = (Event.EVAL_END, Event.PREDICT_END)


def _saves_now(callback: Any, state: State, event: Event) -> bool:
    """Whether Composer's ``CheckpointSaver`` ``callback`` writes a checkpoint at this event (its own test)."""
    if not isinstance(callback, CheckpointSaver):
        return False
    return bool(callback.save_interval(state, event)) and callback.last_checkpoint_batch != state.timestamp.batch


def _zero_report() -> TrafficReport:
    return TrafficReport(TrafficCounter(), TrafficCounter())



def _load_path(saved: str) -> str:
    """What ``load_path`` takes to resume from a checkpoint Composer saved: the folder of a sharded checkpoint (Composer
    records one rank's ``.distcp`` file inside it), else the file itself."""
    path = Path(saved)
    return str(path.parent) if path.suffix == ".distcp" else saved
