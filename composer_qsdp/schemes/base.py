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

import warnings
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from composer_qsdp.comm import (CallTraffic, SeedStream, Topology, TrafficCounter, plain_all_gather,
                                plain_reduce_scatter)
from composer_qsdp.quant import Codec

__all__ = ["AllReduceScheme", "GatherLayout", "GradScheme", "Scheme", "WeightScheme"]


class GatherLayout(ABC):
    """Where a unit's parameters sit in the all-gather output of its adapter's framework.

    A weight scheme that keeps gathered weights between steps (a reference copy) checkpoints them per parameter,
    in the parameters' own shapes, so a checkpoint does not depend on how many ranks gathered them; the adapter
    that knows its framework's layout (padding, order) converts.
    """

    @abstractmethod
    def segments(self) -> list[tuple[str, int]]:
        """``(key, elements)`` of each parameter's piece of one rank's all-gather input, in order; keys are the
        parameters' names within the unit (``"ln_1.weight"``)."""

    @abstractmethod
    def shapes(self) -> dict[str, torch.Size]:
        """The full shape of each parameter, by the keys :meth:`split` uses."""

    @abstractmethod
    def split(self, gathered: torch.Tensor) -> dict[str, torch.Tensor]:
        """The parameters' full tensors (views where possible) of a ``[W * n]`` all-gather output."""

    @abstractmethod
    def join(self, params: dict[str, torch.Tensor], out: torch.Tensor) -> None:
        """Write full parameter tensors (as :meth:`split` returns them) into a ``[W * n]`` all-gather buffer
        (padding zeroed).

        Raises:
            ValueError: the tensors do not match the parameters (names or shapes), naming the difference.
        """

    def check_saved(self, params: dict[str, torch.Tensor]) -> None:
        """Raise unless ``params`` has exactly this unit's parameter names and shapes (for :meth:`join`).

        Raises:
            ValueError: naming the saved and the expected shapes.
        """
        expected = {key: tuple(shape) for key, shape in self.shapes().items()}
        got = {key: tuple(t.shape) for key, t in params.items()}
        if got != expected:
            raise ValueError(f"saved parameters {got} do not match this unit's {expected}")


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

    def host_memory_bytes(self) -> int:
        """Host memory this scheme keeps between calls in place of device memory (bytes per rank)."""
        return 0

    @property
    def passthrough(self) -> bool:
        """The scheme's call is the framework's own collective on the tensors as they are (no codec, no state, no
        other exchange), so an adapter's call goes to :meth:`WeightScheme.plain_all_gather` or
        :meth:`GradScheme.plain_reduce_scatter`, which run nothing else. ``False`` unless a scheme says so."""
        return False

    def _check_passthrough(self) -> None:
        if not self.passthrough:
            raise RuntimeError(f"{type(self).__name__} ({self.describe()}) is no passthrough scheme; its calls are "
                               "all_gather / reduce_scatter")

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
    """A scheme for the weight all-gather: every rank ends with the same unsharded weights.

    Attributes:
        keeps_weights: the scheme keeps gathered weights between steps (it needs a :class:`GatherLayout` and its
            adapter must report weights that change outside an optimizer step).
        layout: the unit's :class:`GatherLayout`, when its adapter provides one (``None`` otherwise).
    """

    seed_stream = SeedStream.WEIGHTS
    keeps_weights: ClassVar[bool] = False
    layout: GatherLayout | None = None

    @property
    def needs_layout(self) -> bool:
        """The scheme needs its unit's :class:`GatherLayout` at :meth:`setup`."""
        return self.keeps_weights

    def setup(self, group: dist.ProcessGroup, topology: Topology, layout: GatherLayout | None = None) -> None:
        """:meth:`Scheme.setup`, plus the unit's gather layout (for schemes that checkpoint gathered weights)."""
        super().setup(group, topology)
        self.layout = layout

    def on_weights_changed(self) -> None:
        """The weights changed outside an optimizer step (loaded, edited in place): stateful schemes rebuild
        their state at the next gather. Stateless schemes do nothing."""

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

    def plain_all_gather(self, output: torch.Tensor, input: torch.Tensor, group: dist.ProcessGroup | None = None,
                         async_op: bool = False) -> dist.Work | None:
        """A :attr:`passthrough` scheme's all-gather: ``all_gather_into_tensor`` exactly as the framework issues it
        (:func:`~composer_qsdp.comm.plain_all_gather`), counted; no seed, no sampling.

        Args:
            output: contiguous tensor of ``W * n`` elements.
            input: this rank's contiguous chunk of ``n`` elements.
            group: the group the caller was given, checked against the one of :meth:`setup` (``None``: skip).
            async_op: return the collective's ``Work`` (the framework waits on it) instead of ordering it on the
                current stream.

        Returns:
            The ``Work`` when ``async_op``, else ``None``.

        Raises:
            RuntimeError: the scheme is no passthrough scheme.
        """
        self._check_passthrough()
        traffic, work = self.exact_all_gather(output, input, group, async_op)
        self._count(traffic)
        return work

    def exact_all_gather(self, output: torch.Tensor, input: torch.Tensor, group: dist.ProcessGroup | None = None,
                         async_op: bool = False) -> tuple[CallTraffic, dist.Work | None]:
        """The framework's own ``all_gather_into_tensor`` of the exact shard, whatever this scheme's codec, and
        nothing else: no seed, no sampling, no scheme state read or written, and not counted in :attr:`traffic`
        (the caller counts the bytes it returns). What an evaluation of the exact weights runs
        (:meth:`QSDPHandle.set_weight_gathers <composer_qsdp.engine.QSDPHandle.set_weight_gathers>`), and what a
        :attr:`passthrough` scheme's :meth:`plain_all_gather` runs and counts.

        Args:
            output: contiguous tensor of ``W * n`` elements.
            input: this rank's contiguous chunk of ``n`` elements.
            group: the group the caller was given, checked against the one of :meth:`setup` (``None``: skip).
            async_op: return the collective's ``Work`` instead of ordering it on the current stream.

        Returns:
            The bytes this rank put on the wire (in ``input``'s dtype, as plain FSDP sends) and the ``Work`` when
            ``async_op``, else ``None``.
        """
        return plain_all_gather(output, input, self._check_group(group), async_op=async_op,
                                off_node_peers=self._off_node_peers)

    def secondary_all_gather(self, output: torch.Tensor, input: torch.Tensor, group: dist.ProcessGroup,
                             count: bool = True) -> CallTraffic:
        """Re-gather the secondary shard of ZeRO++'s hpZ (FSDP2's ``reshard_after_forward=<int>``) over ``group``.

        After the forward, FSDP2 keeps a slice of the weights this scheme's all-gather produced, sharded over a
        smaller group (``reshard_after_forward`` consecutive ranks; within a node when that divides the ranks per
        node), and gathers those slices in backward. They are the decoded weights every rank already computed with,
        so they travel as they are (in the parameter dtype, like ZeRO++'s hpZ over NVLink): the backward sees
        bit-identical weights and no second quantization error. Counted in :attr:`traffic`, with the bytes to
        other nodes in ``inter_node``.

        Args:
            output: contiguous tensor of ``group.size() * n`` elements.
            input: this rank's contiguous chunk of ``n`` elements.
            group: the secondary shard's process group.
            count: add the bytes to :attr:`traffic` (``False``: the caller counts them, e.g. during an evaluation
                of the exact weights, which leaves the scheme untouched).

        Returns:
            The bytes this rank sent.
        """
        if self.topology is None:
            raise RuntimeError(f"{type(self).__name__} was called before setup(group, topology)")
        peers = self.topology.off_node_peers(group)
        if peers:  # Python's default filter shows one warning per distinct message
            warnings.warn(
                f"hpZ: the secondary weight shard is re-gathered unquantized over {group.size()} ranks, {peers} of "
                f"them on other nodes; choose reshard_after_forward to divide the ranks per node "
                f"({self.topology.ranks_per_node}) to keep it within the node", stacklevel=2,
            )
        traffic = plain_all_gather(output, input, group, off_node_peers=peers)[0]
        return self._count(traffic) if count else traffic


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
        *,
        overwrite_input: bool = False,
    ) -> CallTraffic:
        """``reduce_scatter_tensor(output, input, op)`` over the scheme's group, in this scheme's way.

        Args:
            output: this rank's contiguous chunk of ``n`` elements.
            input: contiguous tensor of ``W * n`` elements.
            op: ``ReduceOp.SUM`` or ``ReduceOp.AVG`` (quantized paths refuse anything else).
            seed: the call's rounding-noise key (the collectives mix in the rank).
            group: the group the caller was given, checked against the one of :meth:`setup` (``None``: skip).
            overwrite_input: the caller does not read ``input`` after the call (FSDP's reduce-scatter input is a
                scratch buffer): a scheme that transforms it before encoding may do so in place instead of in a copy.

        Returns:
            The bytes this rank put on the wire in this call.
        """
        return self._count(
            self._reduce_scatter(output, input, op, seed, self._check_group(group), self._measure_now(),
                                 overwrite_input)  # fmt: skip
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
        overwrite_input: bool,
    ) -> CallTraffic:
        """The scheme's reduce-scatter (arguments validated, group resolved)."""

    def plain_reduce_scatter(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        op: dist.ReduceOp | dist.ReduceOp.RedOpType,
        group: dist.ProcessGroup | None = None,
        async_op: bool = False,
    ) -> dist.Work | None:
        """A :attr:`passthrough` scheme's reduce-scatter: ``reduce_scatter_tensor`` exactly as the framework issues
        it (:func:`~composer_qsdp.comm.plain_reduce_scatter`, ``op`` as given), counted; no seed, no sampling.

        Args:
            output: this rank's contiguous chunk of ``n`` elements.
            input: contiguous tensor of ``W * n`` elements.
            op: the framework's reduction.
            group: the group the caller was given, checked against the one of :meth:`setup` (``None``: skip).
            async_op: return the collective's ``Work`` instead of ordering it on the current stream.

        Returns:
            The ``Work`` when ``async_op``, else ``None``.

        Raises:
            RuntimeError: the scheme is no passthrough scheme.
        """
        self._check_passthrough()
        traffic, work = plain_reduce_scatter(output, input, self._check_group(group), op, async_op=async_op,
                                             off_node_peers=self._off_node_peers)
        self._count(traffic)
        return work


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
