"""``CodedResidual``: an error-feedback residual kept between calls as a codec's wire rows instead of floats.

LoCo (Xie et al., "LoCo: Low-Bit Communication Adaptor for Large-scale Model Training", 2024) keeps each rank's
compression error compressed, since an fp32 residual of every unit's unsharded gradient is the largest state error
feedback adds. Stored as the 8-bit symmetric codec's wire (``SymmetricCodec(8, bucket_size)``: an int8 level per
element and one fp32 scale per bucket), a residual costs ``1 + 4 / bucket_size`` bytes per element instead of 4.

Each call reads the residual back as fp32 (:meth:`CodedResidual.decode`), computes in fp32, and stores the new
residual once (:meth:`CodedResidual.store`), so the stored residual is the new one rounded to the codec's grid
once per call. The codec must round to nearest: a stored value that depends on rounding noise would need a seed
per call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from composer_qsdp.validate import check_int

if TYPE_CHECKING:
    from composer_qsdp.quant.codec import Codec

__all__ = ["CodedResidual"]


class CodedResidual:
    """A ``[rows, numel]`` fp32 residual held as ``codec``'s wire rows, ``[rows, codec.wire_bytes(numel)]`` ``uint8``.

    Args:
        codec: a codec that rounds to nearest (``not codec.unbiased``), e.g. ``SymmetricCodec(8, 256)``.
        rows, numel: the residual's shape (rows: the reduce-scatter's ranks; numel: elements per row).
        device: where the wire lives.

    Attributes:
        codec: the storage codec.
        rows, numel: the shape the residual decodes to.
        wire: the stored rows, ``uint8`` ``[rows, codec.wire_bytes(numel)]``; starts as the encode of zeros.

    Raises:
        ValueError: a codec with stochastic rounding, or a non-positive ``rows`` or ``numel``.
    """

    def __init__(self, codec: Codec, rows: int, numel: int, device: torch.device | str = "cpu") -> None:
        if codec.unbiased:
            raise ValueError(f"a coded residual needs a codec that rounds to nearest, got {codec!r} (stochastic "
                             "rounding would need a seed per call)")
        self.codec = codec
        self.rows = check_int("rows", rows, minimum=1)
        self.numel = check_int("numel", numel, minimum=1)
        self.wire = self._encoded_zeros(device)

    @property
    def device(self) -> torch.device:
        """The wire's device."""
        return self.wire.device

    @property
    def nbytes(self) -> int:
        """Bytes of the stored wire."""
        return self.wire.numel()

    def decode(self) -> torch.Tensor:
        """The residual as a new fp32 ``[rows, numel]`` tensor."""
        return self.codec.decode_rows(self.wire, self.numel, torch.float32)

    def store(self, values: torch.Tensor) -> None:
        """Replace the residual by ``values`` (``[rows, numel]`` floating, finite), rounded once to the codec's grid."""
        if tuple(values.shape) != (self.rows, self.numel):
            raise ValueError(f"a coded residual of shape ({self.rows}, {self.numel}) cannot store a tensor of shape "
                             f"{tuple(values.shape)}")
        self.wire.copy_(self.codec.encode_rows(values))

    def zero_(self) -> CodedResidual:
        """Set the residual to zero in place (the encode of zeros: a codec's zero need not be all-zero bytes).
        Returns self."""
        self.wire.copy_(self._encoded_zeros(self.wire.device))
        return self

    def _encoded_zeros(self, device: torch.device | str) -> torch.Tensor:
        return self.codec.encode_zero_rows(self.rows, self.numel, device)

    def to(self, device: torch.device | str) -> CodedResidual:
        """This residual with its wire on ``device`` (self when already there)."""
        if self.wire.device == torch.device(device):
            return self
        return self.with_wire(self.wire.to(device))

    def with_wire(self, wire: torch.Tensor) -> CodedResidual:
        """A residual of this one's codec and shape stored in ``wire`` (``uint8``, this one's wire shape), e.g. a
        copy of it in other memory."""
        if wire.dtype != torch.uint8 or wire.shape != self.wire.shape:
            raise ValueError(f"a coded residual's wire is uint8 {tuple(self.wire.shape)}; got {wire.dtype} "
                             f"{tuple(wire.shape)}")
        other = object.__new__(CodedResidual)
        other.codec, other.rows, other.numel, other.wire = self.codec, self.rows, self.numel, wire
        return other

    def __repr__(self) -> str:
        return f"CodedResidual({self.codec!r}, rows={self.rows}, numel={self.numel}, device={self.device})"
