"""The scheme interface: one way to move one side's tensors, with its state, its topology and its bytes.

A scheme owns everything about one side (weights or gradients) of one unit that outlives a single call:
the codec, the process group and topology it was set up for, state that persists across steps (a reference
copy, error-feedback residuals), the step boundary, byte counters and sampled quantization errors. The calls
have the semantics of FSDP2's all-gather and reduce-scatter, so a framework adapter (FSDP2's comm objects,
FSDP1's hooks, a DDP comm hook) only translates its framework's calls into scheme calls.

Life cycle::

    scheme.setup(group, topology)      # collective, once: every rank of `group`, same order
    scheme.all_gather(out, inp, seed)  # or reduce_scatter(out, inp, op, seed); any number of times
    scheme.on_optimizer_step()         # after the optimizer updated the weights
    scheme.state_dict() / load_state_dict(...)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from composer_qsdp.comm import CallTraffic, SeedStream, Topology, TrafficCounter
from composer_qsdp.quant import Codec

__all__ = ["AllReduceScheme", "GradScheme", "Scheme", "WeightScheme"]


class Scheme(ABC):
    """Base of every scheme (see the module docstring).

    Args:
        codec: the quantizer of this side's traffic, or ``None`` to send it unquantized (still counted).
        error_sample_interval: measure the relative quantization error every this many calls (0: never).

    Attributes:
        name: registry name of the scheme class.
        seed_stream: the noise stream of this side.
        codec: the codec, or ``None``.
        traffic: bytes this rank sent through this scheme (NCCL convention, per hop).
        group: the process group of :meth:`setup` (``None`` before).
    """

    name: ClassVar[str]
    seed_stream: ClassVar[SeedStream]

    def __init__(self, codec: Codec | None, error_sample_interval: int = 0) -> None:
        self.codec = codec
        self.traffic = TrafficCounter()
        self.group: dist.ProcessGroup | None = None
        self.topology: Topology | None = None
        self._interval = error_sample_interval
        self._off_node_peers = 0
        self._latest_error: torch.Tensor | None = None

    # ------------------------------------------------------------------ life cycle
    def setup(self, group: dist.ProcessGroup, topology: Topology) -> None:
        """Bind the scheme to ``group`` on ``topology`` (collective in schemes that create subgroups: every rank
        of ``group`` calls it, in the same order). Call once, before the first collective.

        Raises:
            RuntimeError: the scheme was set up already.
        """
        if self.group is not None:
            raise RuntimeError(f"{type(self).__name__} is already set up; build a new scheme for another group")
        self.group, self.topology = group, topology
        self._off_node_peers = topology.off_node_peers(group)

    def on_optimizer_step(self) -> None:
        """The optimizer has updated the weights (the step boundary). Stateless schemes do nothing."""

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to continue exactly: the byte counters, plus the scheme's own state."""
        return {"traffic": self.traffic.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (after :meth:`setup`)."""
        self.traffic.load_state_dict(state["traffic"])

    def memory_bytes(self) -> int:
        """Device memory this scheme keeps between calls (bytes per rank; 0 for stateless schemes)."""
        return 0

    def describe(self) -> str:
        """A short description for logs: the codec (schemes with more to say extend it)."""
        return "unquantized" if self.codec is None else repr(self.codec)

    # ------------------------------------------------------------------ sampling and counting
    def take_error(self) -> torch.Tensor | None:
        """The latest sampled relative quantization error (0-dim device tensor) if not taken before, else None."""
        error, self._latest_error = self._latest_error, None
        return error

    def _measure_now(self) -> bool:
        # The first call is measured too, so short runs still report an error.
        return self.codec is not None and self._interval > 0 and self.traffic.calls % self._interval == 0

    def _count(self, traffic: CallTraffic) -> CallTraffic:
        self.traffic.add(traffic)
        if traffic.rel_error is not None:
            self._latest_error = traffic.rel_error
        return traffic

    def _check_group(self, group: dist.ProcessGroup | None) -> dist.ProcessGroup:
        if self.group is None:
            raise RuntimeError(f"{type(self).__name__} was called before setup(group, topology)")
        if group is not None and group is not self.group:
            raise RuntimeError(
                f"{type(self).__name__} was set up for a process group of {self.group.size()} ranks but called with "
                f"another group of {group.size()}; one scheme serves one group"
            )
        return self.group


class WeightScheme(Scheme):
    """A scheme for the weight all-gather: every rank ends with the same unsharded weights."""

    seed_stream = SeedStream.WEIGHTS

    def all_gather(
        self, output: torch.Tensor, input: torch.Tensor, seed: int, group: dist.ProcessGroup | None = None
    ) -> CallTraffic:
        """``all_gather_into_tensor(output, input)`` over the scheme's group, in this scheme's way.

        ``input`` may alias this rank's slot of ``output`` (FSDP2 gathers in place). Work is enqueued on the
        current stream without host syncs.

        Args:
            output: contiguous tensor of ``W * n`` elements.
            input: this rank's contiguous chunk of ``n`` elements.
            seed: the call's rounding-noise key (the collectives mix in the rank).
            group: the group the caller was given, checked against the one of :meth:`setup` (``None``: skip).

        Returns:
            The bytes this rank put on the wire in this call.
        """
        return self._count(self._all_gather(output, input, seed, self._check_group(group), self._measure_now()))

    @abstractmethod
    def _all_gather(
        self, output: torch.Tensor, input: torch.Tensor, seed: int, group: dist.ProcessGroup, measure_error: bool
    ) -> CallTraffic:
        """The scheme's all-gather (arguments validated, group resolved)."""


class GradScheme(Scheme):
    """A scheme for the gradient reduce-scatter: rank ``r`` ends with the reduced chunk ``r``."""

    seed_stream = SeedStream.GRADS

    def reduce_scatter(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        op: dist.ReduceOp | dist.ReduceOp.RedOpType,
        seed: int,
        group: dist.ProcessGroup | None = None,
    ) -> CallTraffic:
        """``reduce_scatter_tensor(output, input, op)`` over the scheme's group, in this scheme's way.

        Args:
            output: this rank's contiguous chunk of ``n`` elements.
            input: contiguous tensor of ``W * n`` elements.
            op: ``ReduceOp.SUM`` or ``ReduceOp.AVG`` (quantized paths refuse anything else).
            seed: the call's rounding-noise key (the collectives mix in the rank).
            group: the group the caller was given, checked against the one of :meth:`setup` (``None``: skip).

        Returns:
            The bytes this rank put on the wire in this call.
        """
        return self._count(
            self._reduce_scatter(output, input, op, seed, self._check_group(group), self._measure_now())
        )

    @abstractmethod
    def _reduce_scatter(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        op: dist.ReduceOp | dist.ReduceOp.RedOpType,
        seed: int,
        group: dist.ProcessGroup,
        measure_error: bool,
    ) -> CallTraffic:
        """The scheme's reduce-scatter (arguments validated, group resolved)."""


class AllReduceScheme(Scheme):
    """A scheme for an all-reduce that averages: every rank ends with the mean of every rank's tensor (plain data
    parallelism, where each rank holds a full replica: DDP's gradient synchronization, 0/1 Adam's momentum)."""

    def all_reduce(self, tensor: torch.Tensor, group: dist.ProcessGroup | None = None, *, exact: bool = False,
                   valid: torch.Tensor | None = None) -> CallTraffic:
        """Replace ``tensor`` by its mean over the scheme's group, in this scheme's way.

        Args:
            tensor: the same number of elements on every rank; layout and dtype as the scheme documents.
            group: the group the caller was given, checked against the one of :meth:`setup` (``None``: skip).
            exact: the uncompressed mean instead (still counted), for the steps that need full precision.
            valid: bool mask of ``tensor``'s elements that carry data, the same on every rank (default: all); the
                others come back as zeros.

        Returns:
            The bytes this rank put on the wire in this call.
        """
        return self._count(self._all_reduce(tensor, self._check_group(group), exact, valid))

    @abstractmethod
    def _all_reduce(self, tensor: torch.Tensor, group: dist.ProcessGroup, exact: bool,
                    valid: torch.Tensor | None) -> CallTraffic:
        """The scheme's all-reduce (group resolved)."""
