"""QSDP as a Composer algorithm: quantized FSDP2 weight all-gathers and gradient reduce-scatters."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from composer.core import Algorithm, Event, State
from composer.loggers import Logger
from composer.utils import dist

from composer_qsdp.comm import TrafficCounter
from composer_qsdp.fsdp import QSDPConfig, QSDPHandle, TrafficReport, apply_qsdp, check_custom_comm_support

__all__ = ["QSDP", "check_run"]

log = logging.getLogger(__name__)


def check_run(fsdp_config_version: int, world_size: int) -> bool:
    """Validate a Composer run for QSDP; ``True`` when there is traffic to quantize.

    Args:
        fsdp_config_version: ``State.fsdp_config_version`` (0: no FSDP, 1: FSDP1, 2: FSDP2).
        world_size: ranks in the run.

    Returns:
        ``False`` (after a warning) when ``world_size`` is 1: FSDP then communicates nothing.

    Raises:
        RuntimeError: torch < 2.9 (no FSDP2 custom collectives).
        ValueError: the run does not use FSDP2, naming how to switch it on.
    """
    check_custom_comm_support()
    if fsdp_config_version == 0:
        raise ValueError(
            "QSDP quantizes FSDP's all-gathers and reduce-scatters, but this run does not use FSDP. Pass "
            "Trainer(parallelism_config={'fsdp': FSDP2Config(...)}) (or a dict with the environment variable "
            "FSDP_VERSION=2), or remove the QSDP algorithm."
        )
    if fsdp_config_version == 1:
        raise ValueError(
            "QSDP supports FSDP2 (torch.distributed.fsdp.fully_shard) only, but this run uses FSDP1. Set the "
            "environment variable FSDP_VERSION=2 (for a dict parallelism_config['fsdp']) or pass "
            "composer.utils.FSDP2Config as parallelism_config['fsdp']."
        )
    if fsdp_config_version != 2:
        raise ValueError(f"unknown fsdp_config_version={fsdp_config_version!r}; QSDP supports 2 (FSDP2)")
    if world_size == 1:
        warnings.warn("QSDP does nothing with world size 1: FSDP sends no traffic to quantize", stacklevel=2)
        return False
    return True


class QSDP(Algorithm):
    """Quantize FSDP2's weight all-gathers and gradient reduce-scatters (QSDP, Markov et al., ICML 2023).

    Installs at ``Event.AFTER_LOAD`` (the model is wrapped and any checkpoint loaded, no forward has run):
    every FSDP unit gets a quantized all-gather (its shard is encoded, the bytes gathered, every rank decodes
    all shards, so all ranks compute with identical weights) and a quantized reduce-scatter (gradient
    chunks encoded, exchanged all-to-all, decoded and summed in fp32). The sharded full-precision weights,
    the optimizer and checkpoints are untouched. Logs bytes sent, the compression against bf16 and sampled
    quantization errors at every ``BATCH_END``.

    The keyword arguments are those of :class:`~composer_qsdp.fsdp.QSDPConfig` (see it for details);
    the defaults are the paper's headline setting, 8-bit weights and 8-bit gradients with the min-max codec's
    stochastic rounding and buckets of 1024 elements.

    Example::

        from composer import Trainer
        from composer_qsdp import QSDP

        qsdp = QSDP(weight_bits=8, grad_bits=8)
        trainer = Trainer(model=model, parallelism_config={"fsdp": FSDP2Config()}, algorithms=[qsdp], ...)
        trainer.fit()
        print(qsdp.traffic().summary())

    Raises:
        ValueError: at construction, for options out of range.
    """

    def __init__(
        self,
        weight_bits: int | None = 8,
        grad_bits: int | None = 8,
        weight_codec: str = "minmax",
        grad_codec: str = "minmax",
        bucket_size: int = 1024,
        weight_rounding: str | None = None,
        grad_rounding: str | None = None,
        weight_codec_options: Mapping[str, Any] | None = None,
        grad_codec_options: Mapping[str, Any] | None = None,
        min_numel: int = 0,
        exclude: Sequence[str] = (),
        weight_bits_overrides: Mapping[str, int | None] | None = None,
        grad_bits_overrides: Mapping[str, int | None] | None = None,
        seed: int = 0,
        check_finite: bool = True,
        error_sample_interval: int = 100,
    ) -> None:
        self.config = QSDPConfig(
            weight_bits=weight_bits,
            grad_bits=grad_bits,
            weight_codec=weight_codec,
            grad_codec=grad_codec,
            bucket_size=bucket_size,
            weight_rounding=weight_rounding,
            grad_rounding=grad_rounding,
            weight_codec_options=weight_codec_options or {},
            grad_codec_options=grad_codec_options or {},
            min_numel=min_numel,
            exclude=exclude,
            weight_bits_overrides=weight_bits_overrides or {},
            grad_bits_overrides=grad_bits_overrides or {},
            seed=seed,
            check_finite=check_finite,
            error_sample_interval=error_sample_interval,
        )
        self.handle: QSDPHandle | None = None
        self._loaded_state: dict[str, Any] | None = None
        self._logged = _zero_report()

    def __repr__(self) -> str:
        return f"QSDP(weight_bits={self.config.weight_bits}, grad_bits={self.config.grad_bits})"

    def match(self, event: Event, state: State) -> bool:
        if event == Event.AFTER_LOAD:
            return self.handle is None
        return self.handle is not None and event in (Event.BATCH_END, Event.FIT_END)

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        if event == Event.AFTER_LOAD:
            self._install(state, logger)
        elif event == Event.BATCH_END:
            self._log_batch(logger)
        else:  # FIT_END: on CUDA the per-step check lags one step; settle the last one.
            assert self.handle is not None
            self.handle.check_finite()

    def traffic(self) -> TrafficReport:
        """Cumulative bytes this rank sent through FSDP's collectives since training began (resumes included).

        Per side (``.weights``: all-gathers, ``.grads``: reduce-scatters) and ``.total``, each with ``sent``,
        ``bf16`` (what bf16 collectives would have sent), ``native`` (what unquantized FSDP would have sent),
        ``ratio_vs_bf16`` and ``calls``; ``.summary()`` formats them. Counted per rank with NCCL's convention:
        (W-1)/W of each collective's volume. All zero when QSDP is not installed (e.g. world size 1).
        """
        return _zero_report() if self.handle is None else self.handle.traffic()

    # ------------------------------------------------------------------ events
    def _install(self, state: State, logger: Logger) -> None:
        if not check_run(state.fsdp_config_version, dist.get_world_size()):
            return
        self.handle = apply_qsdp(state.model, self.config)
        if self._loaded_state is not None:
            self.handle.load_state_dict(self._loaded_state)
            self._loaded_state = None
        self._logged = self.handle.traffic()
        quantized = sum(u.weight_codec is not None or u.grad_codec is not None for u in self.handle.units)
        log.info("QSDP installed on %d FSDP units:\n%s", len(self.handle.units), self.handle.describe())
        logger.log_hyperparameters({
            "qsdp/config": {k: _loggable(v) for k, v in asdict(self.config).items()},
            "qsdp/fsdp_units": len(self.handle.units),
            "qsdp/quantized_units": quantized,
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
            "qsdp/total_bytes_sent": now.total.sent,
        }
        for side, error in self.handle.take_quantization_errors().items():
            metrics[f"qsdp/{side}/rel_error"] = float(error)  # a host sync, only on sampling steps
        logger.log_metrics(metrics)

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.handle is not None:
            state["qsdp"] = self.handle.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # Composer loads checkpoints before AFTER_LOAD, i.e. before the handle exists: keep it until install.
        if "qsdp" in state:
            if self.handle is None:
                self._loaded_state = state["qsdp"]
            else:
                self.handle.load_state_dict(state["qsdp"])


def _zero_report() -> TrafficReport:
    return TrafficReport(TrafficCounter(), TrafficCounter())


def _loggable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, tuple):
        return list(value)
    return value
