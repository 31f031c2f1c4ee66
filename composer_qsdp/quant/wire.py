"""Byte layout of a bucketed codec's wire: packed codes bucket by bucket, then 4-byte aligned fp32 metadata.

One encoded row of ``numel`` elements in ``nb = ceil(numel / bucket_size)`` buckets::

    [codes of bucket 0]...[codes of the last bucket][0-3 zero bytes][metadata: fp32 words]

* codes: ``bits``-bit codes packed bucket by bucket as in :mod:`composer_qsdp.quant.packing`, each bucket
  starting on a byte boundary; a full bucket takes ``ceil(bucket_size * bits / 8)`` bytes, the last one
  ``ceil(valid * bits / 8)`` bytes.
* metadata: little-endian fp32 words whose meaning the codec defines (per-bucket scales, levels...). It
  starts on a multiple of 4 bytes and the row length is a multiple of 4, so every row of an
  ``encode_rows`` matrix keeps its metadata 4-byte aligned for the kernels.
"""

from __future__ import annotations

import dataclasses

import torch

from composer_qsdp.quant.packing import pack_codes, packed_bytes, unpack_codes

__all__ = [
    "WireLayout", "bucket_layout", "pack_rows", "unpack_rows", "assemble_rows", "read_meta", "aligned_rows",
    "affine_decode",
]


@dataclasses.dataclass(frozen=True)
class WireLayout:
    """Byte layout of one encoded row of ``numel`` elements (sizes in bytes unless noted).

    Attributes:
        numel: elements in the row.
        num_buckets: buckets covering the row (the last may be partial).
        last_bucket: elements in the last bucket (1..bucket_size).
        bucket_bytes: code bytes of one full bucket.
        code_bytes: code bytes of the whole row (buckets back to back).
        meta_offset: start of the metadata, a multiple of 4.
        meta_words: fp32 metadata words after ``meta_offset``.
        wire_bytes: total size, ``meta_offset + 4 * meta_words``; a multiple of 4.
    """

    numel: int
    num_buckets: int
    last_bucket: int
    bucket_bytes: int
    code_bytes: int
    meta_offset: int
    meta_words: int
    wire_bytes: int


def bucket_layout(numel: int, bucket_size: int, bits: int, meta_words: int) -> WireLayout:
    """Layout of ``numel`` elements in buckets of ``bucket_size`` at ``bits`` bits with ``meta_words`` fp32 words."""
    nb = -(-numel // bucket_size)
    last = numel - (nb - 1) * bucket_size
    bucket_bytes = packed_bytes(bucket_size, bits)
    code_bytes = (nb - 1) * bucket_bytes + packed_bytes(last, bits)
    meta_offset = -(-code_bytes // 4) * 4
    return WireLayout(numel, nb, last, bucket_bytes, code_bytes, meta_offset, meta_words, meta_offset + 4 * meta_words)


def pack_rows(codes: torch.Tensor, layout: WireLayout, bits: int) -> torch.Tensor:
    """Pack ``[R, nb * bucket_size]`` codes into ``[R, code_bytes]`` bytes.

    Codes past ``numel`` in the last bucket must be 0: the partial bucket's bytes are then the prefix of the
    full-bucket packing that :func:`pack_codes` would give it on its own.
    """
    rows = codes.shape[0]
    nb = layout.num_buckets
    packed = pack_codes(codes.reshape(rows * nb, -1), bits).view(rows, nb * layout.bucket_bytes)
    return packed[:, : layout.code_bytes]


def unpack_rows(wire: torch.Tensor, layout: WireLayout, bits: int, bucket_size: int) -> torch.Tensor:
    """Codes of a ``[R, wire_bytes]`` wire as ``[R, nb, bucket_size]`` ``uint8`` (0 past ``numel``)."""
    rows, nb = wire.shape[0], layout.num_buckets
    region = wire[:, : layout.code_bytes]
    full = nb * layout.bucket_bytes
    if layout.code_bytes < full:
        region = torch.nn.functional.pad(region, (0, full - layout.code_bytes))
    return unpack_codes(region.reshape(rows * nb, layout.bucket_bytes), bits, bucket_size).view(rows, nb, bucket_size)


def assemble_rows(packed: torch.Tensor, meta: torch.Tensor, layout: WireLayout) -> torch.Tensor:
    """Build ``[R, wire_bytes]`` wires from ``[R, code_bytes]`` packed codes and ``[R, meta_words]`` fp32 metadata."""
    rows = packed.shape[0]
    wire = torch.zeros(rows, layout.wire_bytes, dtype=torch.uint8, device=packed.device)
    wire[:, : layout.code_bytes] = packed
    wire[:, layout.meta_offset :] = meta.to(torch.float32).contiguous().view(torch.uint8)
    return wire


def read_meta(wire: torch.Tensor, layout: WireLayout) -> torch.Tensor:
    """The ``[R, meta_words]`` fp32 metadata of a ``[R, wire_bytes]`` wire (copied only when misaligned)."""
    return aligned_rows(wire[:, layout.meta_offset :]).view(torch.float32)


def affine_decode(wire: torch.Tensor, layout: WireLayout, bits: int, bucket_size: int) -> torch.Tensor:
    """Decode a ``[R, wire_bytes]`` wire whose metadata is one fp32 ``(origin, step)`` pair per bucket (the min-max
    and random-shift codecs): ``origin + step * code``, one fp32 multiply then one add.

    Returns:
        ``[R, layout.numel]`` fp32 values, in the units of the encoded input.
    """
    rows = wire.shape[0]
    codes = unpack_rows(wire, layout, bits, bucket_size)
    meta = read_meta(wire, layout).view(rows, layout.num_buckets, 2)
    decoded = meta[:, :, 0:1] + meta[:, :, 1:2] * codes.to(torch.float32)
    return decoded.view(rows, -1)[:, : layout.numel]


def aligned_rows(wire: torch.Tensor) -> torch.Tensor:
    """``wire`` itself when the fp32 metadata of its ``[R, wire_bytes]`` rows can be read in place (rows
    contiguous and 4-byte aligned, as kernels need), else an aligned copy."""
    if wire.stride(1) == 1 and wire.data_ptr() % 4 == 0 and (wire.shape[0] == 1 or wire.stride(0) % 4 == 0):
        return wire
    return wire.clone(memory_format=torch.contiguous_format)
