"""Asymmetric min-max quantizer with stochastic (unbiased) or round-to-nearest rounding (QSDP / CGX).

Per bucket of ``bucket_size`` elements (the last bucket may be partial; its min and max cover only its
valid elements)::

    min, max = bucket.min(), bucket.max()                     # fp32
    scale    = (max - min) / (2**bits - 1)                     # fp32, one quantization step
    inv      = 1 / scale  (0 when scale == 0, capped at the largest fp32)
    t        = (x - min) * inv                                 # fp32, in [0, 2**bits - 1] up to rounding
    code     = clamp(round_half_even(t), 0, 2**bits - 1)       # nearest
    code     = clamp(floor(t_F + k_F / 2**F), 0, 2**bits - 1)  # stochastic, see below
    decoded  = min + scale * code                              # fp32, then cast to the output dtype

On CUDA tensors (see :mod:`composer_qsdp.kernels.dispatch`) ``encode``/``decode``/``encode_rows``/
``decode_rows``/``decode_sum`` run the Triton kernels of :mod:`composer_qsdp.kernels.minmax` when they cover
the configuration (any ``bits``; ``bucket_size`` a multiple of 8 up to 8192), else this torch
reference.

Every step is one IEEE fp32 operation in exactly this order, evaluated the same way by the torch reference
here and by the Triton kernels of :mod:`composer_qsdp.kernels.minmax` (which disable FMA contraction), so
both give the same codes and the same decoded values bit for bit. A constant bucket (``scale == 0``) gets
code 0 everywhere and decodes exactly to its value.

Stochastic rounding is fixed-point (:func:`composer_qsdp.kernels.fixed_point.fraction_bits`, ``F = min(16, 22 -
bits)``): the fp32 sum ``t + 1.5 * 2**(23 - F)`` holds ``t_F``, ``t`` rounded to a multiple of ``2**-F``, in its
low mantissa bits; the top ``F`` bits ``k_F`` of the 16-bit noise value of element ``i`` of ``encode(x, seed,
offset)`` (:func:`composer_qsdp.quant.philox.rounding_bits` at counter ``offset + i``) are added to that bit
pattern, and the low ``F`` bits dropped. Over the ``2**F`` equally likely ``k_F``, ``E[code] = t_F`` exactly,
within ``2**-(F + 1)`` steps of ``t`` (``2**-17`` up to 6 bits, ``2**-15`` at 8), so ``E[decoded] = x`` to fp32
precision. The kernels compute it with one float add, one integer add and a shift, and round to nearest with the
same float add for ``F = 0`` (:mod:`composer_qsdp.kernels.groups`), without conversion instructions.

Wire format of ``encode`` for ``n`` elements in ``nb = ceil(n / bucket_size)`` buckets (the shared bucketed
format of :mod:`composer_qsdp.kernels.wire_format`)::

    [codes of bucket 0][codes of bucket 1]...[codes of the last bucket][0-3 zero bytes][metadata]

* codes: ``bits``-bit codes packed bucket by bucket as in :mod:`composer_qsdp.kernels.wire_format`, each bucket
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


import torch

from composer_qsdp.kernels import WireFormat, bucket_wire_format
from composer_qsdp.kernels.fixed_point import NOISE_BITS, fraction_bits
from composer_qsdp.quant.buckets import bucket_lattice
from composer_qsdp.quant.codec import sum_rows_in_order
from composer_qsdp.validate import check_choice
from composer_qsdp.quant.kernel_decode import KernelDecodes
from composer_qsdp.quant.philox import rounding_bits_range
from composer_qsdp.quant.residual import CodedResidual
from composer_qsdp.quant.symmetric import SymmetricCodec
from composer_qsdp.quant.wire import affine_decode, assemble_rows, pack_rows

__all__ = ["MinMaxCodec", "ROUNDINGS", "stochastic_round"]

#: Accepted values of ``rounding``.
ROUNDINGS = ("stochastic", "nearest")


def stochastic_round(t: torch.Tensor, k: torch.Tensor, bits: int) -> torch.Tensor:
    """Fixed-point stochastic rounding of fp32 ``t >= 0`` (below ``2**bits``) with 16-bit noise values ``k``: int64
    ``floor(t_F + k_F / 2**F)`` (module docstring; ``F = fraction_bits(bits)``), before clamping to the codes.

    ``t + 1.5 * 2**(23 - F)`` is one fp32 add, whose bit pattern minus that of ``1.5 * 2**(23 - F)`` is ``t_F * 2**F``;
    the kernels compute the same integers.
    """
    f = fraction_bits(bits)
    fixed = (t + 1.5 * 2.0 ** (23 - f)).view(torch.int32).to(torch.int64) - (0x4B400000 - (f << 23))
    return (fixed + (k >> (NOISE_BITS - f))) >> f


class MinMaxCodec(KernelDecodes):
    """Bucketed asymmetric min-max quantizer (see the module docstring for the exact math and wire).

    Args:
        bits: bits per code, 1..8.
        bucket_size: elements per bucket (1..2**24); one fp32 min and one fp32 scale per bucket.
        rounding: ``"stochastic"`` (unbiased, seeded Philox noise) or ``"nearest"`` (deterministic, ignores
            the seed, error at most half a step).

    Raises:
        ValueError: invalid ``bits``, ``bucket_size`` or ``rounding``.
    """

    name = "minmax"
    kernels_module = "minmax"

    def __init__(self, bits: int = 8, bucket_size: int = 1024, rounding: str = "stochastic") -> None:
        super().__init__(bits, bucket_size)
        self.rounding = check_choice("rounding", rounding, ROUNDINGS)

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

    def wire_format(self, numel: int) -> WireFormat:
        """Wire format of ``numel`` elements: two fp32 metadata words (min, scale) per bucket."""
        self._check_numel(numel)
        return bucket_wire_format(numel, self.bucket_size, self.bits, 2 * self.num_buckets(numel))

    def _encode_rows(self, x: torch.Tensor, seed: int, offset: int) -> torch.Tensor:
        kernels = self._kernels(x, x.shape[1])
        if kernels is None:
            return self._encode_rows_reference(x, seed, offset)
        fmt = self.wire_format(x.shape[1])
        return kernels.encode_rows(x, self.bits, self.bucket_size, fmt, self.stochastic, seed, offset)

    def _encode_rows_feedback(self, x: torch.Tensor, residual: torch.Tensor | CodedResidual, beta: float, seed: int,
                              offset: int) -> torch.Tensor:  # fmt: skip
        kernels = self._kernels(x, x.shape[1])
        fused = None if kernels is None else self._fused_residual(residual)
        if fused is None:
            return super()._encode_rows_feedback(x, residual, beta, seed, offset)
        return kernels.encode_rows_feedback(x, fused, beta, self.bits, self.bucket_size, self.wire_format(x.shape[1]),
                                            self.stochastic, seed, offset)  # fmt: skip

    def encode_rows_feedback_rotated(self, x: torch.Tensor, residual: torch.Tensor | CodedResidual, beta: float,
                                     seed: int, offset: int) -> torch.Tensor | None:  # fmt: skip
        """:class:`~composer_qsdp.quant.hadamard.FusedRotatedFeedback`: ``HadamardCodec(self)``'s
        :meth:`encode_rows_feedback` of validated arguments in one kernel pass, or ``None`` where no kernel covers
        the call (a CPU tensor, ``bucket_size`` not a power of two from 8 to 8192, a coded residual other than
        :meth:`_fused_residual` takes)."""
        fused = self._fused_residual(residual)
        return None if fused is None else self._encode_rotated(x, fused, beta, seed, offset)

    # ------------------------------------------------------------------ fused Hadamard rotation (FusedRotation)
    def encode_rows_rotated(self, x: torch.Tensor, seed: int = 0, offset: int = 0) -> torch.Tensor | None:
        """:class:`~composer_qsdp.quant.hadamard.FusedRotation`: :meth:`encode_rows` of the rows of ``[R, n]`` ``x``
        zero-padded to whole buckets and Hadamard-rotated, in one pass of the feedback encode's kernel without its
        residual (the rotated rows never go through memory); ``None`` where no kernel covers the call (a CPU tensor,
        ``bucket_size`` not a power of two from 8 to 8192)."""
        return self._encode_rotated(x, None, 0.0, seed, offset)

    def _encode_rotated(self, x: torch.Tensor, residual: torch.Tensor | None, beta: float, seed: int,
                        offset: int) -> torch.Tensor | None:  # fmt: skip
        """The rotated feedback kernel's one pass over ``x``, with the residual in its fused form or without one
        (``None``); ``None`` where no kernel covers the call."""
        padded = self.num_buckets(x.shape[1]) * self.bucket_size
        kernels = self._kernels(x, padded)
        if kernels is None or self.bucket_size & (self.bucket_size - 1):
            return None
        return kernels.encode_rows_feedback(x, residual, beta, self.bits, self.bucket_size, self.wire_format(padded),
                                            self.stochastic, seed, offset, rotate=True)  # fmt: skip

    def decode_rows_rotated(self, wire: torch.Tensor, numel: int, dtype: torch.dtype) -> None:
        """:class:`~composer_qsdp.quant.hadamard.FusedRotation`: no fused rotated decode (``None``)."""
        return None

    def decode_sum_rotated(self, wire: torch.Tensor, numel: int, out: torch.Tensor | None = None,
                           divisor: int = 1) -> torch.Tensor | None:  # fmt: skip
        """:class:`~composer_qsdp.quant.hadamard.FusedRotation`: :meth:`decode_sum` of a ``[R, wire_bytes(padded)]``
        wire rotated back, its first ``numel`` elements, divided by ``divisor`` (fp32, or rounded into ``out``), in
        one kernel pass; ``None`` where no kernel covers the call (a CPU tensor, ``bucket_size`` not a power of
        two, ``out`` on another device)."""
        padded = self.num_buckets(numel) * self.bucket_size
        self._check_wire_rows(wire, padded)
        kernels = self._kernels(wire, padded)
        elsewhere = out is not None and out.device != wire.device
        if kernels is None or self.bucket_size & (self.bucket_size - 1) or elsewhere:
            return None
        return kernels.decode_sum(wire, self.bits, self.bucket_size, self.wire_format(padded), rotate=True,
                                  numel=numel, out=out, divisor=divisor)  # fmt: skip

    def _fused_residual(self, residual: torch.Tensor | CodedResidual) -> torch.Tensor | None:
        """The residual as the feedback kernel takes it (a float tensor, or a coded residual's wire rows), or
        ``None`` for a coded residual it does not read: the kernel stores only ``SymmetricCodec(8, bucket_size)``'s
        wire, whose buckets are this codec's."""
        if not isinstance(residual, CodedResidual):
            return residual
        storage = residual.codec
        # The exact class: a subclass may change the arithmetic that the kernel reproduces.
        if type(storage) is SymmetricCodec and storage.bits == 8 and storage.bucket_size == self.bucket_size:
            return residual.wire
        return None

    # ------------------------------------------------------------------ torch reference
    def _encode_rows_reference(self, x: torch.Tensor, seed: int, offset: int) -> torch.Tensor:
        """Reference of ``encode_rows`` (also the CPU path); the kernels match it bit for bit."""
        rows, n = x.shape
        fmt = self.wire_format(n)
        xb, lo, scale, inv, nonfinite = bucket_lattice(x, self.bucket_size, self.levels)
        nb, width = xb.shape[1:]
        t = (xb - lo.unsqueeze(2)) * inv.unsqueeze(2)
        if self.stochastic:
            k = rounding_bits_range(seed, offset, rows * n, device=x.device).view(rows, n)
            if nb * width > n:
                k = torch.nn.functional.pad(k, (0, nb * width - n))
            codes = stochastic_round(t, k.view(rows, nb, width), self.bits).clamp_(0, self.levels)
        else:
            codes = torch.round(t).clamp_(0, self.levels)  # torch.round: half to even
        codes = codes.masked_fill_(nonfinite.unsqueeze(2), 0).to(torch.uint8).view(rows, nb * width)
        codes[:, n:] = 0
        meta = torch.stack((lo, scale), dim=2).masked_fill_(nonfinite.unsqueeze(2), float("nan"))
        return assemble_rows(pack_rows(codes, fmt, self.bits), meta.view(rows, 2 * nb), fmt)

    def _decode_rows_fp32(self, wire: torch.Tensor, numel: int) -> torch.Tensor:
        """Reference of ``decode_rows`` in fp32 (the output dtype is one rounding of this)."""
        return affine_decode(wire, self.wire_format(numel), self.bits, self.bucket_size)

    def _decode_sum_reference(self, wire: torch.Tensor, numel: int) -> torch.Tensor:
        """Reference of ``decode_sum``: the decoded rows summed in order, as the kernel accumulates."""
        return sum_rows_in_order(self._decode_rows_fp32(wire, numel))

    def __repr__(self) -> str:
        return f"MinMaxCodec(bits={self.bits}, bucket_size={self.bucket_size}, rounding={self.rounding!r})"

