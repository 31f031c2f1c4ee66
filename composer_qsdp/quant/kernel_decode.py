"""The decode hooks of codecs whose Triton decoders are :mod:`composer_qsdp.kernels.bucket_decode`'s (min-max,
learned levels): one implementation of "kernel when it covers the call, else the torch reference", for decoding
rows, into a caller's buffer, and summing (divided and rounded into a buffer)."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import ClassVar

import torch

from composer_qsdp.kernels import use_triton
from composer_qsdp.quant.codec import Codec

__all__ = ["KernelDecodes"]


class KernelDecodes(Codec):
    """Mixin of :class:`~composer_qsdp.quant.codec.Codec` subclasses that name their Triton module in
    :mod:`composer_qsdp.kernels` (``kernels_module``) and provide ``wire_format(numel)`` and the references
    ``_decode_rows_fp32(wire, numel)`` and ``_decode_sum_reference(wire, numel)``; their kernels modules'
    ``supports``, ``decode_rows`` and ``decode_sum`` (with ``out=`` and ``divisor=``) serve every call they cover."""

    #: The codec's module in :mod:`composer_qsdp.kernels` (imported on the first GPU call).
    kernels_module: ClassVar[str]

    def wire_bytes(self, numel: int) -> int:
        return self.wire_format(numel).wire_bytes

    def _kernels(self, t: torch.Tensor, numel: int) -> ModuleType | None:
        """The kernels module when Triton should handle ``t`` (``[rows, ...]``, ``numel`` elements per row) in
        this configuration, else None (torch reference)."""
        if not use_triton(t):
            return None
        kernels = importlib.import_module(f"composer_qsdp.kernels.{self.kernels_module}")
        return kernels if kernels.supports(self.bits, self.bucket_size, t.shape[0], numel) else None

    def _decode_rows(self, wire: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        kernels = self._kernels(wire, numel)
        if kernels is None:
            return self._decode_rows_fp32(wire, numel).to(dtype)
        return kernels.decode_rows(wire, self.bits, self.bucket_size, self.wire_format(numel), dtype)

    def _decode_rows_into(self, wire: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        kernels = self._kernels(wire, out.shape[1])
        if kernels is None or out.device != wire.device:
            return super()._decode_rows_into(wire, out)
        return kernels.decode_rows(wire, self.bits, self.bucket_size, self.wire_format(out.shape[1]), out.dtype,
                                   out=out)

    def _decode_sum(self, wire: torch.Tensor, numel: int) -> torch.Tensor:
        kernels = self._kernels(wire, numel)
        if kernels is None:
            return self._decode_sum_reference(wire, numel)
        return kernels.decode_sum(wire, self.bits, self.bucket_size, self.wire_format(numel))

    def _decode_sum_into(self, wire: torch.Tensor, out: torch.Tensor, divisor: int) -> torch.Tensor:
        kernels = self._kernels(wire, out.numel())
        if kernels is None or out.device != wire.device:
            return super()._decode_sum_into(wire, out, divisor)
        return kernels.decode_sum(wire, self.bits, self.bucket_size, self.wire_format(out.numel()), out=out,
                                  divisor=divisor)  # fmt: skip
