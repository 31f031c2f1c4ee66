"""Bitwise comparisons of kernel outputs with their torch references, shared by the kernel tests."""

from __future__ import annotations

import torch

__all__ = ["assert_same_values", "assert_same_wire"]

_INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def assert_same_values(got: torch.Tensor, expected: torch.Tensor) -> None:
    """Same bits, except that a NaN only has to be a NaN (GPUs write the canonical NaN payload)."""
    assert got.shape == expected.shape and got.dtype == expected.dtype
    nan = expected.isnan()
    assert torch.equal(got.isnan(), nan)
    view = _INT_VIEW[got.dtype]
    assert torch.equal(got.contiguous().view(view)[~nan], expected.contiguous().view(view)[~nan])


def assert_same_wire(codec, got: torch.Tensor, expected: torch.Tensor, n: int) -> None:
    """``[R, wire_bytes]`` wires of ``codec`` (anything with ``layout(n).meta_offset``) for ``n`` elements per row:
    codes and padding bytewise, the fp32 metadata bitwise up to NaN payloads."""
    meta_offset = codec.layout(n).meta_offset
    assert torch.equal(got[:, :meta_offset], expected[:, :meta_offset])
    assert_same_values(got[:, meta_offset:].contiguous().view(torch.float32),
                       expected[:, meta_offset:].contiguous().view(torch.float32))  # fmt: skip
