"""Torch reference of the bucketed wire (:mod:`composer_qsdp.kernels.wire_format`): packing codes into rows,
assembling rows with their fp32 metadata, and reading them back.

The format itself lives in the kernels layer, which writes and reads the same bytes.
"""

from __future__ import annotations

import torch

from composer_qsdp.kernels import WireFormat, aligned_rows, packed_bytes
from composer_qsdp.quant.buckets import bucket_width
from composer_qsdp.quant.packing import pack_codes, unpack_codes

__all__ = ["pack_rows", "unpack_rows", "assemble_rows", "read_meta", "affine_decode"]


def pack_rows(codes: torch.Tensor, fmt: WireFormat, bits: int) -> torch.Tensor:
    """Pack the ``[R, nb * width]`` codes of rows padded to ``nb`` buckets of ``width`` elements
    (:func:`composer_qsdp.quant.buckets.bucket_width`) into ``[R, code_bytes]`` bytes.

    Codes past ``numel`` in the last bucket must be 0: the partial bucket's bytes are then the prefix of the
    packing that :func:`pack_codes` would give it on its own.
    """
    rows = codes.shape[0]
    packed = pack_codes(codes.reshape(rows * fmt.num_buckets, -1), bits).view(rows, -1)
    return packed[:, : fmt.code_bytes]


def unpack_rows(wire: torch.Tensor, fmt: WireFormat, bits: int, bucket_size: int) -> torch.Tensor:
    """Codes of a ``[R, wire_bytes]`` wire as ``[R, nb, width]`` ``uint8`` (0 past ``numel``), ``width`` the
    padded bucket view's (:func:`composer_qsdp.quant.buckets.bucket_width`)."""
    rows, nb = wire.shape[0], fmt.num_buckets
    width = bucket_width(fmt.numel, bucket_size)
    width_bytes = packed_bytes(width, bits)
    region = wire[:, : fmt.code_bytes]
    if fmt.code_bytes < nb * width_bytes:
        region = torch.nn.functional.pad(region, (0, nb * width_bytes - fmt.code_bytes))
    return unpack_codes(region.reshape(rows * nb, width_bytes), bits, width).view(rows, nb, width)


def assemble_rows(packed: torch.Tensor, meta: torch.Tensor, fmt: WireFormat) -> torch.Tensor:
    """Build ``[R, wire_bytes]`` wires from ``[R, code_bytes]`` packed codes and ``[R, meta_words]`` fp32 metadata."""
    rows = packed.shape[0]
    wire = torch.zeros(rows, fmt.wire_bytes, dtype=torch.uint8, device=packed.device)
    wire[:, : fmt.code_bytes] = packed
    wire[:, fmt.meta_offset :] = meta.to(torch.float32).contiguous().view(torch.uint8)
    return wire


def read_meta(wire: torch.Tensor, fmt: WireFormat) -> torch.Tensor:
    """The ``[R, meta_words]`` fp32 metadata of a ``[R, wire_bytes]`` wire (copied only when misaligned)."""
    return aligned_rows(wire[:, fmt.meta_offset :]).view(torch.float32)


def affine_decode(wire: torch.Tensor, fmt: WireFormat, bits: int, bucket_size: int) -> torch.Tensor:
    """Decode a ``[R, wire_bytes]`` wire whose metadata is one fp32 ``(origin, step)`` pair per bucket (the min-max
    and random-shift codecs): ``origin + step * code``, one fp32 multiply then one add.

    Returns:
        ``[R, fmt.numel]`` fp32 values, in the units of the encoded input.
    """
    rows = wire.shape[0]
    codes = unpack_rows(wire, fmt, bits, bucket_size)
    meta = read_meta(wire, fmt).view(rows, fmt.num_buckets, 2)
    decoded = meta[:, :, 0:1] + meta[:, :, 1:2] * codes.to(torch.float32)
    return decoded.view(rows, -1)[:, : fmt.numel]
