"""Bitwise comparisons of kernel outputs with their torch references, shared by the kernel tests."""

from __future__ import annotations

import torch

from composer_qsdp.kernels import backend, use_triton

__all__ = ["assert_dispatch_matches_torch", "assert_falls_back_to_torch", "assert_same_values", "assert_same_wire"]

_INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def assert_same_values(got: torch.Tensor, expected: torch.Tensor) -> None:
    """Same bits, except that a NaN only has to be a NaN (GPUs write the canonical NaN payload)."""
    assert got.shape == expected.shape and got.dtype == expected.dtype
    nan = expected.isnan()
    assert torch.equal(got.isnan(), nan)
    view = _INT_VIEW[got.dtype]
    assert torch.equal(got.contiguous().view(view)[~nan], expected.contiguous().view(view)[~nan])


def assert_same_wire(codec, got: torch.Tensor, expected: torch.Tensor, n: int) -> None:
    """``[R, wire_bytes]`` wires of ``codec`` (anything with ``wire_format(n).meta_offset``) for ``n`` elements per row:
    codes and padding bytewise, the fp32 metadata bitwise up to NaN payloads."""
    meta_offset = codec.wire_format(n).meta_offset
    assert torch.equal(got[:, :meta_offset], expected[:, :meta_offset])
    assert_same_values(got[:, meta_offset:].contiguous().view(torch.float32),
                       expected[:, meta_offset:].contiguous().view(torch.float32))  # fmt: skip


def assert_dispatch_matches_torch(codec, x: torch.Tensor) -> None:
    """Every public call of ``codec`` on the ``[3, 700]`` ``x`` gives the same bits through the Triton backend as
    through the torch one, including a decode of a byte-shifted (misaligned) wire."""
    with backend("torch"):
        assert not use_triton(x)
        wire_1d, wire = codec.encode(x[1], seed=5, offset=700), codec.encode_rows(x, seed=5)
        decoded, total = codec.decode(wire_1d, 700, torch.bfloat16), codec.decode_sum(wire, 700)
    with backend("triton"):
        assert use_triton(x)
        assert torch.equal(codec.encode(x[1], seed=5, offset=700), wire_1d)
        assert torch.equal(codec.encode_rows(x, seed=5), wire)
        assert torch.equal(codec.decode(wire_1d, 700, torch.bfloat16), decoded)
        assert torch.equal(codec.decode_rows(wire, 700, torch.float16), codec._decode_rows_fp32(wire, 700).half())
        assert torch.equal(codec.decode_sum(wire, 700), total)
        # The kernels copy a misaligned wire before reading its fp32 metadata.
        shifted = torch.cat([torch.zeros(1, dtype=torch.uint8, device=x.device), wire_1d])[1:]
        assert torch.equal(codec.decode(shifted, 700, torch.bfloat16), decoded)


def assert_falls_back_to_torch(codec, kernels, x: torch.Tensor) -> None:
    """``kernels`` (a codec's kernels module) does not cover ``codec``'s configuration, nor 65536 rows or 2**31
    elements of a covered one, and ``codec`` then encodes the ``[1, n]`` ``x`` through its torch reference under
    the Triton backend too."""
    assert not kernels.supports(codec.bits, codec.bucket_size)
    assert not kernels.supports(8, 1024, rows=65536) and not kernels.supports(8, 1024, n=2**31)
    with backend("torch"):
        expected = codec.encode(x[0], seed=1)
    with backend("triton"):
        assert torch.equal(codec.encode(x[0], seed=1), expected)
