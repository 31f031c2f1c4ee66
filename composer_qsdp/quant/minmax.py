"""Asymmetric min-max quantizer with stochastic (unbiased) or round-to-nearest rounding (QSDP / CGX).

Per bucket of ``bucket_size`` elements (the last bucket may be partial; its min and max cover only its
valid elements)::

    min, max = bucket.min(), bucket.max()                     # fp32
    scale    = (max - min) / (2**bits - 1)                     # fp32, one quantization step
    inv      = 1 / scale  (0 when scale == 0, capped at the largest fp32)
    code     = min(floor((x - min) * inv + u), 2**bits - 1)    # u: rounding noise, or 0.5 for nearest
    decoded  = min + scale * code                              # fp32, then cast to the output dtype

Every step is one IEEE fp32 operation in exactly this order, evaluated the same way by the torch reference
here and by the Triton kernels of :mod:`composer_qsdp.kernels.minmax` (which disable FMA contraction), so
both give the same codes and the same decoded values bit for bit. A constant bucket (``scale == 0``) gets
code 0 everywhere and decodes exactly to its value.

Stochastic rounding draws ``u`` for element ``i`` of ``encode(x, seed, offset)`` from
:func:`composer_qsdp.quant.philox.rounding_noise` at counter ``offset + i``; ``E[code] = (x - min) * inv``
up to ``2**-17`` steps, so ``E[decoded] = x`` to fp32 precision.

Wire layout of ``encode`` for ``n`` elements in ``nb = ceil(n / bucket_size)`` buckets::

    [codes of bucket 0][codes of bucket 1]...[codes of the last bucket][0-3 zero bytes][metadata]

* codes: ``bits``-bit codes packed bucket by bucket as in :mod:`composer_qsdp.quant.packing`, each bucket
  starting on a byte boundary; full buckets take ``ceil(bucket_size * bits / 8)`` bytes, the last one
  ``ceil(valid * bits / 8)`` bytes.
* zero padding so the metadata starts at a multiple of 4 bytes.
* metadata: ``nb`` pairs ``(min, scale)`` of little-endian fp32, 8 bytes per bucket (``bits + 64 /
  bucket_size`` bits per element in all). fp32 rather than bf16/fp16: the metadata is a small part of the
  wire, and a rounded min or scale would shift every decoded value of the bucket.

Non-finite input: a bucket holding a NaN or an infinity, or whose range ``max - min`` overflows fp32, is
stored with ``min = scale = NaN`` and codes 0, so every element of that bucket decodes to NaN; finite buckets
are unaffected. A NaN/Inf never turns into finite garbage.
"""

from __future__ import annotations

import dataclasses

import torch

from composer_qsdp.quant.codec import Codec
from composer_qsdp.quant.packing import pack_codes, packed_bytes, unpack_codes
from composer_qsdp.quant.philox import rounding_noise_range

__all__ = ["MinMaxCodec", "WireLayout", "ROUNDINGS"]

#: Accepted values of ``rounding``.
ROUNDINGS = ("stochastic", "nearest")
_FP32_MAX = torch.finfo(torch.float32).max
_META_BYTES = 8  # fp32 min + fp32 scale per bucket


@dataclasses.dataclass(frozen=True)
class WireLayout:
    """Byte layout of one encoded row of ``numel`` elements (all sizes in bytes unless noted).

    Attributes:
        numel: elements in the row.
        num_buckets: buckets covering the row (the last may be partial).
        last_bucket: elements in the last bucket (1..bucket_size).
        bucket_bytes: code bytes of one full bucket.
        code_bytes: code bytes of the whole row (buckets back to back).
        meta_offset: start of the metadata, a multiple of 4.
        wire_bytes: total size; a multiple of 4.
    """

    numel: int
    num_buckets: int
    last_bucket: int
    bucket_bytes: int
    code_bytes: int
    meta_offset: int
    wire_bytes: int


class MinMaxCodec(Codec):
    """Bucketed asymmetric min-max quantizer (see the module docstring for the exact math and wire).

    Args:
        bits: bits per code, 1..8.
        bucket_size: elements per bucket (>= 1); one fp32 min and one fp32 scale per bucket.
        rounding: ``"stochastic"`` (unbiased, seeded Philox noise) or ``"nearest"`` (deterministic, ignores
            the seed, error at most half a step).

    Raises:
        ValueError: invalid ``bits``, ``bucket_size`` or ``rounding``.
    """

    name = "minmax"

    def __init__(self, bits: int = 8, bucket_size: int = 1024, rounding: str = "stochastic") -> None:
        super().__init__(bits, bucket_size)
        if rounding not in ROUNDINGS:
            raise ValueError(f"rounding={rounding!r} is not supported; allowed: {', '.join(ROUNDINGS)}")
        self.rounding = rounding

    @property
    def stochastic(self) -> bool:
        """True for stochastic rounding."""
        return self.rounding == "stochastic"

    @property
    def unbiased(self) -> bool:
        return self.stochastic

    @property
    def levels(self) -> int:
        """Largest code, ``2**bits - 1``."""
        return (1 << self.bits) - 1

    def layout(self, numel: int) -> WireLayout:
        """Byte layout of the wire of ``numel`` elements (shared with the Triton launchers)."""
        self._check_numel(numel)
        nb = self.num_buckets(numel)
        last = numel - (nb - 1) * self.bucket_size
        bucket_bytes = packed_bytes(self.bucket_size, self.bits)
        code_bytes = (nb - 1) * bucket_bytes + packed_bytes(last, self.bits)
        meta_offset = -(-code_bytes // 4) * 4
        return WireLayout(numel, nb, last, bucket_bytes, code_bytes, meta_offset, meta_offset + nb * _META_BYTES)

    def wire_bytes(self, numel: int) -> int:
        return self.layout(numel).wire_bytes

    # ------------------------------------------------------------------ single tensor = one row
    def _encode(self, x: torch.Tensor, seed: int, offset: int) -> torch.Tensor:
        return self._encode_rows(x.reshape(1, -1), seed, offset)[0]

    def _decode(self, wire: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return self._decode_rows(wire.reshape(1, -1), numel, dtype)[0]

    # ------------------------------------------------------------------ batched public paths
    def encode_rows(self, x: torch.Tensor, seed: int = 0, offset: int = 0) -> torch.Tensor:
        if x.dim() != 2:
            raise ValueError(f"encode_rows expects a 2-D [rows, n] tensor, got shape {tuple(x.shape)}")
        self._check_input(x)
        self._check_seed(seed, offset)
        return self._encode_rows(x, seed, offset)

    def decode_rows(self, wire: torch.Tensor, numel: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        self._check_wire_rows(wire, numel)
        self._check_dtype(dtype)
        return self._decode_rows(wire, numel, dtype)

    def decode_sum(self, wire: torch.Tensor, numel: int) -> torch.Tensor:
        self._check_wire_rows(wire, numel)
        return self._decode_sum(wire, numel)

    # ------------------------------------------------------------------ torch reference
    def _encode_rows(self, x: torch.Tensor, seed: int, offset: int) -> torch.Tensor:
        rows, n = x.shape
        lay = self.layout(n)
        bsz, nb = self.bucket_size, lay.num_buckets
        xf = x.to(torch.float32)
        if lay.last_bucket < bsz:
            # Repeat the row's last element: a valid member of the last bucket, so its min/max are unchanged.
            xf = torch.cat([xf, xf[:, -1:].expand(rows, nb * bsz - n)], dim=1)
        xb = xf.view(rows, nb, bsz)
        lo = xb.amin(dim=2)
        hi = xb.amax(dim=2)
        scale = (hi - lo) / self.levels
        nonfinite = (~torch.isfinite(xb)).any(dim=2) | ~torch.isfinite(scale)
        inv = torch.where(scale > 0, 1.0 / scale, 0.0).clamp(max=_FP32_MAX)
        t = (xb - lo.unsqueeze(2)) * inv.unsqueeze(2)
        if self.stochastic:
            noise = rounding_noise_range(seed, offset, rows * n, device=x.device).view(rows, n)
            if lay.last_bucket < bsz:
                noise = torch.nn.functional.pad(noise, (0, nb * bsz - n))
            t = t + noise.view(rows, nb, bsz)
        else:
            t = t + 0.5
        codes = torch.floor(t).clamp_(0, self.levels)
        codes = codes.masked_fill_(nonfinite.unsqueeze(2), 0).to(torch.uint8).view(rows, nb * bsz)
        codes[:, n:] = 0
        packed = pack_codes(codes.view(rows * nb, bsz), self.bits).view(rows, nb * lay.bucket_bytes)

        meta = torch.stack((lo, scale), dim=2).masked_fill_(nonfinite.unsqueeze(2), float("nan"))
        wire = torch.zeros(rows, lay.wire_bytes, dtype=torch.uint8, device=x.device)
        wire[:, : lay.code_bytes] = packed[:, : lay.code_bytes]
        wire[:, lay.meta_offset :] = meta.view(rows, nb * 2).view(torch.uint8)
        return wire

    def _decode_rows_fp32(self, wire: torch.Tensor, numel: int) -> torch.Tensor:
        rows = wire.shape[0]
        lay = self.layout(numel)
        bsz, nb = self.bucket_size, lay.num_buckets
        code_region = wire[:, : lay.code_bytes]
        if lay.code_bytes < nb * lay.bucket_bytes:
            code_region = torch.nn.functional.pad(code_region, (0, nb * lay.bucket_bytes - lay.code_bytes))
        codes = unpack_codes(code_region.reshape(rows * nb, lay.bucket_bytes), self.bits, bsz)
        meta = _bytes_as_fp32(wire[:, lay.meta_offset :]).view(rows, nb, 2)
        lo, scale = meta[:, :, 0:1], meta[:, :, 1:2]
        decoded = lo + scale * codes.view(rows, nb, bsz).to(torch.float32)
        return decoded.view(rows, nb * bsz)[:, :numel]

    def _decode_rows(self, wire: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return self._decode_rows_fp32(wire, numel).to(dtype)

    def _decode_sum(self, wire: torch.Tensor, numel: int) -> torch.Tensor:
        decoded = self._decode_rows_fp32(wire, numel)
        # In row order, starting from +0.0, exactly as the kernel accumulates (torch.sum's order is unspecified).
        acc = torch.zeros(numel, dtype=torch.float32, device=wire.device)
        for row in decoded:
            acc += row
        return acc

    def __repr__(self) -> str:
        return f"MinMaxCodec(bits={self.bits}, bucket_size={self.bucket_size}, rounding={self.rounding!r})"


def _bytes_as_fp32(region: torch.Tensor) -> torch.Tensor:
    """Reinterpret a ``[R, 4k]`` uint8 region as ``[R, k]`` fp32, copying only when it is misaligned."""
    aligned = region.stride(-1) == 1 and region.data_ptr() % 4 == 0 and (region.dim() == 1 or region.stride(0) % 4 == 0)
    return (region if aligned else region.clone(memory_format=torch.contiguous_format)).view(torch.float32)
