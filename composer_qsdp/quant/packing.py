"""Dense bit packing of b-bit codes, bucket by bucket (the torch reference the kernels match).

Format: a bucket of ``B`` codes of ``b`` bits occupies ``packed_bytes(B, b) = ceil(B * b / 8)`` bytes.
Code ``j`` of the bucket occupies bits ``[j*b, (j+1)*b)`` of the bucket's little-endian bit stream, so for
4 bits byte ``k`` is ``c[2k] | c[2k+1] << 4`` and for 2 bits ``c[4k] | c[4k+1] << 2 | ...``.
"""

from __future__ import annotations

import torch

from composer_qsdp.kernels import packed_bytes

__all__ = ["pack_codes", "unpack_codes"]


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack ``[nb, B]`` integer codes (each < 2**bits) into ``[nb, packed_bytes(B, bits)]`` ``uint8``."""
    nb, bucket = codes.shape
    codes = codes.to(torch.uint8)
    if bits == 8:
        return codes.contiguous()
    if 8 % bits == 0 and bucket % (8 // bits) == 0:
        per_byte = 8 // bits
        shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=codes.device)
        grouped = codes.view(nb, bucket // per_byte, per_byte) << shifts
        return grouped.sum(dim=2, dtype=torch.int32).to(torch.uint8)
    # General bit stream: expand to bits, regroup by 8.
    bit_idx = torch.arange(bits, dtype=torch.uint8, device=codes.device)
    stream = ((codes.unsqueeze(-1) >> bit_idx) & 1).reshape(nb, bucket * bits)
    nbytes = packed_bytes(bucket, bits)
    stream = torch.nn.functional.pad(stream, (0, nbytes * 8 - bucket * bits))
    weights = 1 << torch.arange(8, dtype=torch.int32, device=codes.device)  # made on the device: no host copy
    return (stream.view(nb, nbytes, 8).to(torch.int32) * weights).sum(-1).to(torch.uint8)


def unpack_codes(packed: torch.Tensor, bits: int, bucket_size: int) -> torch.Tensor:
    """Inverse of :func:`pack_codes`: ``[nb, packed_bytes(B, bits)]`` ``uint8`` -> ``[nb, B]`` ``uint8`` codes."""
    nb = packed.shape[0]
    if bits == 8:
        return packed.contiguous()
    mask = (1 << bits) - 1
    if 8 % bits == 0 and bucket_size % (8 // bits) == 0:
        shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=packed.device)
        return ((packed.unsqueeze(-1) >> shifts) & mask).reshape(nb, bucket_size)
    bit_idx = torch.arange(8, dtype=torch.uint8, device=packed.device)
    stream = ((packed.unsqueeze(-1) >> bit_idx) & 1).reshape(nb, -1)[:, : bucket_size * bits]
    weights = 1 << torch.arange(bits, dtype=torch.int32, device=packed.device)
    return (stream.reshape(nb, bucket_size, bits).to(torch.int32) * weights).sum(-1).to(torch.uint8)
