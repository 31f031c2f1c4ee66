"""``DifferenceAllGather``: weight-difference quantization (SDP4Bit's qWD) for a weight-freeing FSDP.

Every rank keeps a reference ``w_ref``: the unit's unsharded weights exactly as all ranks reconstructed them,
bit-identical everywhere, in the all-gather dtype. SDP4Bit (Jia et al., NeurIPS 2024, §3.1, Algorithm 4) sends
the quantized *difference* between the new weights and that reference::

    d      = shard - w_ref[own slice]          # fp32
    w_ref += decode(all_gather(encode(d)))     # every rank, the owner included
    return w_ref

so ``w~_t = w~_{t-1} + C(w_t - w~_{t-1})``: the quantization error of one step is part of the next step's
difference, and never accumulates (implicit error feedback). Differences are small and uniform, so 4-bit codes
lose almost nothing where 4-bit weights lose a lot (SDP4Bit Table 1/3: qWD within 0.06% of the baseline; direct
INT4 weights +12% at GPT-125M). The compressor may be biased (round-to-nearest): SDP4Bit's Theorem 4.1 holds for
any delta-approximate weight compressor.

When each kind of call happens:

* the first gather after an optimizer step sends the codes of the difference (an *update*);
* every other gather of the step (FSDP2's backward re-gather after ``reshard_after_forward``, later
  microbatches of a gradient accumulation, evaluation) is served from ``w_ref`` and sends nothing; it counts as
  ``served_locally``, outside the bf16 baseline, with what plain FSDP would have sent for it as
  ``served_native`` (:mod:`composer_qsdp.comm.accounting`);
* a *keyframe*, a full-precision gather that sets ``w_ref`` to the weights exactly, runs where there is no
  reference or it may be stale: the first gather, after ``on_weights_changed`` (a load, an edit outside the
  optimizer), and every ``keyframe_every`` optimizer steps if set.

Cost: ``w_ref`` is one replica of the unit's weights per rank (``memory_bytes``), the price SDP4Bit pays too
(Megatron keeps one). Checkpoints hold the reference once, per parameter in the parameters' shapes (every rank
holds the same replica), so a resumed run continues exactly, on the same or on another number of ranks.
"""

from __future__ import annotations

import enum
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from composer_qsdp.comm import CallTraffic, call_traffic, mix_seed, relative_error
from composer_qsdp.quant import FLOAT_DTYPES, Codec
from composer_qsdp.schemes.base import WeightScheme
from composer_qsdp.validate import check_int

__all__ = ["DifferenceAllGather"]


class _Next(enum.Enum):
    """What the next gather must do."""

    KEYFRAME = "keyframe"  # no (valid) reference: gather the weights in full precision
    UPDATE = "update"  # the weights moved since the reference was built: send the difference
    CURRENT = "current"  # the reference holds this step's weights: send nothing


class DifferenceAllGather(WeightScheme):
    """Weight all-gather of quantized differences against a per-rank reference (see the module docstring).

    Args:
        codec: the quantizer of the differences (SDP4Bit: symmetric INT4, groups of 2048).
        error_sample_interval: measure the reference's relative error against this rank's shard every this many
            calls (0: never).
        keyframe_every: also send a keyframe every this many optimizer steps (0: only when needed).
        checkpoint_reference: save the reference in :meth:`state_dict` so a resume continues exactly; False keeps
            checkpoints smaller and resumes with a keyframe (the run then differs from an uninterrupted one).

    Raises:
        ValueError: no codec, or an option out of range.
    """

    name = "difference"
    keeps_weights = True

    def __init__(
        self,
        codec: Codec | None,
        error_sample_interval: int = 0,
        keyframe_every: int = 0,
        checkpoint_reference: bool = True,
    ) -> None:
        if codec is None:
            raise ValueError("the difference weight scheme quantizes differences and needs a codec (weight bits)")
        super().__init__(codec, error_sample_interval)
        self.keyframe_every = check_int("keyframe_every", keyframe_every)
        if not isinstance(checkpoint_reference, bool):
            raise ValueError(f"checkpoint_reference={checkpoint_reference!r} is invalid; it must be True or False")
        self.checkpoint_reference = checkpoint_reference
        self.reference: torch.Tensor | None = None
        self.keyframes = 0
        self._next = _Next.KEYFRAME
        self._steps_since_keyframe = 0
        self._restored: dict[str, torch.Tensor] | None = None

    # ------------------------------------------------------------------ step boundary
    def on_optimizer_step(self) -> None:
        if self._next is _Next.CURRENT:
            self._next = _Next.UPDATE
        self._steps_since_keyframe += 1
        if self.keyframe_every and self._steps_since_keyframe >= self.keyframe_every:
            self._next = _Next.KEYFRAME

    def on_weights_changed(self) -> None:
        self._next = _Next.KEYFRAME
        self._restored = None

    # ------------------------------------------------------------------ the gather
    def _all_gather(
        self, output: torch.Tensor, input: torch.Tensor, seed: int, group: dist.ProcessGroup, measure_error: bool
    ) -> CallTraffic:
        world, rank, n = group.size(), group.rank(), input.numel()
        if input.dtype not in FLOAT_DTYPES or output.numel() != world * n:
            raise ValueError(
                f"the difference weight scheme gathers floating weights into W * n elements; got a {input.dtype} "
                f"input of {n} elements into {output.numel()} (FSDP gathers uint8 when a unit mixes parameter "
                "dtypes: use the direct scheme for such a unit)"
            )
        if self._restored is not None:
            self._restore(output)
        if self.reference is not None and (self.reference.dtype != input.dtype or self.reference.numel() != output.numel()):
            self._next = _Next.KEYFRAME  # the gather's dtype or size changed (e.g. another mixed precision)
        plain = call_traffic(world, n, n * input.element_size(), input.element_size(), self._off_node_peers)
        if self._next is _Next.KEYFRAME:
            dist.all_gather_into_tensor(output, input, group=group)
            self._keep(output)
            return plain
        ref = self.reference
        assert ref is not None
        if self._next is _Next.CURRENT:
            output.copy_(ref)
            return CallTraffic(sent=0, bf16=0, native=0, served_locally=True, served_native=plain.native)
        own = ref.view(world, n)[rank]
        # Encoded before `output` (which `input` may alias) is written.
        wire = self.codec.encode_difference_rows(input.reshape(1, n), own.view(1, n), seed=mix_seed(seed, rank))[0]
        gathered = torch.empty(world * wire.numel(), dtype=torch.uint8, device=input.device)
        dist.all_gather_into_tensor(gathered, wire, group=group)
        error = relative_error(own.to(torch.float32) + self.codec.decode(wire, n), input) if measure_error else None
        self.codec.decode_add_rows(gathered.view(world, -1), ref.view(world, n))
        output.copy_(ref)
        self._next = _Next.CURRENT
        traffic = call_traffic(world, n, wire.numel(), input.element_size(), self._off_node_peers)
        return replace(traffic, rel_error=error)

    def _keep(self, gathered: torch.Tensor) -> None:
        if self.reference is None or self.reference.dtype != gathered.dtype or self.reference.shape != gathered.shape:
            self.reference = None  # free the old one before allocating
            try:
                self.reference = torch.empty_like(gathered)
            except torch.OutOfMemoryError as err:
                raise torch.OutOfMemoryError(
                    f"the difference weight scheme cannot allocate its reference replica of {gathered.numel()} "
                    f"elements ({gathered.numel() * gathered.element_size()} bytes) on {gathered.device}: {err}. Use "
                    "it for fewer units (weight_scheme_overrides={pattern: 'direct'}) or free memory."
                ) from None
        self.reference.copy_(gathered)
        self.keyframes += 1
        self._steps_since_keyframe = 0
        self._next = _Next.CURRENT

    def _restore(self, output: torch.Tensor) -> None:
        """Build the reference from checkpointed parameter tensors (no communication: every rank has them all)."""
        restored, self._restored = self._restored, None
        if self.layout is None:
            raise RuntimeError("the difference weight scheme was set up without a gather layout; it cannot restore")
        reference = torch.empty_like(output)
        self.layout.join({k: v.to(device=output.device, dtype=output.dtype) for k, v in restored.items()}, reference)
        self.reference = reference

    # ------------------------------------------------------------------ state
    def memory_bytes(self) -> int:
        return 0 if self.reference is None else self.reference.numel() * self.reference.element_size()

    def describe(self) -> str:
        keyframes = f", keyframe every {self.keyframe_every} steps" if self.keyframe_every else ""
        return f"difference of {self.codec!r}{keyframes}"

    def state_dict(self) -> dict[str, Any]:
        """Byte counters, the step state and (with ``checkpoint_reference``) the reference per parameter, on the
        CPU, in the parameters' own shapes (the same on every rank, so any one rank's copy restores all).

        Before there is a reference the tensors are uninitialized placeholders of the same shapes (and
        ``reference_valid`` is False), so a fresh scheme's state dict is a template ``torch.distributed.checkpoint``
        can load into.
        """
        state = super().state_dict()
        valid = self.reference is not None and self._next is not _Next.KEYFRAME
        if self.checkpoint_reference:
            if self.layout is None:
                raise RuntimeError("the difference weight scheme was set up without a gather layout; it cannot save")
            if valid:
                state["reference"] = {k: v.detach().to("cpu", copy=True) for k, v in self.layout.split(self.reference).items()}
            else:
                state["reference"] = {k: torch.empty(shape) for k, shape in self.layout.shapes().items()}
        state["reference_valid"] = valid and self.checkpoint_reference
        state["current"] = self._next is _Next.CURRENT
        state["steps_since_keyframe"] = self._steps_since_keyframe
        state["keyframes"] = self.keyframes
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output; the reference is rebuilt at the next gather (for this run's number of
        ranks). A state without a valid reference (or from the direct scheme) means a keyframe next."""
        super().load_state_dict(state)
        self.keyframes = int(state.get("keyframes", 0))
        self._steps_since_keyframe = int(state.get("steps_since_keyframe", 0))
        self.reference = None
        if not state.get("reference_valid", False):
            self.on_weights_changed()
            return
        self._restored = dict(state["reference"])
        self._next = _Next.CURRENT if state["current"] else _Next.UPDATE
