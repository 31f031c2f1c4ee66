"""Random-shift (dithered) lattice quantizer: QSDP's theory quantizer.

Per bucket of ``bucket_size`` elements, with ``m = 2**bits - 1``::

    lo, hi  = bucket.min(), bucket.max()                        # fp32
    scale   = (hi - lo) / m                                     # fp32, the lattice step delta
    inv     = 1 / scale  (0 when scale == 0, capped at the largest fp32)
    u       = rounding noise in (0, 1), ONE value per bucket    # the random shift, from the seed
    code    = min(floor((x - lo) * inv + u), m)                 # nearest point of the shifted lattice
    origin  = lo + (0.5 - u) * scale                            # fp32, the lattice point of code 0
    decoded = origin + scale * code                             # fp32, then cast to the output dtype

The lattice is ``{lo + (k + 1/2 - u) * scale : k integer}``, the grid ``scale * Z`` shifted by a uniform
random offset; ``floor(y + u)`` picks its point nearest to ``x``. Over the shift the error
``decoded - x = scale * (1/2 - frac(y + u))`` is uniform on ``[-scale/2, scale/2]`` whatever ``x`` is, so the
quantizer is unbiased and its error is at most half a step. Min-max stochastic rounding instead draws a fresh
``u`` per element and decodes ``lo + scale * code`` (error up to a whole step, variance depending on ``x``).
Storing the shifted ``origin`` rather than ``lo`` lets the ``2**bits`` codes cover every lattice point that
the bucket can reach, so no extra level is needed for the shift.

The shift of bucket ``k`` of ``encode(x, seed, offset)`` is
:func:`composer_qsdp.quant.philox.rounding_noise` at the counter of the bucket's first element,
``offset + k * bucket_size``; its 16-bit resolution keeps the mean error within ``2**-17`` of a step.

Wire (:mod:`composer_qsdp.kernels.wire_format`): codes packed bucket by bucket, then one ``(origin, scale)`` pair of
fp32 per bucket (``bits + 64 / bucket_size`` bits per element).

Non-finite input: a bucket holding a NaN or an infinity, or whose range overflows fp32, is stored with
``origin = scale = NaN`` and codes 0, so every element of that bucket decodes to NaN.
"""

from __future__ import annotations

import torch

from composer_qsdp.quant.buckets import bucket_lattice
from composer_qsdp.quant.codec import Codec
from composer_qsdp.quant.philox import rounding_noise
from composer_qsdp.kernels import WireFormat, bucket_wire_format
from composer_qsdp.quant.wire import affine_decode, assemble_rows, pack_rows

__all__ = ["RandomShiftCodec"]


class RandomShiftCodec(Codec):
    """Bucketed random-shift lattice quantizer (see the module docstring for the exact math and wire).

    Args:
        bits: bits per code, 1..8.
        bucket_size: elements per bucket (1..2**24); one random shift, one fp32 origin and one fp32 step per bucket.

    Raises:
        ValueError: invalid ``bits`` or ``bucket_size``.
    """

    name = "random_shift"

    def __init__(self, bits: int = 8, bucket_size: int = 1024) -> None:
        super().__init__(bits, bucket_size)

    @property
    def unbiased(self) -> bool:
        return True

    @property
    def levels(self) -> int:
        """Largest code, ``2**bits - 1``."""
        return (1 << self.bits) - 1

    def wire_format(self, numel: int) -> WireFormat:
        """Wire format of ``numel`` elements."""
        self._check_numel(numel)
        return bucket_wire_format(numel, self.bucket_size, self.bits, meta_words=2 * self.num_buckets(numel))

    def wire_bytes(self, numel: int) -> int:
        return self.wire_format(numel).wire_bytes

    def _encode_rows(self, x: torch.Tensor, seed: int, offset: int) -> torch.Tensor:
        rows, n = x.shape
        fmt = self.wire_format(n)
        xb, lo, scale, inv, nonfinite = bucket_lattice(x, self.bucket_size, self.levels)
        nb, width = xb.shape[1:]

        first = torch.arange(rows, device=x.device).unsqueeze(1) * n
        first = first + torch.arange(nb, device=x.device) * self.bucket_size  # counter of each bucket's start
        shift = rounding_noise(seed, offset + first)  # [rows, nb]
        t = (xb - lo.unsqueeze(2)) * inv.unsqueeze(2) + shift.unsqueeze(2)
        codes = torch.floor(t).clamp_(0, self.levels).masked_fill_(nonfinite.unsqueeze(2), 0)
        codes = codes.to(torch.uint8).view(rows, nb * width)
        codes[:, n:] = 0

        origin = lo + (0.5 - shift) * scale
        meta = torch.stack((origin, scale), dim=2).masked_fill_(nonfinite.unsqueeze(2), float("nan"))
        return assemble_rows(pack_rows(codes, fmt, self.bits), meta.view(rows, 2 * nb), fmt)

    def _decode_rows(self, wire: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return affine_decode(wire, self.wire_format(numel), self.bits, self.bucket_size).to(dtype)
