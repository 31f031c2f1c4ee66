"""Compressed all-reduce with error feedback at the workers and at the servers (1-bit Adam, 0/1 Adam).

The two-phase scheme of DeepSpeed's ``compressed_allreduce`` (``deepspeed/runtime/comm/nccl.py``), with any
deterministic codec (0/1 Adam uses the 1-bit ``"sign"`` codec). The flat tensor is zero-padded to ``W * c``
elements and cut into ``W`` chunks of ``c`` (:func:`error_feedback_chunk_numel`: whole codec buckets, so no bucket
spans two chunks); rank ``r`` is the *server* of chunk ``r``:

1. worker: ``buf = x + worker_error``; every chunk of ``buf`` is encoded; ``worker_error = buf - decode(wire)``.
2. phase 1, one ``all_to_all``: chunk ``r`` of every rank goes to rank ``r``. DeepSpeed sends the signs with an
   all-to-all and the one scale per worker with an all-gather; here the scales are the per-bucket metadata inside
   each chunk's wire, so one collective carries both.
3. server: the mean of the ``W`` decoded versions of its chunk (fp32, summed in rank order), plus
   ``server_error``, is encoded again; ``server_error = that - decode(its wire)``.
4. phase 2, one ``all_gather``: every rank decodes every server's wire, its own included, so all ranks end with
   bit-identical results.

Absent elements: the padding past ``n`` and the elements a caller marks invalid (``valid``: e.g. the gaps a caller
leaves so that every bucket holds one tensor's elements only) enter as zeros, come back as zeros and never carry
error, so they feed nothing back; in a bucket they share with real elements they count in the codec's bucket
size like any zero (for the sign codec: in the ``d`` of ``||x|| / sqrt(d)``).

Stateless: the caller owns the error buffers (:class:`composer_qsdp.schemes.OneBitAllReduce` does) and passes
them to every call.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from composer_qsdp.comm.accounting import CallTraffic, call_traffic
from composer_qsdp.quant.buckets import ieee_div
from composer_qsdp.quant.codec import Codec, sum_rows_in_order

__all__ = ["compressed_all_reduce", "error_feedback_chunk_numel"]

#: Chunks are whole numbers of bytes of 1-bit codes.
_CHUNK_ALIGN = 8


def error_feedback_chunk_numel(numel: int, world_size: int, codec: Codec | None) -> int:
    """Elements of each rank's chunk of a :func:`compressed_all_reduce` of ``numel`` elements over ``world_size``
    ranks with ``codec``: ``ceil(numel / world_size)`` rounded up to whole buckets of the codec and to a multiple of
    8 (a chunk's 1-bit codes fill whole bytes). The worker error buffer holds ``world_size`` chunks, the server error
    buffer one."""
    align = _CHUNK_ALIGN if codec is None else math.lcm(_CHUNK_ALIGN, codec.bucket_size)
    chunk = -(-numel // world_size)
    return -(-chunk // align) * align


@torch.no_grad()
def compressed_all_reduce(
    tensor: torch.Tensor,
    worker_error: torch.Tensor,
    server_error: torch.Tensor,
    codec: Codec | None,
    group: dist.ProcessGroup,
    *,
    valid: torch.Tensor | None = None,
    off_node_peers: int = 0,
) -> CallTraffic:
    """Replace ``tensor`` by the mean over the ranks of ``group``, sent compressed with error feedback (see the
    module docstring), and update both error buffers in place.

    Args:
        tensor: 1-D contiguous fp32 tensor of ``n`` elements, the same ``n`` on every rank.
        worker_error: fp32 tensor of ``W * c`` elements on ``tensor``'s device (``c``:
            :func:`error_feedback_chunk_numel`); zeros before the first call.
        server_error: fp32 tensor of ``c`` elements; zeros before the first call.
        codec: a deterministic codec (0/1 Adam: ``make_codec("sign")``), or ``None`` to send fp32 values: the
            result is then the exact mean (rank-order fp32 sum divided by ``W``) and the error buffers stay zero.
        group: process group (NCCL or gloo).
        valid: bool tensor of ``n`` elements, the same on every rank: the elements that carry data (default: all).
            The others are ignored, set to zero and never carry error.
        off_node_peers: peers of this rank in ``group`` on other nodes, for the per-hop count (0: one node).

    Returns:
        The bytes this rank put on the wire (``(W-1)/W`` of both phases' volumes, NCCL's convention), and what a
        bf16 and an fp32 all-reduce of ``tensor`` would send (a reduce-scatter plus an all-gather: each chunk
        moves twice).

    Raises:
        ValueError: a stochastic codec (error feedback needs the same compressor every call, and this
            collective takes no seed), or buffers of the wrong dtype, shape or device, naming them.
    """
    world_size = group.size()
    n = tensor.numel()
    chunk = error_feedback_chunk_numel(n, world_size, codec)
    _check_buffers(tensor, worker_error, server_error, world_size, chunk, codec, valid)
    absent = torch.ones(world_size * chunk, dtype=torch.bool, device=tensor.device)
    absent[:n] = False if valid is None else ~valid
    buf = torch.zeros(world_size * chunk, dtype=torch.float32, device=tensor.device)
    buf[:n] = tensor
    buf += worker_error
    buf.masked_fill_(absent, 0)
    rows = buf.view(world_size, chunk)
    if codec is None:
        send = rows
        wire_bytes = chunk * 4
    else:
        send = codec.encode_rows(rows)
        wire_bytes = send.shape[1]
        torch.sub(buf, codec.decode_rows(send, chunk).reshape(-1), out=worker_error)
        worker_error.masked_fill_(absent, 0)

    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    mean = sum_rows_in_order(recv) if codec is None else codec.decode_sum(recv, chunk)
    mean = ieee_div(mean, world_size)  # one IEEE division on every device (torch's CUDA scalar division is not)
    served_absent = absent.view(world_size, chunk)[group.rank()]  # this rank serves chunk `rank`
    mean.masked_fill_(served_absent, 0)
    mean += server_error
    if codec is None:
        served = mean
    else:
        served = codec.encode(mean)
        torch.sub(mean, codec.decode(served, chunk), out=server_error)
        server_error.masked_fill_(served_absent, 0)

    gathered = torch.empty(world_size * served.numel(), dtype=served.dtype, device=served.device)
    dist.all_gather_into_tensor(gathered, served, group=group)
    if codec is not None:
        gathered = codec.decode_rows(gathered.view(world_size, -1), chunk).reshape(-1)
    tensor.copy_(gathered[:n].masked_fill_(absent[:n], 0))
    # Both phases move one chunk per peer: count them as one flat collective of chunks twice as large.
    return call_traffic(world_size, 2 * chunk, 2 * wire_bytes, 4, off_node_peers)


def _check_buffers(
    tensor: torch.Tensor,
    worker_error: torch.Tensor,
    server_error: torch.Tensor,
    world_size: int,
    chunk: int,
    codec: Codec | None,
    valid: torch.Tensor | None,
) -> None:
    if codec is not None and codec.unbiased:
        raise ValueError(
            f"compressed_all_reduce needs a deterministic codec, got {codec!r} with stochastic rounding: error "
            "feedback compensates a fixed compressor (allowed: the sign codec, symmetric, minmax with "
            "rounding='nearest', or None)"
        )
    expected = {"tensor": max(tensor.numel(), 1), "worker_error": world_size * chunk, "server_error": chunk}
    for label, t in (("tensor", tensor), ("worker_error", worker_error), ("server_error", server_error)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"compressed_all_reduce: {label} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.float32 or t.dim() != 1 or not t.is_contiguous():
            raise ValueError(f"compressed_all_reduce: {label} must be a contiguous 1-D float32 tensor, got dtype "
                             f"{t.dtype}, shape {tuple(t.shape)}, contiguous={t.is_contiguous()}")
        if t.numel() != expected[label]:
            raise ValueError(f"compressed_all_reduce: {label} has {t.numel()} elements; a tensor of "
                             f"{tensor.numel()} elements (at least 1) over {world_size} ranks needs "
                             f"{expected[label]}")
        if t.device != tensor.device:
            raise ValueError(f"compressed_all_reduce: {label} is on {t.device} but tensor is on {tensor.device}")
    if valid is not None and (valid.dtype != torch.bool or valid.shape != tensor.shape
                              or valid.device != tensor.device):
        raise ValueError(f"compressed_all_reduce: valid must be a bool tensor shaped like tensor {tuple(tensor.shape)} "
                         f"on {tensor.device}, got {valid.dtype} {tuple(valid.shape)} on {valid.device}")
