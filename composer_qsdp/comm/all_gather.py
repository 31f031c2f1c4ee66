"""Quantized all-gather: every rank quantizes its chunk, the bytes are gathered, every rank decodes all chunks."""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.distributed as dist

from composer_qsdp.comm.accounting import CallTraffic, call_traffic
from composer_qsdp.comm.quality import relative_error
from composer_qsdp.comm.seeds import mix_seed
from composer_qsdp.comm.validation import check_collective_buffers
from composer_qsdp.quant.codec import FLOAT_DTYPES, Codec

__all__ = ["quantized_all_gather"]


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

    Returns:
        The bytes this rank put on the wire ((W-1)/W of the volume) and the bf16 / native-dtype equivalents.

    Raises:
        ValueError: mismatched buffers (see :func:`~composer_qsdp.comm.validation.check_collective_buffers`).
    """
    world_size, rank = group.size(), group.rank()
    n = check_collective_buffers("quantized_all_gather", output, input, world_size, gathers=True)
    if codec is None or input.dtype not in FLOAT_DTYPES or n == 0:
        dist.all_gather_into_tensor(output, input, group=group)
        return call_traffic(world_size, n, n * input.element_size(), input.element_size(), off_node_peers)
    wire = codec.encode(input, seed=mix_seed(seed, rank))
    gathered = torch.empty(world_size * wire.numel(), dtype=torch.uint8, device=input.device)
    dist.all_gather_into_tensor(gathered, wire, group=group)
    decoded = codec.decode_rows(gathered.view(world_size, wire.numel()), n, output.dtype)
    traffic = call_traffic(world_size, n, wire.numel(), input.element_size(), off_node_peers)
    if measure_error:
        # Before the copy below: `input` may be this rank's slot of `output`.
        traffic = replace(traffic, rel_error=relative_error(decoded[rank], input))
    output.view(world_size, n).copy_(decoded)
    return traffic
