"""Quantized all-gather: every rank quantizes its chunk, the bytes are gathered, every rank decodes all chunks."""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.distributed as dist

from composer_qsdp.comm.accounting import CallTraffic, call_traffic
from composer_qsdp.comm.quality import relative_error
from composer_qsdp.comm.seeds import mix_seed
from composer_qsdp.comm.segments import Segments
from composer_qsdp.comm.validation import check_collective_buffers
from composer_qsdp.quant.codec import FLOAT_DTYPES, Codec

__all__ = ["plain_all_gather", "quantized_all_gather"]


def plain_all_gather(
    output: torch.Tensor,
    input: torch.Tensor,
    group: dist.ProcessGroup,
    *,
    async_op: bool = False,
    off_node_peers: int = 0,
) -> tuple[CallTraffic, dist.Work | None]:
    """``all_gather_into_tensor(output, input)`` exactly as FSDP issues it, ``async_op`` included, and its bytes.

    The unquantized path: nothing but the collective runs (no check, copy or allocation; the collective checks its
    buffers itself), so a unit QSDP leaves unquantized communicates as plain FSDP does.

    Args:
        output: contiguous tensor of ``W * n`` elements (W = group size).
        input: contiguous chunk of ``n`` elements, same dtype/device.
        group: process group.
        async_op: return the collective's ``Work`` instead of ordering it on the current stream.
        off_node_peers: peers of this rank in ``group`` on other nodes, for the per-hop count (0: one node).

    Returns:
        The bytes this rank put on the wire ((W-1)/W of the volume, in ``input``'s dtype) and the ``Work`` when
        ``async_op``, else ``None``.
    """
    work = dist.all_gather_into_tensor(output, input, group=group, async_op=async_op)
    n, size = input.numel(), input.element_size()
    return call_traffic(group.size(), n, n * size, size, off_node_peers), work


@torch.no_grad()
def quantized_all_gather(
    output: torch.Tensor,
    input: torch.Tensor,
    codec: Codec | None,
    group: dist.ProcessGroup,
    seed: int,
    *,
    measure_error: bool = False,
    off_node_peers: int = 0,
    segments: Segments | None = None,
) -> CallTraffic:
    """``all_gather_into_tensor(output, input)`` with the chunks sent as ``codec`` wire buffers.

    Every rank, the chunk's owner included, writes the *decoded* value of every chunk, so all ranks end up with
    bit-identical ``output``. ``input`` may alias this rank's slot of ``output`` (FSDP2 gathers in place): it
    is encoded before ``output`` is written. Work is enqueued on the current stream without host syncs.

    Args:
        output: contiguous tensor of ``W * n`` elements (W = group size), same dtype/device as ``input``.
        input: contiguous chunk of ``n`` elements.
        codec: quantizer of the chunks; ``None`` sends the chunk unquantized. Non-floating inputs (FSDP2's
            ``uint8`` mixed-dtype path) are always sent unquantized.
        group: process group (NCCL or gloo).
        seed: rounding-noise key of this call. The key used is ``mix_seed(seed, group.rank())``: ranks draw
            independent noise, and HSDP replicas (same group rank, same shard) decode identical weights.
        off_node_peers: peers of this rank in ``group`` on other nodes, for the per-hop count (0: one node).
        measure_error: also return the relative quantization error of this rank's chunk (device tensor).
        segments: the chunk's pieces (:class:`~composer_qsdp.comm.segments.Segments`): each quantized piece
            starts a bucket of its own, raw pieces travel unquantized after the codes. ``None``: one bucketed run.

    Returns:
        The bytes this rank put on the wire ((W-1)/W of the volume) and the bf16 / native-dtype equivalents.

    Raises:
        ValueError: mismatched buffers (see :func:`~composer_qsdp.comm.validation.check_collective_buffers`).
    """
    world_size, rank = group.size(), group.rank()
    n = check_collective_buffers("quantized_all_gather", output, input, world_size, gathers=True)
    if codec is None or input.dtype not in FLOAT_DTYPES or n == 0:
        return plain_all_gather(output, input, group, off_node_peers=off_node_peers)[0]
    if segments is not None:
        return _segmented_all_gather(output, input, codec, group, seed, measure_error, off_node_peers, segments)
    wire = codec.encode(input, seed=mix_seed(seed, rank))
    gathered = torch.empty(world_size * wire.numel(), dtype=torch.uint8, device=input.device)
    dist.all_gather_into_tensor(gathered, wire, group=group)
    gathered = gathered.view(world_size, wire.numel())
    traffic = call_traffic(world_size, n, wire.numel(), input.element_size(), off_node_peers)
    if not measure_error:
        # Decoding straight into `output` saves a pass over it; `input`, which may be this rank's slot of `output`,
        # was encoded earlier on this stream.
        codec.decode_rows(gathered, n, output.dtype, out=output.view(world_size, n))
        return traffic
    decoded = codec.decode_rows(gathered, n, output.dtype)
    # Before the copy below: `input` may be this rank's slot of `output`.
    traffic = replace(traffic, rel_error=relative_error(decoded[rank], input))
    output.view(world_size, n).copy_(decoded)
    return traffic


def _segmented_all_gather(
    output: torch.Tensor,
    input: torch.Tensor,
    codec: Codec,
    group: dist.ProcessGroup,
    seed: int,
    measure_error: bool,
    off_node_peers: int,
    segments: Segments,
) -> CallTraffic:
    """The quantized all-gather of a chunk in :class:`Segments`: one wire per rank, the codes of the
    bucket-aligned quantized pieces (4-byte multiple) followed by the raw pieces' bytes."""
    world_size, rank, n = group.size(), group.rank(), input.numel()
    if segments.numel != n:
        raise ValueError(f"segments cover {segments.numel} elements but the chunk has {n}")
    plan = segments.plan(codec.bucket_size, input.device)
    codes = codec.encode(input[plan.source], seed=mix_seed(seed, rank)) if plan.source.numel() else None
    code_bytes = 0 if codes is None else codes.numel()
    wire = torch.cat([t for t in (codes, input[plan.raw].view(torch.uint8)) if t is not None])
    gathered = torch.empty(world_size * wire.numel(), dtype=torch.uint8, device=input.device)
    dist.all_gather_into_tensor(gathered, wire, group=group)
    gathered = gathered.view(world_size, wire.numel())
    traffic = call_traffic(world_size, n, wire.numel(), input.element_size(), off_node_peers)
    rows = output.view(world_size, n)
    if codes is not None:
        decoded = codec.decode_rows(gathered[:, :code_bytes], plan.source.numel(), output.dtype)[:, plan.aligned]
        if measure_error:  # raw pieces are exact; before `rows` is written (`input` may alias it)
            own = input.clone()
            own[plan.quantized] = decoded[rank]
            traffic = replace(traffic, rel_error=relative_error(own, input))
        rows[:, plan.quantized] = decoded
    if plan.raw.numel():
        rows[:, plan.raw] = gathered[:, code_bytes:].contiguous().view(output.dtype)
    return traffic
