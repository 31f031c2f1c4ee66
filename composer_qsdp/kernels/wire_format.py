"""Wire format of a bucketed codec: packed codes bucket by bucket, then 4-byte aligned fp32 metadata.

One encoded row of ``numel`` elements in ``nb = ceil(numel / bucket_size)`` buckets::

    [codes of bucket 0]...[codes of the last bucket][0-3 zero bytes][metadata: fp32 words]

* codes: ``bits``-bit codes packed bucket by bucket, each bucket starting on a byte boundary; code ``j`` of a
  bucket occupies bits ``[j * bits, (j + 1) * bits)`` of the bucket's little-endian bit stream. A full bucket
  takes ``ceil(bucket_size * bits / 8)`` bytes, the last one ``ceil(valid * bits / 8)`` bytes.
* metadata: little-endian fp32 words whose meaning the codec defines (per-bucket scales, levels...). It
  starts on a multiple of 4 bytes and the row length is a multiple of 4, so every row of an
  ``encode_rows`` matrix keeps its metadata 4-byte aligned for the kernels.

The kernels write and read this format and the codecs' torch references build the same bytes, so both import it
from here; it needs torch only, not Triton.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

__all__ = ["WireFormat", "aligned_rows", "bucket_wire_format", "packed_bytes"]


def packed_bytes(bucket_size: int, bits: int) -> int:
    """Bytes taken by the codes of one bucket of ``bucket_size`` elements at ``bits`` bits."""
    return -(-bucket_size * bits // 8)


@dataclasses.dataclass(frozen=True)
class WireFormat:
    """Wire format of one encoded row of ``numel`` elements (sizes in bytes unless noted).

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


# Codecs ask for a wire's format several times per collective call; a call's fixed host cost matters at small sizes.
@functools.lru_cache(maxsize=4096)
def bucket_wire_format(numel: int, bucket_size: int, bits: int, meta_words: int) -> WireFormat:
    """Wire format of ``numel`` elements in buckets of ``bucket_size`` elements at ``bits`` bits per code, followed by
    ``meta_words`` fp32 words of metadata."""
    nb = -(-numel // bucket_size)
    last = numel - (nb - 1) * bucket_size
    bucket_bytes = packed_bytes(bucket_size, bits)
    code_bytes = (nb - 1) * bucket_bytes + packed_bytes(last, bits)
    meta_offset = -(-code_bytes // 4) * 4
    return WireFormat(numel, nb, last, bucket_bytes, code_bytes, meta_offset, meta_words, meta_offset + 4 * meta_words)


def aligned_rows(wire: torch.Tensor) -> torch.Tensor:
    """``wire`` itself when the fp32 metadata of its ``[R, wire_bytes]`` ``uint8`` rows can be read in place (rows
    contiguous and 4-byte aligned, as kernels need), else an aligned copy."""
    if wire.stride(1) == 1 and wire.data_ptr() % 4 == 0 and (wire.shape[0] == 1 or wire.stride(0) % 4 == 0):
        return wire
    return wire.clone(memory_format=torch.contiguous_format)
