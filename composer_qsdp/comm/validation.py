"""Argument checks shared by the quantized collectives (host-side only: shapes, dtypes, devices)."""

from __future__ import annotations

import torch

__all__ = ["check_collective_buffers"]


def check_collective_buffers(
    name: str, output: torch.Tensor, input: torch.Tensor, world_size: int, *, gathers: bool
) -> int:
    """Validate the buffers of an all-gather (``gathers=True``) or reduce-scatter and return the chunk size.

    An all-gather takes a chunk of ``n`` elements and fills ``W * n``; a reduce-scatter takes ``W * n``
    and fills ``n``. Both tensors must be contiguous, share dtype and device.

    Returns:
        ``n``, the number of elements in one rank's chunk.

    Raises:
        ValueError: naming the offending tensor and what is required.
    """
    for label, t in (("output", output), ("input", input)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: {label} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_contiguous():
            raise ValueError(f"{name}: {label} must be contiguous (shape {tuple(t.shape)}, stride {t.stride()})")
    if output.dtype != input.dtype:
        raise ValueError(f"{name}: output dtype {output.dtype} differs from input dtype {input.dtype}")
    if output.device != input.device:
        raise ValueError(f"{name}: output is on {output.device} but input is on {input.device}")
    whole, chunk = (output, input) if gathers else (input, output)
    n = chunk.numel()
    if whole.numel() != world_size * n:
        raise ValueError(
            f"{name}: {'output' if gathers else 'input'} has {whole.numel()} elements but the group of "
            f"{world_size} ranks with {n}-element chunks needs exactly {world_size * n}"
        )
    return n
