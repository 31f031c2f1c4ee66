"""``LoCoReduceScatter``: the flat quantized reduce-scatter with LoCo's error feedback on each rank.

LoCo (Xie, Lin, Toh, Zhou, "LoCo: Low-Bit Communication Adaptor for Large-scale Model Training", 2024; abstract)
compensates each rank's gradient, before it is compressed, with a moving average of its past compression errors,
and works with FSDP's all-to-all gradient aggregation and with Adam. DeepSpeed's ZeRO++ carries it as
``all_to_all_loco_quant_reduce`` (``zeropp_loco_param``: ``err_beta`` 0.8, ``reset_T`` 1024 by default) with this
recursion on every rank, per gradient tensor, which this scheme follows::

    c_t = g_t + e_{t-1}                          # compensate
    send encode(c_t)                             # the flat reduce-scatter's chunks (all W, one all-to-all)
    e_t = beta * e_{t-1} + (1 - beta) * (c_t - decode(encode(c_t)))

``beta = 0`` is classic error feedback (the sum of what a rank sends tracks the sum of its gradients up to one
residual). The owner decodes and sums the ``W`` versions as :class:`FlatReduceScatter` does, so the result is
SUM/AVG of the compensated gradients.

What the residual is, and what it costs:

* one per rank and unit, ``W * n`` elements (the unit's padded, unsharded gradient: every destination chunk a
  rank encodes), in ``residual_dtype``: fp32 (default; 4 bytes per parameter of the unit, i.e. an unsharded fp32
  copy of the unit's gradient on every rank), bf16 (2 bytes) or int8 (LoCo's compressed error: the 8-bit
  symmetric codec's wire, :class:`~composer_qsdp.quant.CodedResidual`, with one fp32 scale per bucket of the
  gradient codec's ``bucket_size``: ``1 + 4 / bucket_size`` bytes). The update is always computed in fp32 and
  rounded once per call into the storage; :meth:`memory_bytes` reports it.
* one update per reduce-scatter call: with gradient accumulation FSDP reduce-scatters every microbatch, and each
  microbatch's gradient is compensated and updates the residual in turn.
* FSDP's padding of uneven shards is part of the ``W * n`` elements like any other: its gradient is zero, its
  residual carries only the codec's error there, and FSDP never reads the padding of a reduce-scatter's output.
* extra work per call: the residual read and written once more by the encode. On CUDA the min-max codec (rotated or
  not) compensates, encodes, decodes and updates the residual in one kernel pass
  (:meth:`~composer_qsdp.quant.Codec.encode_rows_feedback`); other codecs, and CPU tensors, take the reference's
  separate passes (a local decode of the ``W`` encoded chunks and elementwise fp32 passes over ``W * n`` values).
* a NaN/Inf gradient still reaches the output (a grad scaler skips the step), but the residual's non-finite
  entries are reset to zero (DeepSpeed drops the whole buffer on overflow).
* ``reset_every``: the residual is zeroed every this many optimizer steps (DeepSpeed's ``reset_T``; 0: never).
* FSDP reduce-scatters only the parameters of a unit that have gradients: when that set changes (layers frozen or
  unfrozen mid-run, e.g. by Composer's ``LayerFreezing``), the residual restarts from zero in the new layout, with a
  :class:`LoCoResidualWarning`, as a reset would.
* ``residual_on_host``: the residual lives in pinned host memory instead of device memory; each call copies it to the
  device and the updated one back (:class:`~composer_qsdp.schemes.host_copies.HostCopies`): no device memory between
  calls, the same results, the residual's bytes over the host link each way per call.

Checkpoints: :meth:`state_dict` holds this rank's residual as its own piece, with no communication: a ``DTensor``
over a 1-D mesh of the scheme's group, ``Shard(0)``, local shape ``(1, W * n)`` (int8: ``(1, W * b)``, the ``W``
wire rows of ``b`` bytes), global ``(W, ...)``, so
``torch.distributed.checkpoint`` writes each rank's piece from that rank and reads it back into the same rank. A
fresh scheme cannot know the residual's size before its first call: loading takes two passes (load the state,
:meth:`load_state_dict`, whose ``residual_numel`` makes :meth:`state_dict` hold a zero piece of the saved size, then
load that piece in place and :meth:`load_state_dict` again). A resume on another number of ranks, from a state
without the piece (a full, non-sharded checkpoint), or across the int8 storage and a float one, starts the residuals
from zero with a :class:`LoCoResidualWarning` naming why: a residual is the error of one rank's chunks of one
partition and means nothing on another. fp32 and bf16 residuals load into each other.

:class:`LoCoFeedback` holds all of this (options, storage, reset clock, checkpoint piece, resume rules) for any
gradient scheme that keeps one such residual per rank; ``two_level_loco``
(:class:`~composer_qsdp.schemes.two_level_loco.TwoLevelLoCoReduceScatter`) shares it for its inter-node hop.
"""

from __future__ import annotations

import warnings
from abc import abstractmethod
from typing import Any

import torch
import torch.distributed as dist

from composer_qsdp.comm import CallTraffic
from composer_qsdp.quant import Codec, CodedResidual, SymmetricCodec
from composer_qsdp.schemes.base import GradScheme
from composer_qsdp.schemes.flat import FlatReduceScatter
from composer_qsdp.schemes.host_copies import HostCopies
from composer_qsdp.validate import check_bool, check_choice, check_int, is_fraction

__all__ = ["RESIDUAL_DTYPES", "LoCoFeedback", "LoCoReduceScatter", "LoCoResidualWarning", "check_feedback_options"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int8": torch.int8}
#: The residual storages: a float dtype, or int8 codes (:class:`~composer_qsdp.quant.CodedResidual`).
RESIDUAL_DTYPES = tuple(_DTYPES)


def check_feedback_options(scheme: str, beta: object, reset_every: object, residual_dtype: object,
                           residual_on_host: object = False) -> None:
    """Raise the ``ValueError`` that the error-feedback scheme ``scheme`` raises for these options, building nothing:
    ``beta`` must be in [0, 1), ``reset_every`` an integer >= 0, ``residual_dtype`` one of :data:`RESIDUAL_DTYPES`,
    ``residual_on_host`` a bool."""
    if not is_fraction(beta):
        raise ValueError(f"beta={beta!r} is invalid for the {scheme} gradient scheme; allowed: a number in [0, 1)")
    check_int("reset_every", reset_every)
    check_choice("residual_dtype", residual_dtype, RESIDUAL_DTYPES)
    check_bool("residual_on_host", residual_on_host)


class LoCoResidualWarning(UserWarning):
    """LoCo's error-feedback residuals restart from zero: on a resume (another number of ranks, or no saved piece),
    or when the unit's parameters with gradients change (another gradient layout)."""


class LoCoFeedback(GradScheme):
    """A gradient scheme with one LoCo error-feedback residual per rank (see the module docstring): its options,
    storage, reset clock, checkpoint piece and resume rules.

    A subclass calls :meth:`_init_feedback` in its constructor, hands :meth:`_residual_for` to its collective, and
    says what the residual covers: :meth:`_residual_rows`, :meth:`_residual_numel` and, when the residual's meaning
    depends on more than the group's size, :meth:`_partition`.

    Attributes:
        beta: the residual's moving-average coefficient, in ``[0, 1)``.
        reset_every: optimizer steps between zeroings of the residual (0: never).
        residual_dtype: the residual's storage (``torch.float32``, ``torch.bfloat16``, or ``torch.int8``: codes).
        residual_on_host: the residual lives in pinned host memory; each call copies it to the device and back.
        residual: this rank's residual (a float tensor, or a :class:`~composer_qsdp.quant.CodedResidual` of
            :meth:`_residual_rows` rows), ``None`` before the first call that feeds one back.
    """

    def _init_feedback(self, beta: float, reset_every: int, residual_dtype: str, residual_on_host: bool) -> None:
        """Check and keep the options (after :meth:`Scheme.__init__` set the codec).

        Raises:
            ValueError: no codec, or an option out of range, naming it and what is allowed.
        """
        if self.codec is None:
            raise ValueError(f"the {self.name} gradient scheme feeds back quantization errors and needs a codec "
                             "(grad bits)")
        check_feedback_options(self.name, beta, reset_every, residual_dtype, residual_on_host)
        self.residual_on_host = residual_on_host
        self._host = HostCopies()  # with residual_on_host: the copies to and from the residual
        self._work: torch.Tensor | CodedResidual | None = None  # the device copy of a host residual, within a call
        self.beta = float(beta)
        self.reset_every = reset_every
        self.residual_dtype = _DTYPES[residual_dtype]
        self.residual: torch.Tensor | CodedResidual | None = None
        self._steps_since_reset = 0
        self._restored: torch.Tensor | CodedResidual | None = None
        self._pending = ""  # why a restored residual is still the zero template ("" once its piece is loaded)
        self._meshes: dict[str, Any] = {}

    @abstractmethod
    def _residual_rows(self) -> int:
        """Rows of the residual on this scheme's group (the rows its collective encodes with feedback)."""

    @abstractmethod
    def _residual_numel(self, input: torch.Tensor) -> int:
        """Elements of the residual that a reduce-scatter of ``input`` (``W * n`` elements) feeds back."""

    def _partition(self) -> dict[str, int]:
        """What a residual's meaning depends on besides its size, saved with it and compared on a resume: the
        group's size (a residual is the error of one rank's chunks of one partition)."""
        assert self.group is not None
        return {"residual_ranks": self.group.size()}

    def _residual_for(self, input: torch.Tensor) -> torch.Tensor | CodedResidual:
        """This rank's residual for a reduce-scatter of ``input``: the restored one, or zeros, the first time."""
        numel = self._residual_numel(input)
        if self._restored is not None:
            restored, pending, self._restored, self._pending = self._restored, self._pending, None, ""
            if _elements(restored) != numel:
                warnings.warn(f"the {self.name} gradient scheme's error-feedback residual restarts from zero: the "
                              f"state it resumed from holds {_elements(restored)} elements and this reduce-scatter "
                              f"feeds back {numel} (another gradient layout)", LoCoResidualWarning, stacklevel=4)
            else:
                if pending:
                    warnings.warn(pending, LoCoResidualWarning, stacklevel=4)
                self.residual = self._at_home(restored, input.device)
        if self.residual is not None and _elements(self.residual) != numel:
            # FSDP reduce-scatters only the unit's parameters that have gradients, so the layout changes when some
            # are frozen or unfrozen mid-run: a residual of the old layout would feed errors into the wrong elements.
            warnings.warn(f"the {self.name} gradient scheme's error-feedback residual restarts from zero: it holds "
                          f"{_elements(self.residual)} elements and this reduce-scatter feeds back {numel} (the "
                          "unit's parameters with gradients changed, e.g. layers frozen or unfrozen)",
                          LoCoResidualWarning, stacklevel=4)
            self._host.settle()  # a copy back to the old residual must land before it is dropped
            self.residual = None
        if self.residual is None:
            self.residual = self._at_home(self._zero_residual(numel, input.device), input.device)
        if not self.residual_on_host:
            return self.residual
        self._work = _with_storage(self.residual, self._host.to_device(_storage(self.residual), input.device))
        return self._work

    def _at_home(self, residual: torch.Tensor | CodedResidual, device: torch.device) -> torch.Tensor | CodedResidual:
        """``residual`` where this scheme keeps it for calls on ``device``: there, or in (pinned) host memory."""
        if not self.residual_on_host:
            return residual.to(device)
        storage = _storage(residual)
        host = HostCopies.empty(storage.numel(), storage.dtype, device).view(storage.shape)
        host.copy_(storage)
        return _with_storage(residual, host)

    def _reduce_scatter(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        op: dist.ReduceOp | dist.ReduceOp.RedOpType,
        seed: int,
        group: dist.ProcessGroup,
        measure_error: bool,
        overwrite_input: bool,
    ) -> CallTraffic:
        traffic = super()._reduce_scatter(  # type: ignore[safe-super]
            output, input, op, seed, group, measure_error, overwrite_input
        )
        if self._work is not None:  # the call updated the device copy of a host residual: write it back
            assert self.residual is not None
            self._host.copy(_storage(self.residual), _storage(self._work))
            self._work = None
        return traffic

    def _zero_residual(self, numel: int, device: torch.device | str) -> torch.Tensor | CodedResidual:
        """A zero residual of ``numel`` elements (:meth:`_residual_rows` rows) in this scheme's storage."""
        if self.residual_dtype != torch.int8:
            return torch.zeros(numel, dtype=self.residual_dtype, device=device)
        assert self.codec is not None
        rows = self._residual_rows()
        # Buckets of the gradient codec's size: the fused feedback kernel quantizes each bucket it holds.
        return CodedResidual(SymmetricCodec(8, self.codec.bucket_size), rows, numel // rows, device)

    def on_optimizer_step(self) -> None:
        self._steps_since_reset += 1
        if self.reset_every and self._steps_since_reset >= self.reset_every:
            self._steps_since_reset = 0
            if self.residual is not None:
                self._host.settle()  # a copy back still on its way must not land after the zeros
                self.residual.zero_()

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Byte counters, the reset clock and this rank's residual, without communication.

        ``residual_numel`` (0 before the first call) and the :meth:`_partition` keys (``residual_ranks``...) are the
        same on every rank; ``residual`` (absent before the first call) is this rank's piece: a ``DTensor`` over a
        1-D mesh of the scheme's group, ``Shard(0)``, local ``(1, residual_numel)`` viewing the residual itself, so
        a checkpoint loader that fills it in place restores the residual.
        """
        if self.group is None:
            raise RuntimeError(f"{type(self).__name__}.state_dict was called before setup(group, topology)")
        state = super().state_dict()
        self._host.settle()
        state["steps_since_reset"] = self._steps_since_reset
        local = self.residual if self.residual is not None else self._restored
        state.update(self._partition())
        state["residual_numel"] = 0 if local is None else _elements(local)
        state["residual_dtype"] = self._dtype_name()
        if local is not None:
            state["residual"] = self._piece(_storage(local))
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (after :meth:`setup`).

        A state of the same partition (:meth:`_partition`: the group's size...) with ``residual_numel`` elements
        makes the residual a zero template of that size (what :meth:`state_dict` then offers a checkpoint loader);
        its ``residual`` piece, when present, is copied in. A state of another partition starts from zero with a
        :class:`LoCoResidualWarning`; a template whose piece never arrives, or that does not fit the first
        reduce-scatter, warns the same way then.

        Raises:
            ValueError: a ``residual`` piece of another shape than ``(1, residual_numel)``.
            RuntimeError: called before :meth:`setup`.
        """
        if self.group is None:
            raise RuntimeError(f"{type(self).__name__}.load_state_dict was called before setup(group, topology)")
        super().load_state_dict(state)
        self._steps_since_reset = int(state.get("steps_since_reset", 0))
        self.residual = self._restored = None
        self._pending = ""
        numel, now = int(state.get("residual_numel", 0)), self._partition()
        if numel == 0:
            return
        saved = {key: state.get(key) for key in now}
        if saved != now:
            warnings.warn(f"the {self.name} gradient scheme's error-feedback residuals restart from zero: they were "
                          f"saved by {_partition_text(saved)} and this run has {_partition_text(now)}; each is the "
                          "error of one rank's chunks of that partition and means nothing on another",
                          LoCoResidualWarning, stacklevel=2)
            return
        saved_dtype, dtype = state.get("residual_dtype", "float32"), self._dtype_name()
        if (saved_dtype == "int8") != (dtype == "int8"):
            warnings.warn(f"the {self.name} gradient scheme's error-feedback residuals restart from zero: they were "
                          f"saved as {saved_dtype} and this run stores them as {dtype} (residual_dtype); int8 codes "
                          "and floats do not load into each other", LoCoResidualWarning, stacklevel=2)
            return
        self._restored = self._zero_residual(numel, "cpu")
        piece = state.get("residual")
        if piece is None:
            self._pending = (f"the {self.name} gradient scheme's error-feedback residual restarts from zero: the "
                             f"state it resumed from names one of {numel} elements, but this rank's piece was never "
                             "loaded (a full, non-sharded checkpoint holds none; under Composer they are read "
                             "from a local sharded checkpoint folder)")
            return
        local = piece.to_local() if hasattr(piece, "to_local") else piece
        storage = _storage(self._restored)
        if tuple(local.shape) != (1, storage.numel()):
            raise ValueError(f"the {self.name} gradient scheme's saved residual piece has shape {tuple(local.shape)}; "
                             f"this state needs (1, {storage.numel()}) (this rank's residual of {numel} elements as "
                             f"{self._dtype_name()})")
        storage.copy_(local.view(storage.shape))

    def _piece(self, local: torch.Tensor) -> Any:
        # Imported here: torch.distributed.tensor costs seconds to import and only checkpoints need it.
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.tensor import DTensor, Shard

        assert self.group is not None
        kind = local.device.type
        if kind not in self._meshes:
            self._meshes[kind] = DeviceMesh.from_group(self.group, kind)
        world, numel = self.group.size(), local.numel()
        return DTensor.from_local(local.view(1, numel), self._meshes[kind], [Shard(0)], run_check=False,
                                  shape=torch.Size([world, numel]), stride=(numel, 1))

    def memory_bytes(self) -> int:
        """Device bytes of this rank's residual (its storage: floats, or int8 codes and their scales); 0 without one
        or with ``residual_on_host``."""
        return 0 if self.residual_on_host else self._residual_bytes()

    def host_memory_bytes(self) -> int:
        return self._residual_bytes() if self.residual_on_host else 0

    def _residual_bytes(self) -> int:
        if self.residual is None:
            return 0
        storage = _storage(self.residual)
        return storage.numel() * storage.element_size()

    def _dtype_name(self) -> str:
        return str(self.residual_dtype).removeprefix("torch.")

    def _feedback_text(self) -> str:
        """The feedback's settings, for :meth:`describe`."""
        reset = f", reset every {self.reset_every} steps" if self.reset_every else ""
        host = " in host memory" if self.residual_on_host else ""
        return f"LoCo error feedback (beta {self.beta:g}, {self._dtype_name()} residual{host}{reset})"


class LoCoReduceScatter(LoCoFeedback, FlatReduceScatter):
    """Flat quantized reduce-scatter with a per-rank error-feedback residual (see the module docstring).

    Args:
        codec: the gradient quantizer (any codec; stochastic or nearest rounding).
        error_sample_interval: measure the relative quantization error of the compensated chunks every this many
            calls (0: never).
        beta: the residual's moving-average coefficient, in ``[0, 1)`` (DeepSpeed's ``err_beta``; 0: classic
            error feedback).
        reset_every: zero the residual every this many optimizer steps (DeepSpeed's ``reset_T``; 0: never).
        residual_dtype: how the residual is stored between calls: ``"float32"``, ``"bfloat16"`` or ``"int8"`` (8-bit
            symmetric codes, one fp32 scale per bucket of the codec's ``bucket_size``).
        residual_on_host: keep the residual in pinned host memory and copy it to the device for each call and back.

    Attributes:
        residual: this rank's residual (``W * n`` elements: a float tensor, or a
            :class:`~composer_qsdp.quant.CodedResidual` of ``W`` rows), ``None`` before the first call.

    Raises:
        ValueError: no codec, or an option out of range, naming it and what is allowed.
    """

    name = "loco"

    def __init__(self, codec: Codec | None, error_sample_interval: int = 0, beta: float = 0.8,
                 reset_every: int = 0, residual_dtype: str = "float32", residual_on_host: bool = False) -> None:
        super().__init__(codec, error_sample_interval)
        self._init_feedback(beta, reset_every, residual_dtype, residual_on_host)

    def _feedback(self, input: torch.Tensor) -> dict[str, Any]:
        return {"residual": self._residual_for(input), "residual_beta": self.beta}

    def _residual_rows(self) -> int:
        assert self.group is not None
        return self.group.size()  # every destination chunk

    def _residual_numel(self, input: torch.Tensor) -> int:
        return input.numel()

    def describe(self) -> str:
        return f"{super().describe()} with {self._feedback_text()}"


def _partition_text(partition: dict[str, Any]) -> str:
    """``{"residual_ranks": 4, "residual_nodes": 2}`` as ``"4 ranks on 2 nodes"`` (for the resume warning)."""
    text = f"{partition.get('residual_ranks')} ranks"
    return f"{text} on {partition['residual_nodes']} nodes" if "residual_nodes" in partition else text


def _storage(residual: torch.Tensor | CodedResidual) -> torch.Tensor:
    """The tensor that holds a residual: itself, or a coded residual's wire rows."""
    return residual.wire if isinstance(residual, CodedResidual) else residual


def _with_storage(residual: torch.Tensor | CodedResidual, storage: torch.Tensor) -> torch.Tensor | CodedResidual:
    """A residual like ``residual`` held in ``storage`` (a tensor of its storage's shape and dtype)."""
    return residual.with_wire(storage) if isinstance(residual, CodedResidual) else storage


def _elements(residual: torch.Tensor | CodedResidual) -> int:
    """Elements of a residual (its rows times their length, whatever its storage)."""
    if isinstance(residual, CodedResidual):
        return residual.rows * residual.numel
    return residual.numel()
