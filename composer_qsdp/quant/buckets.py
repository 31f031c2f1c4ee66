"""Bucketing of rows, bucket lattices and the exact division of bucket statistics, for the bucketed codecs' torch
references."""

from __future__ import annotations

import torch

__all__ = ["FP32_MAX", "bucket_lattice", "bucket_min_max", "bucket_width", "ieee_div"]

#: The largest finite fp32 number: the codecs cap the reciprocal of a tiny step or abs-max by it, so that it never
#: becomes infinity (the kernels use :data:`composer_qsdp.kernels.groups.FP32_MAX`, the same value).
FP32_MAX = torch.finfo(torch.float32).max


def bucket_width(numel: int, bucket_size: int) -> int:
    """Elements per bucket of the ``[R, nb, width]`` view in which the torch references process rows of ``numel``
    elements: ``bucket_size``, or ``numel`` when the row is a single, partial bucket.

    The references pad each row to ``nb * width`` elements. Padding a row smaller than one bucket to the whole
    bucket would cost memory in proportion to ``bucket_size`` rather than to the tensor (1 GiB to encode 100
    elements in buckets of 2**28); this way the padding stays below the row's own length.
    """
    return min(numel, bucket_size)


def bucket_min_max(x: torch.Tensor, bucket_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split each row of ``[R, n]`` ``x`` into buckets of ``bucket_size`` elements, in fp32.

    Returns ``(xb [R, nb, width], lo [R, nb], hi [R, nb])``: the buckets padded to :func:`bucket_width` elements
    and their min and max. A partial last bucket is filled with the row's last element, a valid member of that
    bucket, so its min/max are unchanged; NaN propagates into both.
    """
    rows, n = x.shape
    nb = -(-n // bucket_size)
    width = bucket_width(n, bucket_size)
    xf = x.to(torch.float32)
    if nb * width > n:
        xf = torch.cat([xf, xf[:, -1:].expand(rows, nb * width - n)], dim=1)
    xb = xf.view(rows, nb, width)
    return xb, xb.amin(dim=2), xb.amax(dim=2)


def ieee_div(numerator: torch.Tensor, divisor: int | float) -> torch.Tensor:
    """``numerator / divisor`` as one correctly rounded division on every device.

    On CUDA, torch evaluates ``tensor / python_scalar`` as a multiplication by the fp32 reciprocal, 1 ulp off
    the quotient that the CPU and the Triton kernels compute; a tensor divisor gives one IEEE division.
    """
    return numerator / torch.full_like(numerator, divisor)


def bucket_lattice(
    x: torch.Tensor, bucket_size: int, levels: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The min-max lattice of each bucket of ``[R, n]`` ``x``: ``levels`` equal steps from its min to its max.

    Returns ``(xb, lo, scale, inv, nonfinite)``, all but ``xb`` ``[R, nb]``: the fp32 buckets ``[R, nb, width]``
    (as :func:`bucket_min_max`), each bucket's min, its step ``(max - min) / levels`` (one IEEE division), the step's
    reciprocal (0 for a constant bucket, capped at the largest fp32 so that a tiny step never gives infinity), and
    whether the step is non-finite: min and max propagate NaN, so a NaN or an infinity anywhere in a bucket, or a
    range that overflows fp32, makes it so.
    """
    xb, lo, hi = bucket_min_max(x, bucket_size)
    scale = ieee_div(hi - lo, levels)
    inv = torch.where(scale > 0, 1.0 / scale, 0.0).clamp_(max=FP32_MAX)
    return xb, lo, scale, inv, ~torch.isfinite(scale)
