"""Quantized reduce-scatter (ZeRO++ qgZ / QSDP single hop): quantize W chunks, all-to-all, decode-sum in fp32."""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.distributed as dist

from composer_qsdp.comm.accounting import CallTraffic, call_traffic
from composer_qsdp.comm.quality import relative_error
from composer_qsdp.comm.seeds import mix_seed
from composer_qsdp.comm.validation import check_collective_buffers
from composer_qsdp.quant import CodedResidual
from composer_qsdp.quant.codec import FLOAT_DTYPES, Codec
from composer_qsdp.validate import is_fraction

__all__ = ["is_average", "plain_reduce_scatter", "quantized_reduce_scatter"]

_SUPPORTED = {dist.ReduceOp.SUM: False, dist.ReduceOp.AVG: True}


def is_average(op: dist.ReduceOp | dist.ReduceOp.RedOpType) -> bool:
    """``False`` for ``ReduceOp.SUM``, ``True`` for ``ReduceOp.AVG``.

    Raises:
        ValueError: any other op (MAX, PRODUCT, FSDP's ``PREMUL_SUM`` from ``set_gradient_divide_factor``...).
    """
    kind = getattr(op, "op", op)  # a ReduceOp object (e.g. PREMUL_SUM) wraps its RedOpType in `.op`
    for supported, average in _SUPPORTED.items():
        if kind == supported:
            return average
    name = getattr(kind, "name", repr(kind))
    hint = (
        " (FSDP passes PREMUL_SUM after set_gradient_divide_factor(); call "
        "set_force_sum_reduction_for_comms(True) on the FSDP modules so FSDP divides after the collective)"
        if name == "PREMUL_SUM"
        else ""
    )
    raise ValueError(f"quantized reduce-scatter supports ReduceOp SUM and AVG, got {name}{hint}")


def plain_reduce_scatter(
    output: torch.Tensor,
    input: torch.Tensor,
    group: dist.ProcessGroup,
    op: dist.ReduceOp | dist.ReduceOp.RedOpType,
    *,
    async_op: bool = False,
    off_node_peers: int = 0,
) -> tuple[CallTraffic, dist.Work | None]:
    """``reduce_scatter_tensor(output, input, op)`` exactly as FSDP issues it, ``async_op`` included, and its bytes.

    The unquantized path: nothing but the collective runs (no check, copy or allocation; the collective checks its
    buffers itself), with ``op`` as given (any op the backend has).

    Args:
        output: contiguous chunk of ``n`` elements.
        input: contiguous tensor of ``W * n`` elements (W = group size), same dtype/device.
        group: process group.
        op: the reduction.
        async_op: return the collective's ``Work`` instead of ordering it on the current stream.
        off_node_peers: peers of this rank in ``group`` on other nodes, for the per-hop count (0: one node).

    Returns:
        The bytes this rank put on the wire ((W-1)/W of the volume, in ``input``'s dtype) and the ``Work`` when
        ``async_op``, else ``None``.
    """
    work = dist.reduce_scatter_tensor(output, input, op=op, group=group, async_op=async_op)
    n, size = output.numel(), input.element_size()
    return call_traffic(group.size(), n, n * size, size, off_node_peers), work


@torch.no_grad()
def quantized_reduce_scatter(
    output: torch.Tensor,
    input: torch.Tensor,
    codec: Codec | None,
    group: dist.ProcessGroup,
    op: dist.ReduceOp | dist.ReduceOp.RedOpType,
    seed: int,
    *,
    measure_error: bool = False,
    off_node_peers: int = 0,
    residual: torch.Tensor | CodedResidual | None = None,
    residual_beta: float = 0.0,
) -> CallTraffic:
    """``reduce_scatter_tensor(output, input, op)`` with the chunks sent as ``codec`` wire buffers.

    Chunk ``r`` of ``input`` (elements ``[r*n, (r+1)*n)``) is encoded and sent to rank ``r``; each rank decodes
    the ``W`` versions of its chunk and sums them in fp32 (rank order 0..W-1), divides by ``W`` for AVG, and
    writes ``output`` in its dtype. Non-finite inputs stay non-finite in the output (so a grad scaler can skip
    the step). Work is enqueued on the current stream without host syncs.

    Args:
        output: contiguous chunk of ``n`` elements.
        input: contiguous tensor of ``W * n`` elements, same dtype/device as ``output``.
        codec: quantizer of the chunks; ``None`` runs the plain reduce-scatter with ``op`` unchanged.
            Non-floating inputs are always reduced unquantized.
        group: process group (NCCL or gloo).
        op: ``ReduceOp.SUM`` or ``ReduceOp.AVG`` (checked before any communication).
        seed: rounding-noise key of this call. The key used is ``mix_seed(seed, dist.get_rank())``: the global
            rank, so every process draws independent noise, across HSDP replicas too.
        off_node_peers: peers of this rank in ``group`` on other nodes, for the per-hop count (0: one node).
        measure_error: also return the relative quantization error of this rank's ``W`` encoded chunks.
        residual: this rank's error-feedback residual (LoCo), a contiguous float32 or bfloat16 tensor of ``W * n``
            elements on ``input``'s device or a :class:`~composer_qsdp.quant.CodedResidual` of ``W`` rows of ``n``
            elements there, owned by the caller and updated in place by the codec's
            :meth:`~composer_qsdp.quant.Codec.encode_rows_feedback`: the chunks sent are those of ``c = input +
            residual`` (in fp32), and then ``residual <- beta * residual + (1 - beta) * (c - decode(encode(c)))``;
            entries that come out non-finite (a NaN/Inf gradient) are reset to zero, so one overflowing step does not
            poison later ones. Ignored on the unquantized path (no error to feed back). ``None``: no feedback.
        residual_beta: ``beta`` of the residual's moving average, in ``[0, 1)`` (0: classic error feedback).

    Returns:
        The bytes this rank put on the wire ((W-1)/W of the volume) and the bf16 / native-dtype equivalents.

    Raises:
        ValueError: an op other than SUM/AVG on the quantized path, mismatched buffers, or a residual of the wrong
            dtype, size or device, or ``residual_beta`` outside ``[0, 1)``.
    """
    world_size = group.size()
    n = check_collective_buffers("quantized_reduce_scatter", output, input, world_size, gathers=False)
    if codec is None or input.dtype not in FLOAT_DTYPES or n == 0:
        return plain_reduce_scatter(output, input, group, op, off_node_peers=off_node_peers)[0]
    average = is_average(op)
    if residual is not None and not is_fraction(residual_beta):
        raise ValueError(f"quantized_reduce_scatter: residual_beta={residual_beta!r} is invalid; allowed: a number in "
                         "[0, 1)")
    rows = input.view(world_size, n)
    key = mix_seed(seed, dist.get_rank())
    error = None
    if residual is None:
        send = codec.encode_rows(rows, seed=key)
        if measure_error:  # before `output` is written, in case it aliases a chunk of `input`
            error = relative_error(codec.decode_rows(send, n, torch.float32), rows)
    else:
        # The compensated chunks are encoded and the residual updated in one pass where the codec has a fused kernel
        # (no fp32 copy of the W * n compensated values, of their decode or of the error in memory).
        before = None
        if measure_error:  # sampled calls only
            before = residual.decode() if isinstance(residual, CodedResidual) else residual.view(world_size, n).float()
        send = codec.encode_rows_feedback(rows, residual, residual_beta, seed=key)
        if before is not None:
            compensated = rows.to(torch.float32) + before
            error = relative_error(codec.decode_rows(send, n, torch.float32), compensated)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    # The fp32 sum, the average's division and the rounding to the output dtype in one pass where the codec has a
    # fused kernel (no fp32 intermediate of n elements written, divided and copied).
    codec.decode_sum(recv, n, out=output.view(-1), divisor=world_size if average else 1)
    traffic = call_traffic(world_size, n, send.shape[1], input.element_size(), off_node_peers)
    return replace(traffic, rel_error=error) if measure_error else traffic

