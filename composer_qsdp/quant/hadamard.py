"""Hadamard pre-rotation (SDP4Bit's "Hadamard smoother"): quantize ``H x`` instead of ``x``, bucket by bucket.

``H`` is the normalized Walsh-Hadamard matrix of order ``B = bucket_size`` (Sylvester's construction divided
by ``sqrt(B)``): orthonormal and symmetric, so it is its own inverse. Rotating a bucket spreads an outlier's
energy over all ``B`` coordinates, which shrinks the bucket's range and therefore the quantization step,
while the rotation itself preserves the L2 norm of every bucket and of the error. ``B`` must be a power of two.

:class:`HadamardCodec` wraps any codec with the same ``bucket_size``, so rotation buckets and quantization
buckets coincide::

    encode: pad each row with zeros to whole buckets -> rotate every bucket (fp32) -> inner.encode
    decode: inner.decode (fp32) -> rotate every bucket back -> drop the padding -> cast

Consequences:

* unbiased iff the inner codec is (``E[H^T Q(H x)] = H^T H x = x``); the error of a bucket has the same L2
  norm as the inner codec's error on the rotated bucket, at most ``sqrt(B)`` inner steps.
* ``decode_sum`` rotates back once, after summing in the rotated domain (``sum_r H^T y_r = H^T sum_r y_r``),
  as SDP4Bit's fused dequantize-reduce kernel does.
* a NaN or an infinity spreads to its whole rotated bucket, which the inner codec turns into a non-finite
  decoded bucket, and the inverse rotation keeps it non-finite.
* the wire is the inner codec's wire of the padded length (``wire_bytes(n) = inner.wire_bytes(nb * B)``);
  padded element ``j`` of bucket ``k`` draws its rounding noise at counter ``offset + k * B + j``.

The transform runs as ``log2(B)`` butterfly stages; on CUDA tensors the Triton kernel of
:mod:`composer_qsdp.kernels.hadamard` does the same stages in registers (``B`` up to 8192; larger buckets
use this torch reference). An inner codec whose kernels can apply the rotation themselves implements
:class:`FusedRotation` (the symmetric codec does) and then does the whole encode or decode in one pass over
memory, with the same numbers.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from composer_qsdp.kernels import use_triton
from composer_qsdp.quant.codec import Codec
from composer_qsdp.quant.residual import CodedResidual

__all__ = ["FusedRotatedFeedback", "FusedRotation", "HadamardCodec", "hadamard_rows", "hadamard_rows_"]


def _check_power_of_two(bucket_size: int) -> int:
    is_int = isinstance(bucket_size, int) and not isinstance(bucket_size, bool)
    if not is_int or bucket_size < 1 or bucket_size & (bucket_size - 1):
        raise ValueError(
            f"bucket_size={bucket_size!r} cannot be Hadamard-rotated; allowed: a power of two (1, 2, 4, ..., 1024, ...)"
        )
    return bucket_size


def hadamard_rows(x: torch.Tensor, bucket_size: int, out_cols: int, dtype: torch.dtype) -> torch.Tensor:
    """Rotate every bucket of every row of ``x`` by the normalized Walsh-Hadamard matrix of order ``bucket_size``.

    Each row of the ``[R, n]`` input is zero-padded to ``nb = ceil(n / bucket_size)`` whole buckets and each
    bucket is multiplied by ``H / sqrt(bucket_size)`` in fp32; the result keeps the first ``out_cols`` columns
    (``<= nb * bucket_size``) and is cast to ``dtype``. Applying it twice gives the input back (to fp32 rounding).

    Args:
        x: ``[R, n]`` floating tensor.
        bucket_size: a power of two (elements).
        out_cols: columns of the result (elements per row).
        dtype: dtype of the result.

    Returns:
        ``[R, out_cols]`` tensor of ``dtype``.
    """
    _check_power_of_two(bucket_size)
    padded = -(-x.shape[1] // bucket_size) * bucket_size
    if not 1 <= out_cols <= padded:
        raise ValueError(f"out_cols={out_cols!r} is invalid; allowed: 1..{padded} (the padded row length)")
    return _rotate(x, bucket_size, out_cols, dtype)


def hadamard_rows_(x: torch.Tensor, bucket_size: int) -> torch.Tensor:
    """:func:`hadamard_rows` of ``x`` written over ``x``, bit for bit: no second tensor of its size on the GPU.

    Args:
        x: ``[R, n]`` float32 tensor with unit stride along a row, ``n`` a multiple of ``bucket_size``.
        bucket_size: a power of two (elements).

    Returns:
        ``x``, rotated.
    """
    _check_power_of_two(bucket_size)
    if x.dtype != torch.float32 or x.dim() != 2 or x.stride(1) != 1 or x.shape[1] % bucket_size:
        raise ValueError(
            f"hadamard_rows_ cannot rotate a {x.dtype} tensor of shape {tuple(x.shape)} and strides {x.stride()} in "
            f"place; allowed: float32 [R, n] with unit stride along a row and n a multiple of bucket_size={bucket_size}"
        )
    return _rotate(x, bucket_size, x.shape[1], torch.float32, out=x)


def _rotate(x: torch.Tensor, bucket_size: int, out_cols: int, dtype: torch.dtype,
            out: torch.Tensor | None = None) -> torch.Tensor:
    """The Triton kernel where it applies, else the reference; written into ``out`` when given."""
    if use_triton(x):
        from composer_qsdp.kernels import hadamard as kernels

        if kernels.supports(bucket_size):
            return kernels.hadamard_rows(x, bucket_size, out_cols, dtype, out=out)
    y = _hadamard_rows_reference(x, bucket_size, out_cols, dtype)
    return y if out is None else out.copy_(y)


def _hadamard_rows_reference(x: torch.Tensor, bucket_size: int, out_cols: int, dtype: torch.dtype) -> torch.Tensor:
    rows, n = x.shape
    padded = -(-n // bucket_size) * bucket_size
    y = torch.nn.functional.pad(x.to(torch.float32), (0, padded - n)).reshape(-1)
    half = 1
    # Stage with half-width h: within each block of 2h, (a, b) -> (a + b, a - b) for the two halves a and b.
    while half < bucket_size:
        pairs = y.view(-1, 2, half)
        y = torch.stack((pairs[:, 0] + pairs[:, 1], pairs[:, 0] - pairs[:, 1]), dim=1).view(-1)
        half *= 2
    y = y * bucket_size**-0.5  # multiplied as fp32 (y's dtype); a Python float needs no copy to the device
    return y.view(rows, padded)[:, :out_cols].to(dtype)


@runtime_checkable
class FusedRotation(Protocol):
    """A codec that can apply the Hadamard rotation of its buckets inside its own kernels.

    :class:`HadamardCodec` rotates with the rotation kernel, then runs its inner codec: two passes over memory.
    An inner codec that implements these three methods lets the wrapper do each call in one pass instead. Each
    method returns what the two-pass composition returns, bit for bit, for a codec with the same ``bucket_size``
    (a power of two), or ``None`` where the codec cannot fuse that call (for instance a CPU tensor, or a
    configuration its kernels do not cover), and the wrapper then takes the two passes. ``padded`` below is
    ``numel`` rounded up to whole buckets, the length the inner codec's wire describes.
    """

    def encode_rows_rotated(self, x: torch.Tensor, seed: int, offset: int) -> torch.Tensor | None:
        """The ``[R, wire_bytes(padded)]`` wire of the ``[R, numel]`` floating ``x`` whose rows are zero-padded to
        whole buckets and rotated, each bucket multiplied by the normalized Walsh-Hadamard matrix (row ``r``
        draws its rounding noise from counter ``offset + r * numel`` under key ``seed``), or ``None``."""
        ...

    def decode_rows_rotated(self, wire: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor | None:
        """The decode of a ``[R, wire_bytes(padded)]`` wire rotated back, its first ``numel`` columns, as
        ``[R, numel]`` of ``dtype``, or ``None``."""
        ...

    def decode_sum_rotated(self, wire: torch.Tensor, numel: int, out: torch.Tensor | None = None,
                           divisor: int = 1) -> torch.Tensor | None:  # fmt: skip
        """The fp32 sum of the decoded rows of a ``[R, wire_bytes(padded)]`` wire (rows in order from +0.0) rotated
        back, its first ``numel`` elements, divided by ``divisor`` in fp32 (one IEEE division) and, with ``out``
        (a validated contiguous ``[numel]`` floating tensor), rounded into it; or ``None``."""
        ...


@runtime_checkable
class FusedRotatedFeedback(Protocol):
    """A codec whose kernels can run :meth:`~composer_qsdp.quant.codec.Codec.encode_rows_feedback` of
    ``HadamardCodec(codec)`` in one pass: rotate ``x + residual``, quantize, decode, rotate back and update the
    residual without writing the intermediates to memory."""

    def encode_rows_feedback_rotated(self, x: torch.Tensor, residual: torch.Tensor | CodedResidual, beta: float, seed: int,
                                     offset: int) -> torch.Tensor | None:  # fmt: skip
        """``HadamardCodec(self).encode_rows_feedback(x, residual, beta, seed, offset)`` bit for bit (validated
        arguments), or ``None`` where the codec cannot fuse that call."""
        ...


class HadamardCodec(Codec):
    """``inner`` applied to Hadamard-rotated buckets (see the module docstring).

    Args:
        inner: the codec that quantizes the rotated values; its ``bucket_size`` must be a power of two. When it
            implements :class:`FusedRotation`, its fused kernels are used wherever they cover a call.

    Raises:
        ValueError: ``inner`` is not a codec or its ``bucket_size`` is not a power of two.
    """

    name = "hadamard"

    def __init__(self, inner: Codec) -> None:
        if not isinstance(inner, Codec):
            raise ValueError(f"HadamardCodec wraps a Codec, got {type(inner).__name__}")
        super().__init__(inner.bits, _check_power_of_two(inner.bucket_size))
        self.inner = inner
        self._fused: FusedRotation | None = inner if isinstance(inner, FusedRotation) else None

    @property
    def unbiased(self) -> bool:
        return self.inner.unbiased

    def padded(self, numel: int) -> int:
        """Elements after zero-padding ``numel`` to whole buckets (what the inner codec encodes)."""
        return self.num_buckets(numel) * self.bucket_size

    def wire_bytes(self, numel: int) -> int:
        self._check_numel(numel)
        return self.inner.wire_bytes(self.padded(numel))

    def _encode_rows(self, x: torch.Tensor, seed: int, offset: int) -> torch.Tensor:
        fused = None if self._fused is None else self._fused.encode_rows_rotated(x, seed, offset)
        if fused is not None:
            return fused
        rows, n = x.shape
        padded = self.padded(n)
        rotated = hadamard_rows(x, self.bucket_size, padded, torch.float32)
        if padded == n:  # row r starts at counter offset + r * n in both codecs: one batched call
            return self.inner.encode_rows(rotated, seed, offset)
        return torch.stack([self.inner.encode(rotated[r], seed, offset + r * n) for r in range(rows)])

    def _encode_rows_feedback(self, x: torch.Tensor, residual: torch.Tensor | CodedResidual, beta: float, seed: int,
                              offset: int) -> torch.Tensor:  # fmt: skip
        if isinstance(self.inner, FusedRotatedFeedback):
            fused = self.inner.encode_rows_feedback_rotated(x, residual, beta, seed, offset)
            if fused is not None:
                return fused
        return super()._encode_rows_feedback(x, residual, beta, seed, offset)

    def _decode_rows(self, wire: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        fused = None if self._fused is None else self._fused.decode_rows_rotated(wire, numel, dtype)
        if fused is not None:
            return fused
        rotated = self.inner.decode_rows(wire, self.padded(numel), torch.float32)
        return hadamard_rows(rotated, self.bucket_size, numel, dtype)

    def _decode_sum(self, wire: torch.Tensor, numel: int) -> torch.Tensor:
        fused = None if self._fused is None else self._fused.decode_sum_rotated(wire, numel)
        if fused is not None:
            return fused
        rotated = self.inner.decode_sum(wire, self.padded(numel))
        return hadamard_rows(rotated.view(1, -1), self.bucket_size, numel, torch.float32)[0]

    def _decode_sum_into(self, wire: torch.Tensor, out: torch.Tensor, divisor: int) -> torch.Tensor:
        # A reduce-scatter's output: the fused kernel writes the average straight into it, where the reference
        # path holds the fp32 sum, the divisor as a tensor and the quotient (12 bytes per element) beside the codes.
        fused = None if self._fused is None else self._fused.decode_sum_rotated(wire, out.numel(), out, divisor)
        if fused is not None:
            return fused
        return super()._decode_sum_into(wire, out, divisor)

    def __repr__(self) -> str:
        return f"HadamardCodec({self.inner!r})"
