"""Quantization-quality metric computed on the device (never syncs the host)."""

from __future__ import annotations

import torch

__all__ = ["relative_error"]


def relative_error(approx: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """``||approx - exact||_2 / ||exact||_2`` over all elements, as a 0-dim fp32 tensor on their device.

    An all-zero ``exact`` gives ``||approx|| / tiny`` rather than a division by zero.
    """
    exact = exact.reshape(approx.shape).float()
    err = torch.linalg.vector_norm(approx.float() - exact)
    return err / torch.linalg.vector_norm(exact).clamp_min(torch.finfo(torch.float32).tiny)
