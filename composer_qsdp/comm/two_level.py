"""Two-level quantized reduce-scatter (ZeRO++ qgZ, SDP4Bit TLq-HS): an intra-node all-to-all, a local reduction,
an inter-node all-to-all among the ranks with the same local index, a final reduction.

With ``M`` nodes of ``L`` ranks (a :class:`~composer_qsdp.comm.node_groups.NodeGroups` split) and chunk
``chunks[a][l]`` belonging to the rank at ``(node a, local l)``, as in a flat reduce-scatter:

1. every rank encodes its ``W = M * L`` chunks with the intra codec (row ``g`` is chunk ``g``, exactly as the flat
   collective encodes them) and reorders the encoded rows so that local peer ``l`` receives the chunks of
   ``(0, l), ..., (M-1, l)`` (ZeRO++'s tensor slice reordering, done on the encoded bytes: ``bits / 32`` of an fp32
   input's size);
2. intra-node all-to-all; each rank decodes and sums the ``L`` versions of each of its ``M`` chunks in fp32, in
   local order (the codec's fused dequantize-sum): the node's partial sums of the chunks its local index owns on
   every node;
3. the ``M`` partial sums are encoded with the inter codec, row ``a`` for node ``a``;
4. inter-node all-to-all; each rank decodes and sums the ``M`` versions of its own chunk in fp32, in node order,
   and divides by ``W`` for AVG.

Only step 4's bytes cross nodes: ``(M-1)`` chunks per rank instead of the flat collective's ``(M-1) * L``
(ZeRO++ §qgZ: cross-node volume ``M / (Z * N)`` per GPU instead of ``M / Z``). Steps 2 and 3 run as two kernels
(dequantize-sum, then quantize) with an fp32 buffer of ``M`` chunks between them; ZeRO++'s and SDP4Bit's fused
dequantize-reduce-quantize kernels save that buffer's write and read.

Hadamard smoothing (SDP4Bit §3.2, TLq-HS): with ``rotation_block=B`` each chunk is zero-padded to whole
``B``-element blocks and rotated by the normalized Walsh-Hadamard matrix once before step 1; both hops quantize and
sum in the rotated domain (``sum_i H g_i = H sum_i g_i``) and one inverse rotation follows step 4. The rotated
chunks take an fp32 copy of the input, unless the caller lets the collective overwrite an fp32 input whose chunks
are whole blocks (``overwrite_input``; FSDP's reduce-scatter input is a scratch buffer): then they are rotated in
place.

A split with one node or one rank per node has a single hop: it runs the flat collective with that hop's codec
(the intra codec on one node, the inter codec across single-rank nodes), bit-identical to
:func:`~composer_qsdp.comm.reduce_scatter.quantized_reduce_scatter` when there is no rotation.

Error feedback on the inter-node hop (LoCo, Xie et al. 2024, on qgZ's second hop): with ``inter_residual`` ``e``,
step 3 encodes ``c = partial + e`` instead of the partial sums and updates ``e <- beta e + (1 - beta)(c -
decode(encode(c)))`` (:meth:`~composer_qsdp.quant.Codec.encode_rows_feedback`). ``e`` has the shape of what step 3
encodes, ``M`` rows of ``m`` elements (``m = n``, or ``n`` padded to whole rotation blocks: the residual then lives
in the rotated domain, like the partial sums): ``1 / L`` of a flat reduce-scatter's ``W * n``. The intra-node hop
keeps no residual. With one rank per node the single hop is the inter-node one and the residual covers its ``W``
chunks, as the flat collective's; on one node there is no inter-node hop to feed back.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from composer_qsdp.comm.accounting import CallTraffic, call_traffic
from composer_qsdp.comm.node_groups import NodeGroups
from composer_qsdp.comm.quality import relative_error
from composer_qsdp.comm.reduce_scatter import is_average, quantized_reduce_scatter
from composer_qsdp.comm.seeds import mix_seed
from composer_qsdp.comm.validation import check_collective_buffers
from composer_qsdp.quant import FLOAT_DTYPES, Codec, CodedResidual, hadamard_rows, hadamard_rows_
from composer_qsdp.quant.buckets import ieee_div
from composer_qsdp.quant.codec import sum_rows_in_order
from composer_qsdp.validate import is_fraction

__all__ = ["INTER_HOP", "is_power_of_two", "two_level_reduce_scatter"]

#: Mixed into the inter-node hop's noise key, ``mix_seed(seed, rank, INTER_HOP)``; the intra-node hop uses the
#: flat collective's key ``mix_seed(seed, rank)``.
INTER_HOP = 1


def is_power_of_two(value: object) -> bool:
    """True for an int (not a bool) ``1, 2, 4, ...``: the Hadamard block sizes."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1 and value & (value - 1) == 0


class _Hop:
    """One hop's wire format: a codec's, or the raw values in ``dtype`` when there is no codec."""

    def __init__(self, codec: Codec | None, dtype: torch.dtype) -> None:
        self.codec, self.dtype = codec, dtype

    def wire_bytes(self, numel: int) -> int:
        return numel * self.dtype.itemsize if self.codec is None else self.codec.wire_bytes(numel)

    def encode_rows(self, rows: torch.Tensor, seed: int, feedback: _Feedback | None = None) -> torch.Tensor:
        if self.codec is None:  # nothing is lost on the wire: no error to feed back
            return rows.to(self.dtype).contiguous().view(torch.uint8)
        if feedback is None:
            return self.codec.encode_rows(rows, seed=seed)
        return self.codec.encode_rows_feedback(rows, feedback.residual, feedback.beta, seed=seed)

    def decode_rows(self, wire: torch.Tensor, numel: int) -> torch.Tensor:
        if self.codec is None:
            return wire.view(self.dtype).float()
        return self.codec.decode_rows(wire, numel, torch.float32)

    def decode_sum(self, wire: torch.Tensor, numel: int) -> torch.Tensor:
        if self.codec is None:
            return sum_rows_in_order(self.decode_rows(wire, numel))
        return self.codec.decode_sum(wire, numel)


@dataclass(frozen=True)
class _Feedback:
    """A hop's error feedback: the caller's residual (updated in place) and its moving-average ``beta``."""

    residual: torch.Tensor | CodedResidual
    beta: float

    def compensate(self, rows: torch.Tensor) -> torch.Tensor:
        """``rows + residual`` in fp32, a new tensor (what the hop encodes; read before the encode updates it)."""
        residual = self.residual
        values = residual.decode() if isinstance(residual, CodedResidual) else residual.view(rows.shape).float()
        return rows.float() + values


def _exchange(
    rows: torch.Tensor, hop: _Hop, group: dist.ProcessGroup, seed: int, per_peer: int,
    order: torch.Tensor | None = None, feedback: _Feedback | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Encode ``[P * per_peer, m]`` rows (compensated by ``feedback``'s residual, which is updated), send rows
    ``[p * per_peer, (p+1) * per_peer)`` (after ``order``) to peer ``p`` of ``group``, and sum what arrives by
    position: returns the fp32 ``[per_peer, m]`` sums (sources added in group-rank order) and the encoded rows
    (before ``order``)."""
    m = rows.shape[1]
    wire = hop.encode_rows(rows, seed, feedback)
    send = wire if order is None else wire.index_select(0, order)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    if per_peer == 1:
        return hop.decode_sum(recv, m).unsqueeze(0), wire
    by_source = recv.view(-1, per_peer, recv.shape[1])
    return torch.stack([hop.decode_sum(by_source[:, j], m) for j in range(per_peer)]), wire


@torch.no_grad()
def two_level_reduce_scatter(
    output: torch.Tensor,
    input: torch.Tensor,
    intra_codec: Codec | None,
    inter_codec: Codec | None,
    group: dist.ProcessGroup,
    split: NodeGroups,
    op: dist.ReduceOp | dist.ReduceOp.RedOpType,
    seed: int,
    *,
    rotation_block: int | None = None,
    measure_error: bool = False,
    inter_residual: torch.Tensor | CodedResidual | None = None,
    inter_beta: float = 0.0,
    overwrite_input: bool = False,
) -> CallTraffic:
    """``reduce_scatter_tensor(output, input, op)`` in two hops (see the module docstring).

    Rank ``r`` of ``group`` ends with the reduced chunk ``r`` (elements ``[r*n, (r+1)*n)``), as with a flat
    reduce-scatter. Sums are fp32; ``output`` is written in its dtype. Non-finite inputs stay non-finite. Work is
    enqueued on the current stream; no host syncs (the first call on a device copies the reordering index there).

    Args:
        output: contiguous chunk of ``n`` elements.
        input: contiguous tensor of ``W * n`` elements, same dtype/device as ``output``.
        intra_codec: the intra-node hop's codec; ``None`` sends that hop's values in the input dtype.
        inter_codec: the inter-node hop's codec; ``None`` sends the partial sums in the input dtype.
        group: the process group (NCCL or gloo) that ``split`` describes.
        split: ``node_groups(topology, group)``, the group's ranks by node.
        op: ``ReduceOp.SUM`` or ``ReduceOp.AVG`` (checked before any communication).
        seed: rounding-noise key of this call: the intra hop uses ``mix_seed(seed, dist.get_rank())``, the inter
            hop ``mix_seed(seed, dist.get_rank(), INTER_HOP)``.
        rotation_block: Hadamard block size in elements (a power of two, SDP4Bit: 32), or ``None``.
        measure_error: also return the relative quantization error of everything this rank encoded (both hops; the
            inter hop's against the compensated partial sums when there is feedback).
        inter_residual: this rank's error-feedback residual of the inter-node hop (see the module docstring), owned
            by the caller and updated in place: a contiguous float32 or bfloat16 tensor of ``M * m`` elements on
            ``input``'s device, or a :class:`~composer_qsdp.quant.CodedResidual` of ``M`` rows of ``m`` elements
            there (``M``: ``split.nodes``; ``m``: ``n``, or ``n`` rounded up to whole ``rotation_block``). Non-finite
            entries are reset to zero. Ignored where that hop is unquantized (``inter_codec`` ``None``, a
            non-floating input, ``n == 0``). ``None``: no feedback.
        inter_beta: the residual's moving-average ``beta``, in ``[0, 1)`` (0: classic error feedback).
        overwrite_input: the caller does not read ``input`` after the call, so that the rotation may overwrite it
            (float32 chunks of whole ``rotation_block``s) instead of taking an fp32 copy of its size.

    Returns:
        Bytes this rank sent: both hops in ``sent``, the inter-node hop in ``inter_node``; ``bf16``/``native`` are
        the flat collective's, as for :func:`~composer_qsdp.comm.reduce_scatter.quantized_reduce_scatter`.

    Raises:
        ValueError: an op other than SUM/AVG, mismatched buffers, a split of another group size, a
            ``rotation_block`` that is not a power of two, an ``inter_residual`` on one node (no inter-node hop) or
            of the wrong dtype, size or device, or ``inter_beta`` outside ``[0, 1)``.
    """
    world = group.size()
    n = check_collective_buffers("two_level_reduce_scatter", output, input, world, gathers=False)
    if rotation_block is not None and not is_power_of_two(rotation_block):
        raise ValueError(f"rotation_block={rotation_block!r} is invalid; allowed: a power of two (elements), or None")
    if split.nodes * split.ranks_per_node != world:
        raise ValueError(
            f"two_level_reduce_scatter: the node split has {split.nodes} nodes x {split.ranks_per_node} ranks but the "
            f"group has {world} ranks; pass node_groups(topology, group) of this group"
        )
    feedback = None
    if inter_residual is not None:
        if split.nodes == 1:
            raise ValueError("two_level_reduce_scatter: inter_residual was given but the group is on one node, which "
                             "has no inter-node hop to feed back; pass None")
        if not is_fraction(inter_beta):
            raise ValueError(f"two_level_reduce_scatter: inter_beta={inter_beta!r} is invalid; allowed: a number in "
                             "[0, 1)")
        feedback = _Feedback(inter_residual, inter_beta)
    off_node_peers = (split.nodes - 1) * split.ranks_per_node
    if input.dtype not in FLOAT_DTYPES or n == 0:  # nothing to quantize: the plain collective with FSDP's op
        return quantized_reduce_scatter(output, input, None, group, op, seed, off_node_peers=off_node_peers)
    single_hop_codec = intra_codec if split.nodes == 1 else inter_codec
    if not split.two_level and (rotation_block is None or single_hop_codec is None):
        # With one rank per node this hop is the inter-node one: its feedback is the flat collective's (LoCo's).
        return quantized_reduce_scatter(output, input, single_hop_codec, group, op, seed,
                                        measure_error=measure_error, off_node_peers=off_node_peers,
                                        residual=inter_residual, residual_beta=inter_beta)  # fmt: skip
    average = is_average(op)
    rank = dist.get_rank()
    rows = input.view(world, n)
    if rotation_block is not None:
        padded = -(-n // rotation_block) * rotation_block
        if overwrite_input and input.dtype == torch.float32 and padded == n:
            rows = hadamard_rows_(rows, rotation_block)
        else:
            rows = hadamard_rows(rows, rotation_block, padded, torch.float32)
    m = rows.shape[1]
    if split.two_level:
        intra, inter = _Hop(intra_codec, input.dtype), _Hop(inter_codec, input.dtype)
        order = split.send_index(input.device)
        partial, wire1 = _exchange(rows, intra, split.intra, mix_seed(seed, rank), split.nodes, order)
        sent = _sent(partial, inter, feedback, measure_error)
        total, wire2 = _exchange(partial, inter, split.inter, mix_seed(seed, rank, INTER_HOP), 1, feedback=feedback)
        intra_bytes = (split.ranks_per_node - 1) * split.nodes * intra.wire_bytes(m)
        inter_bytes = (split.nodes - 1) * inter.wire_bytes(m)
        encoded = ((intra, wire1, rows), (inter, wire2, sent))
    else:  # one hop, in the rotated domain: the inter-node one when there is feedback (one rank per node)
        hop = _Hop(single_hop_codec, input.dtype)
        sent = _sent(rows, hop, feedback, measure_error)
        total, wire = _exchange(rows, hop, group, mix_seed(seed, rank), 1, feedback=feedback)
        intra_bytes = (world - 1 - off_node_peers) * hop.wire_bytes(m)
        inter_bytes = off_node_peers * hop.wire_bytes(m)
        encoded = ((hop, wire, sent),)
    total = total[0]
    if average:  # one IEEE division on every device, as the flat reduce-scatter's kernels divide
        total = ieee_div(total, world)
    if rotation_block is not None:
        total = hadamard_rows(total.view(1, -1), rotation_block, n, torch.float32)[0]
    flat = call_traffic(world, n, 0, input.element_size(), off_node_peers)
    traffic = replace(flat, sent=intra_bytes + inter_bytes, inter_node=inter_bytes)
    if measure_error and any(hop.codec is not None for hop, _, _ in encoded):
        decoded = torch.cat([hop.decode_rows(wire, m).flatten() for hop, wire, _ in encoded])
        traffic = replace(traffic, rel_error=relative_error(decoded, torch.cat([x.flatten() for _, _, x in encoded])))
    output.view(-1).copy_(total)
    return traffic


def _sent(rows: torch.Tensor, hop: _Hop, feedback: _Feedback | None, measure_error: bool) -> torch.Tensor:
    """What the hop encodes from ``rows``, for the error measurement: the rows, or their compensation by the
    residual as it is before the encode updates it (computed on measured calls only, where a codec has an error)."""
    if feedback is None or not measure_error or hop.codec is None:
        return rows
    return feedback.compensate(rows)

