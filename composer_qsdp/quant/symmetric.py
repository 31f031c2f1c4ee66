"""Symmetric abs-max block quantizer with round-to-nearest (ZeRO++ qwZ, SDP4Bit).

Per bucket (ZeRO++'s "block") of ``bucket_size`` elements, with ``qmax = 2**(bits - 1) - 1``::

    absmax  = max |x|                                           # fp32
    scale   = absmax / qmax                                     # fp32, one quantization step
    inv     = qmax / absmax  (0 when absmax == 0, capped at the largest fp32)
    q       = clamp(round_half_even(x * inv), -qmax, qmax)      # signed level
    code    = q + qmax                                          # offset binary in [0, 2 * qmax]
    decoded = (code - qmax) * scale                             # fp32, then cast to the output dtype

Levels: ``±qmax`` (SDP4Bit's choice, ±7 at INT4 and ±127 at INT8) rather than DeepSpeed's
``[-2**(b-1), 2**(b-1) - 1]``. The grid is then symmetric: ``x`` and ``-x`` quantize to opposite values, 0 is
exact, and ``±absmax`` is itself a level, so no element is clipped and the error is at most half a step
everywhere; DeepSpeed's extra negative level is never used by the largest positive element, whose
``absmax * 2**b / (2 * absmax) = 2**(b-1)`` is clipped to ``2**(b-1) - 1``. The cost is one of the ``2**b``
codes (code ``2**b - 1`` is never produced).

Every step is one IEEE fp32 operation in this order, done the same way by this torch reference and by the
Triton kernels of :mod:`composer_qsdp.kernels.symmetric` (which round half to even with the same result and
disable FMA contraction), so both give the same wire and the same decoded values bit for bit. On CUDA tensors
(see :mod:`composer_qsdp.kernels.dispatch`) every encode/decode path runs those kernels when they cover the
configuration (any ``bits``; ``bucket_size`` a multiple of 8 up to 8192), else this torch reference;
wrapped in :class:`composer_qsdp.quant.hadamard.HadamardCodec`, the kernels also apply the rotation (power-of-two
buckets; the codec implements :class:`composer_qsdp.quant.hadamard.FusedRotation`), so a rotated encode or decode
is one pass over memory.

Wire (:mod:`composer_qsdp.kernels.wire_format`): codes packed bucket by bucket, then one fp32 ``scale`` per bucket
(``bits + 32 / bucket_size`` bits per element).

Non-finite input: a bucket holding a NaN or an infinity is stored with ``scale = NaN`` and code ``qmax``
(level 0), so every element of that bucket decodes to NaN; finite buckets are unaffected.
"""

from __future__ import annotations

from types import ModuleType

import torch

from composer_qsdp.kernels import WireFormat, bucket_wire_format, use_triton
from composer_qsdp.quant.buckets import FP32_MAX, bucket_width, ieee_div
from composer_qsdp.quant.codec import Codec, check_bits, sum_rows_in_order
from composer_qsdp.quant.wire import assemble_rows, pack_rows, read_meta, unpack_rows
from composer_qsdp.validate import check_int

__all__ = ["SymmetricCodec"]


class SymmetricCodec(Codec):
    """Bucketed symmetric abs-max quantizer, round-to-nearest (see the module docstring for math and wire).

    Args:
        bits: bits per code, 2..8 (8 and 4 are ZeRO++/SDP4Bit's INT8/INT4).
        bucket_size: elements per bucket (1..2**24); one fp32 scale per bucket. The default, 2048, is SDP4Bit's
            weight group; ZeRO++'s qwZ blocks are 4k-8k elements and SDP4Bit's gradient groups 128.

    Raises:
        ValueError: invalid ``bits`` or ``bucket_size``.
    """

    name = "symmetric"

    def __init__(self, bits: int = 8, bucket_size: int = 2048) -> None:
        super().__init__(check_bits(bits, range(2, 9)), bucket_size)

    @property
    def qmax(self) -> int:
        """Largest level magnitude, ``2**(bits - 1) - 1``."""
        return (1 << (self.bits - 1)) - 1

    def wire_format(self, numel: int) -> WireFormat:
        """Wire format of ``numel`` elements (shared with the Triton launchers)."""
        self._check_numel(numel)
        return bucket_wire_format(numel, self.bucket_size, self.bits, meta_words=self.num_buckets(numel))

    def wire_bytes(self, numel: int) -> int:
        return self.wire_format(numel).wire_bytes

    def encode_zero_rows(self, rows: int, numel: int, device: torch.device | str = "cpu") -> torch.Tensor:
        # Every bucket of zeros encodes alike (level 0 everywhere, the same scale) and starts on a byte boundary, so
        # the row is one full bucket's codes repeated, the last bucket's, and one bucket's scale repeated: what a
        # resumed LoCo residual's template of every unit's gradient would otherwise encode element by element.
        fmt = self.wire_format(numel)
        check_int("rows", rows, minimum=1)
        full = self.encode_rows(torch.zeros(1, self.bucket_size))[0].to(device)
        last = self.encode_rows(torch.zeros(1, fmt.last_bucket))[0].to(device)
        head = (fmt.num_buckets - 1) * fmt.bucket_bytes
        wire = torch.zeros(rows, fmt.wire_bytes, dtype=torch.uint8, device=device)
        wire[:, :head] = full[: fmt.bucket_bytes].repeat(fmt.num_buckets - 1)
        wire[:, head : fmt.code_bytes] = last[: fmt.code_bytes - head]
        scale_at = self.wire_format(self.bucket_size).meta_offset
        wire[:, fmt.meta_offset :] = full[scale_at : scale_at + 4].repeat(fmt.num_buckets)
        return wire

    def _kernels(self, tensor: torch.Tensor, rotate: bool = False) -> ModuleType | None:
        """The kernel module when ``tensor`` should take the Triton path and a kernel covers this codec (and the
        Hadamard rotation, with ``rotate``)."""
        if not use_triton(tensor):
            return None
        from composer_qsdp.kernels import symmetric as kernels

        return kernels if kernels.supports(self.bits, self.bucket_size, rotate) else None

    def _encode_rows(self, x: torch.Tensor, seed: int, offset: int) -> torch.Tensor:
        fmt = self.wire_format(x.shape[1])
        kernels = self._kernels(x)
        if kernels is not None:
            return kernels.encode_rows(x, self.bits, self.bucket_size, fmt)
        return self._encode_rows_reference(x, fmt)

    def _decode_rows(self, wire: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        fmt = self.wire_format(numel)
        kernels = self._kernels(wire)
        if kernels is not None:
            return kernels.decode_rows(wire, self.bits, self.bucket_size, fmt, dtype)
        return self._decode_rows_fp32(wire, fmt).to(dtype)

    def _decode_rows_into(self, wire: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        kernels = self._kernels(wire)
        if kernels is None or out.device != wire.device:
            return super()._decode_rows_into(wire, out)
        return kernels.decode_rows(wire, self.bits, self.bucket_size, self.wire_format(out.shape[1]), out.dtype,
                                   out=out)

    def _encode_difference_rows(self, x: torch.Tensor, ref: torch.Tensor, seed: int, offset: int) -> torch.Tensor:
        kernels = self._kernels(x)
        if kernels is not None and ref.device == x.device:
            return kernels.encode_rows(x, self.bits, self.bucket_size, self.wire_format(x.shape[1]), ref=ref)
        return super()._encode_difference_rows(x, ref, seed, offset)

    def _decode_add_rows(self, wire: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        kernels = self._kernels(wire)
        if kernels is not None and out.device == wire.device:
            return kernels.decode_add_rows(wire, self.bits, self.bucket_size, self.wire_format(out.shape[1]), out)
        return super()._decode_add_rows(wire, out)

    def _decode_sum(self, wire: torch.Tensor, numel: int) -> torch.Tensor:
        fmt = self.wire_format(numel)
        kernels = self._kernels(wire)
        if kernels is not None:
            return kernels.decode_sum(wire, self.bits, self.bucket_size, fmt)
        return sum_rows_in_order(self._decode_rows_fp32(wire, fmt))

    def _decode_sum_into(self, wire: torch.Tensor, out: torch.Tensor, divisor: int) -> torch.Tensor:
        kernels = self._kernels(wire)
        if kernels is None or out.device != wire.device:
            return super()._decode_sum_into(wire, out, divisor)
        return kernels.decode_sum(wire, self.bits, self.bucket_size, self.wire_format(out.numel()), out=out,
                                  divisor=divisor)  # fmt: skip

    # ------------------------------------------------------------------ fused Hadamard rotation (FusedRotation)
    def encode_rows_rotated(self, x: torch.Tensor, seed: int = 0, offset: int = 0) -> torch.Tensor | None:
        """:meth:`encode_rows` of the rows of ``[R, n]`` ``x`` zero-padded to whole buckets and Hadamard-rotated,
        in one kernel pass: ``[R, wire_bytes(padded)]`` ``uint8``, or ``None`` where no kernel covers the call (a
        CPU tensor, ``bucket_size`` not a power of two from 8 to 8192 elements).
        ``seed`` and ``offset`` are validated and unused (round to nearest)."""
        self._check_rows_input(x, seed, offset)
        kernels = self._kernels(x, rotate=True)
        if kernels is None:
            return None
        return kernels.encode_rows(x, self.bits, self.bucket_size, self._padded_wire_format(x.shape[1]), rotate=True)

    def decode_rows_rotated(self, wire: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor | None:
        """:meth:`decode_rows` of a ``[R, wire_bytes(padded)]`` wire rotated back, its first ``numel`` columns, as
        ``[R, numel]`` of ``dtype``, in one kernel pass; ``None`` where no kernel covers the call."""
        fmt = self._padded_wire_format(numel)
        self._check_wire_rows(wire, fmt.numel)
        self._check_dtype(dtype)
        kernels = self._kernels(wire, rotate=True)
        if kernels is None:
            return None
        return kernels.decode_rows(wire, self.bits, self.bucket_size, fmt, dtype, True, numel)

    def decode_sum_rotated(self, wire: torch.Tensor, numel: int, out: torch.Tensor | None = None,
                           divisor: int = 1) -> torch.Tensor | None:  # fmt: skip
        """:meth:`decode_sum` of a ``[R, wire_bytes(padded)]`` wire rotated back, its first ``numel`` elements,
        divided by ``divisor`` (fp32, or rounded into ``out``), in one kernel pass; ``None`` where no kernel covers
        the call."""
        fmt = self._padded_wire_format(numel)
        self._check_wire_rows(wire, fmt.numel)
        kernels = self._kernels(wire, rotate=True)
        if kernels is None or (out is not None and out.device != wire.device):
            return None
        return kernels.decode_sum(wire, self.bits, self.bucket_size, fmt, True, numel, out=out, divisor=divisor)

    def _padded_wire_format(self, numel: int) -> WireFormat:
        """Wire format of ``numel`` elements zero-padded to whole buckets (the rotated wire's)."""
        self._check_numel(numel)
        return self.wire_format(self.num_buckets(numel) * self.bucket_size)

    # ------------------------------------------------------------------ torch reference
    def _encode_rows_reference(self, x: torch.Tensor, fmt: WireFormat) -> torch.Tensor:
        rows, n = x.shape
        nb, width = fmt.num_buckets, bucket_width(n, self.bucket_size)
        # Zero padding leaves every bucket's absmax unchanged.
        xb = torch.nn.functional.pad(x.to(torch.float32), (0, nb * width - n)).view(rows, nb, width)
        absmax = xb.abs().amax(dim=2)
        # amax propagates NaN, so the abs-max is non-finite exactly when the bucket holds a NaN or an infinity.
        nonfinite = ~torch.isfinite(absmax)
        scale = ieee_div(absmax, self.qmax).masked_fill_(nonfinite, float("nan"))
        # A tensor numerator: torch evaluates `scalar / tensor` as reciprocal-then-multiply, not one IEEE division.
        inv = torch.where(absmax > 0, torch.full_like(absmax, self.qmax) / absmax, 0.0).clamp_(max=FP32_MAX)
        q = torch.round(xb * inv.unsqueeze(2)).clamp_(-self.qmax, self.qmax)
        q = q.masked_fill_(nonfinite.unsqueeze(2), 0)
        codes = (q + self.qmax).to(torch.uint8).view(rows, nb * width)
        codes[:, n:] = 0
        return assemble_rows(pack_rows(codes, fmt, self.bits), scale, fmt)

    def _decode_rows_fp32(self, wire: torch.Tensor, fmt: WireFormat) -> torch.Tensor:
        rows = wire.shape[0]
        levels = unpack_rows(wire, fmt, self.bits, self.bucket_size).to(torch.int32) - self.qmax
        decoded = levels.to(torch.float32) * read_meta(wire, fmt).unsqueeze(2)
        return decoded.view(rows, -1)[:, : fmt.numel]
