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

Cost: ``w_ref`` is one replica of the unit's weights per rank (``memory_bytes``; ``2 P`` bytes for ``P`` bf16
weights), the price SDP4Bit pays too (Megatron keeps one). Checkpoints hold the reference once, per parameter in
the parameters' shapes (every rank holds the same replica), so a resumed run continues exactly, on the same or on
another number of ranks.

**Sharded reference** (``sharded_reference=True``; ZeRO++ hpZ's idea, a secondary copy sharded within the node).
With the unit's group on ``N`` nodes of ``g`` ranks (:func:`~composer_qsdp.comm.node_groups`: the ``topology``'s
``ranks_per_node``), the rank of local index ``j`` keeps only ``R_j``: the ``N`` chunks of the reference that the
ranks of local index ``j`` own (one per node), ``1 / g`` of the unit (``2 P / g`` bytes in bf16). A gather is two
hops:

1. inter-node, over the ranks of local index ``j`` (one per node): the update's codes of the difference, exactly
   the replicated reference's codes (same codec, same noise key), and ``R_j += decode(codes)`` on each of them, the
   owner included; a keyframe gathers the shards in full precision into ``R_j`` instead;
2. intra-node, over the node's ``g`` ranks: the ``R_j`` in the all-gather dtype, permuted into FSDP's output (the
   unit's full weights, transient as FSDP's own unsharded buffer is; with several nodes the gather lands in a
   transient buffer of the unit's size first).

The outputs are the replicated reference's bit for bit, in every call. The gathers the replicated reference serves
locally run hop 2 again: they count as collectives (``sent`` and ``native``/``bf16`` baselines, no inter-node
bytes), not as ``served_locally``. Bytes per rank and call, for chunks of ``n`` elements of ``e`` bytes and ``c``
bytes of codes: an update sends ``(N - 1) c`` across nodes (the replicated reference: ``(N - 1) g c``) and
``(g - 1) N n e`` within the node; a keyframe ``(N - 1) n e`` across nodes and the same within; any other gather
``(g - 1) N n e`` within the node only. Checkpoints keep the replicated reference's format (the full reference per
parameter, reassembled by hop 2 in :meth:`~DifferenceAllGather.state_dict`, which is then collective over the
node's ranks: every rank calls it, as Composer's and ``torch.distributed.checkpoint``'s saves do), so a checkpoint
of either variant resumes either, on any number of ranks and nodes.

**Reference in host memory** (``reference_on_host=True``). The reference (replicated or sharded) lives in the
host's pinned memory instead of the GPU's: each gather copies it into the gather's output (or, sharded, into a
transient buffer of the rank's rows), applies the update there and copies the result back, so the scheme keeps no
device memory between calls. The outputs are the device reference's bit for bit, and checkpoints are the same. The
cost moves to the host link: one copy of the rank's reference in per gather and one back per update or keyframe,
``2 P`` bytes each way (``2 P / g`` sharded) for ``P`` bf16 weights: far below what the slow network carries for plain
FSDP's gather of the same unit, far above what NVLink does. The copies run on the gather's stream, in order
(:class:`~composer_qsdp.schemes.host_copies.HostCopies`).

**Updates sent ahead** (:meth:`DifferenceAllGather.speculate`, driven by
:class:`~composer_qsdp.engine.SpeculativeUpdate`). Once the current step's reference is built, the next step's
gather input can be known before the optimizer step: the caller computes it and the scheme encodes its difference
and all-gathers the codes on a process group of their own while the backward runs. After the optimizer step the
caller says whether the real input is that one, bit for bit (:meth:`DifferenceAllGather.settle_speculation`): if so
the next gather applies the codes already received (``PENDING``) and sends nothing, computing exactly what the
update would have computed (same input, reference and noise key); if not, the codes are dropped and the gather sends
the update as usual. A consumed speculation is counted as the update call it replaces; a dropped one as a call of
its own, with no baseline (bytes plain FSDP would not have sent). Replicated references on the gathers' device only.

Degenerate layouts: with one rank per node (``g = 1``) ``R_0`` is the whole unit and the scheme is the replicated
one. On one node (``N = 1``, ``g`` the group size, also what a run without ``ranks_per_node`` or
``LOCAL_WORLD_SIZE`` assumes) hop 1 has no peer (each rank applies its own codes) and every gather is hop 2, the
whole unit in the all-gather dtype within the node, as plain FSDP sends it: exact (the replicated reference's
outputs) and ``1 / g`` of the memory, but the weight codec saves no bytes; :meth:`~DifferenceAllGather.setup`
warns with :class:`ShardedReferenceWarning` then.
"""

from __future__ import annotations

import enum
import warnings
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist

from composer_qsdp.comm import CallTraffic, Topology, call_traffic, mix_seed, node_groups, relative_error
from composer_qsdp.quant import FLOAT_DTYPES, Codec
from composer_qsdp.schemes.base import GatherLayout, WeightScheme
from composer_qsdp.schemes.host_copies import HostCopies
from composer_qsdp.validate import check_bool, check_int

__all__ = ["DifferenceAllGather", "ShardedReferenceWarning"]


class ShardedReferenceWarning(UserWarning):
    """A sharded qWD reference on one node: every gather sends the whole unit in the all-gather dtype within the
    node, so the weight codec saves no bytes (see :mod:`composer_qsdp.schemes.difference`)."""


class _Next(enum.Enum):
    """What the next gather must do."""

    KEYFRAME = "keyframe"  # no (valid) reference: gather the weights in full precision
    UPDATE = "update"  # the weights moved since the reference was built: send the difference
    CURRENT = "current"  # the reference holds this step's weights: send nothing
    PENDING = "pending"  # the update's codes arrived ahead of the gather (a confirmed speculation): apply them


@dataclass(eq=False)
class _Speculation:
    """An update sent ahead of its gather: the input it encoded, the codes' all-gather in flight, its bytes."""

    input: torch.Tensor
    gathered: torch.Tensor
    work: dist.Work | None
    traffic: CallTraffic


@dataclass(frozen=True, eq=False)
class _Placement:
    """Which chunks of the unit this rank's reference holds, who exchanges codes for them, and how they reach the
    gather's output. Chunk ``r`` (elements ``[r n, (r + 1) n)`` of the output) is group rank ``r``'s shard.

    Attributes:
        chunks: the output chunk of each reference row, in row order (row ``i`` is rank ``i`` of ``rows_group``).
        row: this rank's own row (its shard's chunk).
        rows_group: the ranks that exchange the rows' codes, each owning one row (``None``: this rank alone).
        rows_off_node: peers of ``rows_group`` on other nodes.
        spread_group: the ranks whose references together make the unit, gathered into the output (``None``: the
            reference is the whole unit, copied).
        spread_off_node: peers of ``spread_group`` on other nodes.
        spread_order: the output chunk of each row of the spread's gather, ``[spread rank][row]`` flattened
            (``None``: the gather lands in output order).
        nodes, per_node: the node split (sharded placements) for :meth:`DifferenceAllGather.describe`.
    """

    chunks: tuple[int, ...]
    row: int
    rows_group: dist.ProcessGroup | None
    rows_off_node: int
    spread_group: dist.ProcessGroup | None = None
    spread_off_node: int = 0
    spread_order: tuple[int, ...] | None = None
    nodes: int = 0
    per_node: int = 0

    @property
    def rows(self) -> int:
        return len(self.chunks)

    @classmethod
    def replicated(cls, group: dist.ProcessGroup, off_node_peers: int) -> _Placement:
        """The whole unit on every rank: codes over ``group``, no spread."""
        return cls(tuple(range(group.size())), group.rank(), group, off_node_peers)

    @classmethod
    def sharded(cls, group: dist.ProcessGroup, topology: Topology) -> _Placement:
        """The chunks of this rank's local index on every node (collective the first time ``group`` is split)."""
        split = node_groups(topology, group)
        layout = {"nodes": split.nodes, "per_node": split.ranks_per_node}
        if split.two_level:
            assert split.inter is not None and split.intra is not None
            chunks = tuple(split.chunks[a][split.local] for a in range(split.nodes))
            return cls(chunks, split.node, split.inter, topology.off_node_peers(split.inter), split.intra,
                       topology.off_node_peers(split.intra), split.send_order, **layout)
        if split.nodes == 1 and group.size() > 1:  # one node: own chunk only, gathered over the whole group
            return cls((group.rank(),), 0, None, 0, group, topology.off_node_peers(group), **layout)
        # One rank per node (or one rank): the reference is the whole unit, as the replicated one.
        return replace(cls.replicated(group, topology.off_node_peers(group)), **layout)


class DifferenceAllGather(WeightScheme):
    """Weight all-gather of quantized differences against a per-rank reference (see the module docstring).

    Args:
        codec: the quantizer of the differences (SDP4Bit: symmetric INT4, groups of 2048).
        error_sample_interval: measure the reference's relative error against this rank's shard every this many
            calls (0: never).
        keyframe_every: also send a keyframe every this many optimizer steps (0: only when needed).
        checkpoint_reference: save the reference in :meth:`state_dict` so a resume continues exactly; False keeps
            checkpoints smaller and resumes with a keyframe (the run then differs from an uninterrupted one).
        sharded_reference: keep only ``1 / g`` of the reference per rank (``g`` ranks per node) and gather it
            within the node at every call (the module docstring's "Sharded reference"); the outputs are the same.
        reference_on_host: keep the reference in the host's pinned memory and copy it to the device at each gather
            (the module docstring's "Reference in host memory"); the outputs are the same.

    Attributes:
        reference: this rank's reference (the unit's ``W * n`` gathered elements, or with ``sharded_reference`` the
            ``N * n`` of its local index's chunks; on the gathers' device, or in host memory with
            ``reference_on_host``), ``None`` before the first gather.

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
        sharded_reference: bool = False,
        reference_on_host: bool = False,
    ) -> None:
        if codec is None:
            raise ValueError("the difference weight scheme quantizes differences and needs a codec (weight bits)")
        super().__init__(codec, error_sample_interval)
        self.keyframe_every = check_int("keyframe_every", keyframe_every)
        self.checkpoint_reference = check_bool("checkpoint_reference", checkpoint_reference)
        self.sharded_reference = check_bool("sharded_reference", sharded_reference)
        self.reference_on_host = check_bool("reference_on_host", reference_on_host)
        self.reference: torch.Tensor | None = None
        self._device: torch.device | None = None  # the gathers' device
        self._host = HostCopies()  # with reference_on_host: the copies to and from the reference
        self.keyframes = 0
        self._next = _Next.KEYFRAME
        self._steps_since_keyframe = 0
        self._restored: dict[str, torch.Tensor] | None = None
        self._placement: _Placement | None = None
        self._spread_index: dict[torch.device, torch.Tensor] = {}
        self._speculation: _Speculation | None = None
        self._applied_mismatch: torch.Tensor | None = None

    def setup(self, group: dist.ProcessGroup, topology: Topology, layout: GatherLayout | None = None) -> None:
        """:meth:`WeightScheme.setup`; with ``sharded_reference`` also split ``group`` into the nodes of
        ``topology`` (collective over the default group the first time a group is seen, as ``two_level``'s).

        Warns:
            ShardedReferenceWarning: ``sharded_reference`` on a group within one node (module docstring).
        """
        super().setup(group, topology, layout)
        if not self.sharded_reference:
            self._placement = _Placement.replicated(group, self._off_node_peers)
            return
        self._placement = _Placement.sharded(group, topology)
        if self._placement.rows_group is None and self._placement.spread_group is not None:
            warnings.warn(
                f"the difference weight scheme's sharded_reference on one node of {group.size()} ranks (ranks_per_node="
                f"{topology.ranks_per_node}): no difference crosses a node, and every gather sends the unit's weights "
                "in the all-gather dtype within the node, as plain FSDP does (exact, with 1/"
                f"{group.size()} of the reference per rank, but the weight codec saves no bytes). Set ranks_per_node "
                "to the ranks each node really holds, or turn sharded_reference off on one node",
                ShardedReferenceWarning, stacklevel=2)

    # ------------------------------------------------------------------ step boundary
    def on_optimizer_step(self) -> None:
        if self._next is _Next.PENDING:  # no gather applied it: the weights moved on
            self._drop_speculation()
        elif self._next is _Next.CURRENT:
            self._next = _Next.UPDATE
        self._steps_since_keyframe += 1
        if self.keyframe_every and self._steps_since_keyframe >= self.keyframe_every:
            self._next = _Next.KEYFRAME

    def on_weights_changed(self) -> None:
        self._next = _Next.KEYFRAME
        self._restored = None
        self._drop_speculation()

    # ------------------------------------------------------------------ updates sent ahead
    @property
    def can_speculate(self) -> bool:
        """Whether :meth:`speculate` would send now: a replicated reference on the gathers' device that holds the
        current step's weights, and no speculation in flight."""
        place = self._placement
        return (self._next is _Next.CURRENT and self._speculation is None and self.reference is not None
                and not self.reference_on_host and place is not None and place.spread_group is None)

    def speculate(self, input: torch.Tensor, seed: int, group: dist.ProcessGroup) -> bool:
        """Encode the difference of ``input`` (this rank's next gather input, ``n`` elements in the reference's
        dtype) and all-gather its codes over ``group`` asynchronously (the ranks of the scheme's group, in its
        order). Collective over ``group`` when it sends.

        Args:
            input: the input the next step's first gather is expected to receive.
            seed: that gather's noise key (:meth:`~composer_qsdp.comm.StepSeeds.next_step_seed`).
            group: where the codes travel: the scheme's group or a twin of it.

        Returns:
            Whether it sent (False where :attr:`can_speculate` is False).
        """
        if not self.can_speculate:
            return False
        assert self.reference is not None and self._placement is not None and self.group is not None
        place, n = self._placement, input.numel()
        if input.dtype != self.reference.dtype or self.reference.numel() != place.rows * n:
            raise ValueError(f"a speculative update must match the reference: got {n} elements of {input.dtype} for "
                             f"a reference of {self.reference.numel()} elements of {self.reference.dtype}")
        own = self.reference.view(place.rows, n)[place.row]
        wire = self.codec.encode_difference_rows(input.reshape(1, n), own.view(1, n),
                                                 seed=mix_seed(seed, self.group.rank()))[0]
        work = None
        if place.rows_group is None:
            gathered = wire
        else:
            gathered = torch.empty(place.rows * wire.numel(), dtype=torch.uint8, device=input.device)
            work = dist.all_gather_into_tensor(gathered, wire, group=group, async_op=True)
        traffic = self._traffic(self.group.size(), n, input.element_size(), wire.numel())
        self._speculation = _Speculation(input, gathered, work, traffic)
        return True

    @property
    def speculating(self) -> bool:
        """Whether a speculation was sent and not yet settled or consumed."""
        return self._speculation is not None and self._next is not _Next.PENDING

    def settle_speculation(self, hit: bool) -> bool:
        """After the optimizer step (and :meth:`on_optimizer_step`): ``hit`` means the next gather's input is the
        speculated one on every rank of the group. A hit is applied at that gather; a miss, or a speculation the
        scheme can no longer use (a keyframe is due), is dropped and counted.

        Returns:
            Whether the next gather applies it.
        """
        if self._speculation is None:
            return False
        if hit and self._next is _Next.UPDATE:
            self._next = _Next.PENDING
            return True
        self._drop_speculation()
        return False

    def speculation_mismatch(self) -> torch.Tensor | None:
        """A 0-dim int32 device tensor, nonzero when a gather that applied a speculation received another input
        than the one speculated (which the caller's check ruled out: a bug), since the last call; ``None`` if no
        speculation was applied since."""
        flag, self._applied_mismatch = self._applied_mismatch, None
        return flag

    def _drop_speculation(self) -> None:
        spec, self._speculation = self._speculation, None
        if spec is None:
            return
        if spec.work is not None:
            spec.work.wait()  # its buffers stay alive until the collective is done
        # Bytes plain FSDP would not have sent: no baseline.
        self._count(replace(spec.traffic, bf16=0, native=0, rel_error=None))
        if self._next is _Next.PENDING:
            self._next = _Next.UPDATE

    def _apply_speculation(self, input: torch.Tensor, n: int) -> tuple[torch.Tensor, CallTraffic]:
        """The PENDING gather: the codes received ahead update the reference, as the update would have."""
        spec, self._speculation = self._speculation, None
        assert spec is not None and self.reference is not None and self._placement is not None
        if spec.work is not None:
            spec.work.wait()
        if input.is_cuda:  # made on the stream of the backward's reduce-scatters, read on the gather's
            for made_there in (spec.input, spec.gathered):
                made_there.record_stream(torch.cuda.current_stream(input.device))
        differs = (input.view(-1) != spec.input.view(-1)).any().to(torch.int32)
        self._applied_mismatch = differs if self._applied_mismatch is None else self._applied_mismatch | differs
        self.codec.decode_add_rows(spec.gathered.view(self._placement.rows, -1),
                                   self.reference.view(self._placement.rows, n))
        self._next = _Next.CURRENT
        return self.reference, spec.traffic

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
        place = self._placement
        assert place is not None  # set with the group, which _check_group required
        self._device = output.device
        if self._restored is not None:
            self._restore(output, world, n)
        ref = self.reference
        if ref is not None and (ref.dtype != input.dtype or ref.numel() != place.rows * n):
            self._next = _Next.KEYFRAME  # the gather's dtype or size changed (e.g. another mixed precision)
        element = input.element_size()
        if self._next is _Next.KEYFRAME:
            self._drop_speculation()
            self._keyframe(input, place.rows * n)
            work = self._working(output, load=False)
            rows_wire = n * element
            if place.rows_group is None:
                work.copy_(input)
            else:
                dist.all_gather_into_tensor(work, input, group=place.rows_group)
            self._store(work)
            traffic = self._traffic(world, n, element, rows_wire)
        elif self._next is _Next.PENDING:
            work, traffic = self._apply_speculation(input, n)
        elif self._next is _Next.CURRENT:
            assert ref is not None
            if place.spread_group is None:  # the whole unit is here: no collective
                self._spread(self._working(output, load=True), output)
                plain = call_traffic(world, n, n * element, element, self._off_node_peers)
                return CallTraffic(sent=0, bf16=0, native=0, served_locally=True, served_native=plain.native)
            work = self._working(output, load=True)
            traffic = self._traffic(world, n, element, None)
        else:
            assert ref is not None
            rows = ref.view(place.rows, n)
            if self.reference_on_host:
                # Each row crosses the host link once: the other rows now, this rank's into `own` and from there into
                # `work` after the encoding and the error, which read `input`, which the whole-unit `work` (`output`)
                # may alias at this row.
                work = self._working(output, load=False)
                own = self._to_device(rows[place.row], input.device)
                for part in (slice(0, place.row), slice(place.row + 1, place.rows)):
                    if part.start < part.stop:
                        self._host.copy(work.view(place.rows, n)[part], rows[part])
            else:
                work, own = ref, rows[place.row]
            wire = self.codec.encode_difference_rows(input.reshape(1, n), own.view(1, n), seed=mix_seed(seed, rank))[0]
            if place.rows_group is None:
                gathered = wire
            else:
                gathered = torch.empty(place.rows * wire.numel(), dtype=torch.uint8, device=input.device)
                dist.all_gather_into_tensor(gathered, wire, group=place.rows_group)
            error = relative_error(own.to(torch.float32) + self.codec.decode(wire, n), input) if measure_error else None
            if self.reference_on_host:
                work.view(place.rows, n)[place.row].copy_(own)
            self.codec.decode_add_rows(gathered.view(place.rows, -1), work.view(place.rows, n))
            self._store(work)
            self._next = _Next.CURRENT
            traffic = replace(self._traffic(world, n, element, wire.numel()), rel_error=error)
        self._spread(work, output)
        return traffic

    # ------------------------------------------------------------------ where the reference lives
    def _working(self, output: torch.Tensor, load: bool) -> torch.Tensor:
        """The reference on the gathers' device, to read and update in place: the reference itself, or with
        ``reference_on_host`` a device buffer (``output`` when it is the whole unit, else a transient one of the
        reference's size) holding its copy when ``load``."""
        ref = self.reference
        assert ref is not None and self._placement is not None
        if not self.reference_on_host:
            return ref
        if self._placement.spread_group is None:
            work = output.view(-1)
        else:
            work = torch.empty(ref.numel(), dtype=ref.dtype, device=output.device)
        if load:
            self._host.copy(work, ref)
        return work

    def _to_device(self, ref: torch.Tensor, device: torch.device) -> torch.Tensor:
        """``ref`` (a part of the reference) on ``device``: itself, or a transient copy of a host reference."""
        return self._host.to_device(ref, device) if self.reference_on_host else ref

    def _store(self, work: torch.Tensor) -> None:
        """Write the updated ``work`` back to a host reference (nothing to do for a device one)."""
        if self.reference_on_host:
            assert self.reference is not None
            self._host.copy(self.reference, work)

    def _traffic(self, world: int, n: int, element: int, rows_wire: int | None) -> CallTraffic:
        """One gather's bytes: the rows' exchange (``rows_wire`` bytes per row; ``None``: none) and the spread,
        against the flat gather's baselines."""
        place = self._placement
        assert place is not None
        flat = call_traffic(world, n, 0, element, self._off_node_peers)
        sent = inter = 0
        if rows_wire is not None:
            sent, inter = (place.rows - 1) * rows_wire, place.rows_off_node * rows_wire
        if place.spread_group is not None:
            spread = place.rows * n * element  # one rank's reference, in the all-gather dtype
            sent += (place.spread_group.size() - 1) * spread
            inter += place.spread_off_node * spread
        return replace(flat, sent=sent, inter_node=inter)

    def _spread(self, ref: torch.Tensor, output: torch.Tensor) -> None:
        """Write the unit's weights into ``output`` from the references of the spread group (collective over it)."""
        place = self._placement
        assert place is not None
        if place.spread_group is None:
            if ref.data_ptr() != output.data_ptr():
                output.view(-1).copy_(ref)
        elif place.spread_order is None:
            dist.all_gather_into_tensor(output, ref, group=place.spread_group)
        else:
            landed = torch.empty_like(output)
            dist.all_gather_into_tensor(landed, ref, group=place.spread_group)
            shape = (len(place.spread_order), output.numel() // len(place.spread_order))
            output.view(shape).index_copy_(0, self._order(output.device), landed.view(shape))

    def _order(self, device: torch.device) -> torch.Tensor:
        """The spread's chunk order as an index tensor on ``device``, copied there once."""
        if device not in self._spread_index:
            assert self._placement is not None and self._placement.spread_order is not None
            self._spread_index[device] = torch.tensor(self._placement.spread_order, dtype=torch.long, device=device)
        return self._spread_index[device]

    def _keyframe(self, like: torch.Tensor, numel: int) -> torch.Tensor:
        """The reference to fill with a keyframe (``numel`` elements of ``like``'s dtype), allocated if needed."""
        ref = self.reference
        home = torch.device("cpu") if self.reference_on_host else like.device
        if ref is None or ref.dtype != like.dtype or ref.numel() != numel or ref.device != home:
            self.reference = None  # free the old one before allocating
            try:
                if self.reference_on_host:
                    self.reference = HostCopies.empty(numel, like.dtype, like.device)
                else:
                    self.reference = torch.empty(numel, dtype=like.dtype, device=like.device)
            except torch.OutOfMemoryError as err:
                raise torch.OutOfMemoryError(
                    f"the difference weight scheme cannot allocate its reference of {numel} elements "
                    f"({numel * like.element_size()} bytes) on {like.device}: {err}. Use it for fewer units "
                    "(weight_scheme_overrides={pattern: 'direct'}), shard the reference within the node "
                    "(sharded_reference), keep it in host memory (reference_on_host), or free memory."
                ) from None
        self.keyframes += 1
        self._steps_since_keyframe = 0
        self._next = _Next.CURRENT
        return self.reference

    def _restore(self, output: torch.Tensor, world: int, n: int) -> None:
        """Build the reference from checkpointed parameter tensors (no communication: every rank has them all)."""
        restored, self._restored = self._restored, None
        if self.layout is None:
            raise RuntimeError("the difference weight scheme was set up without a gather layout; it cannot restore")
        assert self._placement is not None
        full = torch.empty(output.numel(), dtype=output.dtype, device=output.device)
        self.layout.join({k: v.to(device=output.device, dtype=output.dtype) for k, v in restored.items()}, full)
        chunks = self._placement.chunks
        if chunks != tuple(range(world)):
            index = torch.tensor(chunks, dtype=torch.long, device=full.device)
            full = full.view(world, n).index_select(0, index).view(-1)
        if self.reference_on_host:
            self.reference = HostCopies.empty(full.numel(), full.dtype, full.device)
            self._host.copy(self.reference, full)
        else:
            self.reference = full

    def _full_reference(self) -> torch.Tensor:
        """The whole unit's reference: this rank's own, or the spread group's gathered (collective over it)."""
        ref, place = self.reference, self._placement
        assert ref is not None and place is not None and self.group is not None
        if place.spread_group is None:
            self._host.settle()
            return ref
        if self.reference_on_host:  # the spread group's collective needs it on the gathers' device
            assert self._device is not None
            ref = self._to_device(ref, self._device)
        full = torch.empty(self.group.size() * (ref.numel() // place.rows), dtype=ref.dtype, device=ref.device)
        self._spread(ref, full)  # a checkpoint's gather, not training traffic: not counted
        return full

    # ------------------------------------------------------------------ state
    def memory_bytes(self) -> int:
        if self.reference is None or self.reference_on_host:
            return 0
        return self.reference.numel() * self.reference.element_size()

    def host_memory_bytes(self) -> int:
        if self.reference is None or not self.reference_on_host:
            return 0
        return self.reference.numel() * self.reference.element_size()

    def describe(self) -> str:
        keyframes = f", keyframe every {self.keyframe_every} steps" if self.keyframe_every else ""
        sharded = ""
        if self.sharded_reference:
            place = self._placement
            split = f" on {place.nodes} nodes x {place.per_node} (1/{place.per_node} per rank)" if place else ""
            sharded = f", reference sharded within the node{split}"
        host = ", reference in host memory" if self.reference_on_host else ""
        return f"difference of {self.codec!r}{keyframes}{sharded}{host}"

    def state_dict(self) -> dict[str, Any]:
        """Byte counters, the step state and (with ``checkpoint_reference``) the reference per parameter, on the
        CPU, in the parameters' own shapes (the same on every rank, so any one rank's copy restores all).

        Before there is a reference the tensors are uninitialized placeholders of the same shapes (and
        ``reference_valid`` is False), so a fresh scheme's state dict is a template ``torch.distributed.checkpoint``
        can load into. With ``sharded_reference`` the full reference is gathered within the node first: the call is
        then collective over the node's ranks of the group (every rank calls it, in the same order of units).
        """
        state = super().state_dict()
        restored = self._restored  # loaded but not rebuilt yet (a save before the first gather): saved as loaded
        valid = (self.reference is not None or restored is not None) and self._next is not _Next.KEYFRAME
        if self.checkpoint_reference:
            if self.layout is None:
                raise RuntimeError("the difference weight scheme was set up without a gather layout; it cannot save")
            if valid and restored is not None:
                state["reference"] = {k: v.detach().to("cpu", copy=True) for k, v in restored.items()}
            elif valid:
                full = self._full_reference()
                state["reference"] = {k: v.detach().to("cpu", copy=True) for k, v in self.layout.split(full).items()}
            else:
                state["reference"] = {k: torch.empty(shape) for k, shape in self.layout.shapes().items()}
        state["reference_valid"] = valid and self.checkpoint_reference
        state["current"] = self._next is _Next.CURRENT
        state["steps_since_keyframe"] = self._steps_since_keyframe
        state["keyframes"] = self.keyframes
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output; the reference is rebuilt at the next gather (for this run's number of
        ranks and nodes, replicated or sharded, whichever variant saved it). A state without a valid reference (or
        from the direct scheme) means a keyframe next."""
        self._drop_speculation()
        super().load_state_dict(state)
        self.keyframes = int(state.get("keyframes", 0))
        self._steps_since_keyframe = int(state.get("steps_since_keyframe", 0))
        self.reference = None
        if not state.get("reference_valid", False):
            self.on_weights_changed()
            return
        self._restored = dict(state["reference"])
        self._next = _Next.CURRENT if state["current"] else _Next.UPDATE
