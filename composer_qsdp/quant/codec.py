"""The one codec interface: a floating tensor -> one flat ``uint8`` wire buffer -> a tensor.

Every codec in :mod:`composer_qsdp.quant` implements :class:`Codec`. The communication layer only ever
talks to this interface, so a new quantizer plugs into the quantized all-gather and reduce-scatter by
implementing the batched hooks ``_encode_rows``/``_decode_rows`` (and optionally ``_decode_sum``) behind the
validated ``encode_rows``/``decode_rows``/``decode_sum``; a 1-D ``encode``/``decode`` is the one-row case.

Wire buffers are self-contained: everything :meth:`Codec.decode` needs (codes and per-bucket metadata)
is inside the bytes, so a receiver never needs the sender's seed.

Random streams: ``encode(x, seed, offset)`` draws the rounding noise of element ``i`` from a
counter-based stream at counter ``offset + i`` under key ``seed``. ``encode_rows`` encodes row ``r`` of a
``[R, n]`` matrix exactly as ``encode(x[r], seed, offset + r * n)``; that equivalence is the specification
the Triton kernels are tested against.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from composer_qsdp.quant.buckets import ieee_div
from composer_qsdp.quant.residual import CodedResidual
from composer_qsdp.validate import check_int, check_noise_key, is_fraction

__all__ = ["Codec", "FLOAT_DTYPES", "MAX_BUCKET_SIZE", "check_bits", "check_bucket_size", "sum_rows_in_order"]

#: Dtypes a codec accepts as input and produces as output.
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

#: Largest ``bucket_size`` (elements). Metadata costs at most 64 / bucket_size bits per element, so buckets beyond
#: a few thousand elements save nothing measurable, while a Hadamard-rotated wire pads each row to whole buckets,
#: whatever the tensor's size; the bound keeps that padding to 2**24 elements (64 MiB of fp32) per row.
MAX_BUCKET_SIZE = 2**24


def check_bits(bits: int, allowed: range | tuple[int, ...] = range(1, 9)) -> int:
    """Return ``bits`` if it is an int in ``allowed``, else raise a ``ValueError`` naming both."""
    if isinstance(bits, bool) or not isinstance(bits, int) or bits not in allowed:
        allowed_text = (f"integers {allowed.start}..{allowed.stop - 1}" if isinstance(allowed, range)
                        else ", ".join(map(str, allowed)))
        raise ValueError(f"bits={bits!r} is not supported; allowed: {allowed_text}")
    return bits


def check_bucket_size(bucket_size: int) -> int:
    """Return ``bucket_size`` if it is an int in ``1..MAX_BUCKET_SIZE`` (elements), else raise a ``ValueError``
    naming it and the allowed range."""
    if isinstance(bucket_size, bool) or not isinstance(bucket_size, int) or not 1 <= bucket_size <= MAX_BUCKET_SIZE:
        raise ValueError(
            f"bucket_size={bucket_size!r} is invalid; it must be an integer in 1..{MAX_BUCKET_SIZE} "
            f"(2**24 elements per bucket)"
        )
    return bucket_size


def sum_rows_in_order(decoded: torch.Tensor) -> torch.Tensor:
    """The sum of the rows of ``[R, n]`` fp32 ``decoded`` as a 1-D fp32 tensor of ``n`` elements.

    Rows are added one at a time in order 0..R-1 starting from +0.0, exactly as the decode-and-sum kernels
    accumulate, so the fp32 result is the same on every implementation (``torch.sum``'s order is unspecified).
    """
    acc = torch.zeros(decoded.shape[1], dtype=torch.float32, device=decoded.device)
    for row in decoded:
        acc += row
    return acc


class Codec(ABC):
    """Bucketed quantizer with a flat ``uint8`` wire format.

    Attributes:
        name: registry name (``make_codec(name, ...)``).
        bits: bits per code (1..8).
        bucket_size: elements that share one set of metadata (scale, offset, levels...), 1..MAX_BUCKET_SIZE.
    """

    name: str = "abstract"

    def __init__(self, bits: int, bucket_size: int) -> None:
        self.bits = check_bits(bits)
        self.bucket_size = check_bucket_size(bucket_size)

    # ----------------------------------------------------------------- sizes
    def num_buckets(self, numel: int) -> int:
        """Number of buckets covering ``numel`` elements (the last one may be partial)."""
        return -(-numel // self.bucket_size)

    @abstractmethod
    def wire_bytes(self, numel: int) -> int:
        """Exact size in bytes of ``encode`` of a tensor with ``numel`` elements."""

    @property
    def unbiased(self) -> bool:
        """True when ``E_seed[decode(encode(x, seed))] == x`` (stochastic codecs)."""
        return False

    # ------------------------------------------------------------- public API
    def encode(self, x: torch.Tensor, seed: int = 0, offset: int = 0) -> torch.Tensor:
        """Quantize ``x`` (any shape, flattened) into a 1-D ``uint8`` tensor of ``wire_bytes(x.numel())`` bytes.

        Args:
            x: floating tensor (fp32, bf16 or fp16), non-empty.
            seed: key of the random stream, a noise key in ``[0, 2**63)``
                (:data:`~composer_qsdp.validate.NOISE_KEY_BITS`); ignored by deterministic codecs.
            offset: counter of the first element in the random stream (>= 0).
        """
        self._check_input(x)
        self._check_seed(seed, offset)
        wire = self._encode(x.reshape(-1), seed, offset)
        assert wire.dtype == torch.uint8 and wire.numel() == self.wire_bytes(x.numel())
        return wire

    def decode(self, wire: torch.Tensor, numel: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Decode a wire buffer produced by :meth:`encode` into a 1-D tensor of ``numel`` elements of ``dtype``."""
        self._check_wire(wire, numel)
        self._check_dtype(dtype)
        return self._decode(wire, numel, dtype)

    def encode_rows(self, x: torch.Tensor, seed: int = 0, offset: int = 0) -> torch.Tensor:
        """Encode each row of a ``[R, n]`` tensor independently: ``[R, wire_bytes(n)]`` ``uint8``.

        Row ``r`` equals ``encode(x[r], seed, offset + r * n)``.
        """
        self._check_rows_input(x, seed, offset)
        return self._encode_rows(x, seed, offset)

    def encode_zero_rows(self, rows: int, numel: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """The wire of a ``[rows, numel]`` tensor of zeros, ``encode_rows(torch.zeros(rows, numel))`` (a codec's zero
        need not be all-zero bytes), on ``device``: ``[rows, wire_bytes(numel)]`` ``uint8``.

        A round-to-nearest codec whose wire is made of its buckets' (the symmetric codec) builds it from one bucket's
        encode, without encoding ``rows * numel`` elements; the others encode the zeros.
        """
        return self.encode_rows(torch.zeros(rows, numel, device=device))

    def decode_rows(
        self, wire: torch.Tensor, numel: int, dtype: torch.dtype = torch.float32, *, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Decode a ``[R, wire_bytes(numel)]`` buffer into a ``[R, numel]`` tensor of ``dtype``.

        Args:
            out: optional ``[R, numel]`` tensor of ``dtype`` with contiguous rows to decode into (a collective's
                output buffer): codecs with a decode kernel write it directly, saving the copy of a separate
                result; returned.
        """
        self._check_wire_rows(wire, numel)
        self._check_dtype(dtype)
        if out is None:
            return self._decode_rows(wire, numel, dtype)
        shape = (wire.shape[0], numel)
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != shape or out.dtype != dtype or out.stride(1) != 1:
            raise ValueError(
                f"out must be a {list(shape)} tensor of {dtype} with contiguous rows, got {_describe(out)}"
            )
        return self._decode_rows_into(wire, out)

    def encode_difference_rows(
        self, x: torch.Tensor, ref: torch.Tensor, seed: int = 0, offset: int = 0
    ) -> torch.Tensor:
        """:meth:`encode_rows` of ``x - ref``, the difference taken in fp32 (``x.float() - ref.float()``): what a
        weight-difference scheme sends. Codecs with a fused kernel never write the difference to memory.

        Args:
            x, ref: ``[R, n]`` floating tensors of the same shape.
            seed, offset: as :meth:`encode_rows`.
        """
        self._check_rows_input(x, seed, offset)
        self._check_input(ref)
        if ref.shape != x.shape:
            raise ValueError(f"ref has shape {tuple(ref.shape)} but x has {tuple(x.shape)}; they must match")
        return self._encode_difference_rows(x, ref, seed, offset)

    def encode_rows_feedback(
        self, x: torch.Tensor, residual: torch.Tensor | CodedResidual, beta: float, seed: int = 0, offset: int = 0
    ) -> torch.Tensor:
        """:meth:`encode_rows` of ``c = x + residual`` with error feedback: what LoCo's reduce-scatter sends.

        ``residual`` is updated in place to ``fresh - beta * (fresh - residual)`` (``beta * residual + (1 - beta) *
        fresh``), where ``fresh = c - decode_rows(wire)`` is this call's quantization error; all of it is computed in
        fp32, each operation rounded once in this order, and rounded once into the residual's dtype (or its codec's
        grid). Entries that come out non-finite (a NaN/Inf gradient) are reset to zero, so one overflowing step does
        not poison later ones. Codecs with a fused kernel never write ``c``, its encode's decode or the error to memory.

        Args:
            x: ``[R, n]`` floating tensor.
            residual: contiguous float32 or bfloat16 tensor of ``R * n`` elements on ``x``'s device, or a
                :class:`~composer_qsdp.quant.residual.CodedResidual` of ``R`` rows of ``n`` elements there (read as
                fp32, stored once per call).
            beta: the residual's moving-average coefficient, in ``[0, 1)``.
            seed, offset: as :meth:`encode_rows`.

        Raises:
            ValueError: a residual of another dtype, size, shape or device, or ``beta`` outside ``[0, 1)``.
        """
        self._check_rows_input(x, seed, offset)
        if isinstance(residual, CodedResidual):
            if (residual.rows, residual.numel) != tuple(x.shape) or residual.device != x.device:
                raise ValueError(f"residual must decode to the input's shape {tuple(x.shape)} on {x.device}, got a "
                                 f"coded residual of ({residual.rows}, {residual.numel}) on {residual.device}")
        elif not isinstance(residual, torch.Tensor) or residual.dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"residual must be a float32 or bfloat16 tensor or a CodedResidual, got "
                             f"{getattr(residual, 'dtype', type(residual).__name__)}")
        elif residual.numel() != x.numel() or not residual.is_contiguous() or residual.device != x.device:
            raise ValueError(f"residual must be a contiguous tensor of {x.numel()} elements on {x.device} (the "
                             f"input's), got {residual.numel()} elements on {residual.device}, "
                             f"contiguous={residual.is_contiguous()}")
        if not is_fraction(beta):
            raise ValueError(f"beta={beta!r} is invalid for error feedback; allowed: a number in [0, 1)")
        return self._encode_rows_feedback(x, residual, float(beta), seed, offset)

    def decode_add_rows(self, wire: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out += decode_rows(wire)``: each decoded value added to ``out``'s in fp32 and rounded once to
        ``out``'s dtype (a weight-difference scheme's reference update). Returns ``out``.

        Args:
            wire: ``[R, wire_bytes(n)]`` ``uint8`` from :meth:`encode_rows` (or :meth:`encode_difference_rows`).
            out: contiguous ``[R, n]`` floating tensor, updated in place.
        """
        valid = isinstance(out, torch.Tensor) and out.dim() == 2 and out.dtype in FLOAT_DTYPES
        if not valid or not out.is_contiguous():
            raise ValueError(f"out must be a contiguous 2-D floating tensor, got {_describe(out)}")
        self._check_wire_rows(wire, out.shape[1])
        if wire.shape[0] != out.shape[0]:
            raise ValueError(f"wire has {wire.shape[0]} rows but out has {out.shape[0]}; they must match")
        return self._decode_add_rows(wire, out)

    def decode_sum(
        self, wire: torch.Tensor, numel: int, *, out: torch.Tensor | None = None, divisor: int = 1
    ) -> torch.Tensor:
        """Decode the ``R`` rows of ``wire`` and sum them in fp32: the reduce side of a reduce-scatter.

        Returns a 1-D fp32 tensor of ``numel`` elements. The sum runs over rows in order 0..R-1 so every
        implementation gives the same fp32 result.

        Args:
            out: optional contiguous 1-D floating tensor of ``numel`` elements (the reduce-scatter's output): the
                result, rounded to its dtype, is written there (in one pass by codecs with a fused kernel) and
                ``out`` returned.
            divisor: the fp32 sum is divided by this (the group size of an average; >= 1; one correctly rounded
                fp32 division on every device) before it is returned or rounded into ``out``.
        """
        self._check_wire_rows(wire, numel)
        check_int("divisor", divisor, minimum=1)
        if out is None:
            total = self._decode_sum(wire, numel)
            return total if divisor == 1 else ieee_div(total, divisor)
        if not isinstance(out, torch.Tensor) or out.shape != (numel,) or out.dtype not in FLOAT_DTYPES:
            raise ValueError(f"out must be a 1-D floating tensor of {numel} elements, got {_describe(out)}")
        if not out.is_contiguous():
            raise ValueError(f"out must be contiguous, got strides {out.stride()}")
        return self._decode_sum_into(wire, out, divisor)

    # ------------------------------------------------------ codec-specific
    # Every codec is batched: rows are the hooks, and a 1-D tensor is the one-row case.
    def _encode(self, x: torch.Tensor, seed: int, offset: int) -> torch.Tensor:
        """Encode a validated, non-empty 1-D floating tensor (one row of :meth:`_encode_rows`)."""
        return self._encode_rows(x.reshape(1, -1), seed, offset)[0]

    def _decode(self, wire: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """Decode a validated 1-D wire buffer (one row of :meth:`_decode_rows`)."""
        return self._decode_rows(wire.reshape(1, -1), numel, dtype)[0]

    @abstractmethod
    def _encode_rows(self, x: torch.Tensor, seed: int, offset: int) -> torch.Tensor:
        """Encode a validated ``[R, n]`` tensor; row ``r`` draws its noise at counter ``offset + r * n``."""

    @abstractmethod
    def _decode_rows(self, wire: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """Decode a validated ``[R, wire_bytes(numel)]`` buffer into ``[R, numel]``."""

    def _encode_difference_rows(self, x: torch.Tensor, ref: torch.Tensor, seed: int, offset: int) -> torch.Tensor:
        """Encode ``x - ref`` of validated ``[R, n]`` tensors; this default materializes the fp32 difference."""
        return self._encode_rows(x.to(torch.float32) - ref.to(torch.float32), seed, offset)

    def _encode_rows_feedback(self, x: torch.Tensor, residual: torch.Tensor | CodedResidual, beta: float, seed: int,
                              offset: int) -> torch.Tensor:  # fmt: skip
        """:meth:`encode_rows_feedback` of validated arguments; this default is the reference: it materializes ``c``,
        the decode and the error in fp32."""
        rows, n = x.shape
        coded = isinstance(residual, CodedResidual)
        r = residual.decode() if coded else residual.view(rows, n)
        c = x.to(torch.float32) + r
        wire = self.encode_rows(c, seed, offset)
        fresh = c.sub_(self.decode_rows(wire, n, torch.float32))
        fresh.sub_((fresh - r).mul_(beta))
        fresh.masked_fill_(~torch.isfinite(fresh), 0.0)
        if coded:
            residual.store(fresh)
        else:
            r.copy_(fresh)
        return wire

    def _decode_rows_into(self, wire: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Decode a validated wire into the validated ``out``; this default decodes, then copies."""
        return out.copy_(self._decode_rows(wire, out.shape[1], out.dtype))

    def _decode_sum_into(self, wire: torch.Tensor, out: torch.Tensor, divisor: int) -> torch.Tensor:
        """:meth:`decode_sum` into a validated ``out``; this default sums, divides (one IEEE division on every
        device, as the fused kernels divide) and copies."""
        total = self._decode_sum(wire, out.numel())
        return out.copy_(total if divisor == 1 else ieee_div(total, divisor))

    def _decode_add_rows(self, wire: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out += `` the fp32 decode of a validated wire; this default materializes the decode."""
        return out.add_(self._decode_rows(wire, out.shape[1], torch.float32))

    def _decode_sum(self, wire: torch.Tensor, numel: int) -> torch.Tensor:
        """Sum the fp32 decodes of the rows of a validated buffer, in row order starting from +0.0."""
        acc = torch.zeros(numel, dtype=torch.float32, device=wire.device)
        for r in range(wire.shape[0]):
            acc += self._decode(wire[r], numel, torch.float32)
        return acc

    # ---------------------------------------------------------- validation
    def _check_input(self, x: torch.Tensor) -> None:
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{self.name} codec expects a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in FLOAT_DTYPES:
            raise ValueError(
                f"{self.name} codec cannot encode dtype {x.dtype}; allowed: float32, bfloat16, float16"
            )
        if x.numel() == 0:
            raise ValueError(f"{self.name} codec cannot encode an empty tensor (shape {tuple(x.shape)})")

    def _check_rows_input(self, x: torch.Tensor, seed: int, offset: int) -> None:
        """Validate the arguments of :meth:`encode_rows`."""
        self._check_input(x)
        if x.dim() != 2:
            raise ValueError(f"encode_rows expects a 2-D [rows, n] tensor, got shape {tuple(x.shape)}")
        self._check_seed(seed, offset)

    @staticmethod
    def _check_seed(seed: int, offset: int) -> None:
        check_noise_key(seed)
        check_int("offset", offset)

    def _check_dtype(self, dtype: torch.dtype) -> None:
        if dtype not in FLOAT_DTYPES:
            raise ValueError(f"cannot decode to dtype {dtype}; allowed: float32, bfloat16, float16")

    def _check_numel(self, numel: int) -> None:
        check_int("numel", numel, minimum=1)

    def _check_wire(self, wire: torch.Tensor, numel: int) -> None:
        self._check_numel(numel)
        if not isinstance(wire, torch.Tensor) or wire.dtype != torch.uint8 or wire.dim() != 1:
            raise ValueError(f"{self.name} wire must be a 1-D torch.uint8 tensor, got {_describe(wire)}")
        expected = self.wire_bytes(numel)
        if wire.numel() != expected:
            raise ValueError(
                f"{self.name} wire has {wire.numel()} bytes but numel={numel} needs exactly {expected} bytes "
                f"(bits={self.bits}, bucket_size={self.bucket_size})"
            )

    def _check_wire_rows(self, wire: torch.Tensor, numel: int) -> None:
        self._check_numel(numel)
        if not isinstance(wire, torch.Tensor) or wire.dtype != torch.uint8 or wire.dim() != 2:
            raise ValueError(f"{self.name} row wire must be a 2-D torch.uint8 tensor, got {_describe(wire)}")
        expected = self.wire_bytes(numel)
        if wire.shape[1] != expected:
            raise ValueError(
                f"{self.name} row wire has {wire.shape[1]} bytes per row but numel={numel} needs exactly "
                f"{expected} (bits={self.bits}, bucket_size={self.bucket_size})"
            )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(bits={self.bits}, bucket_size={self.bucket_size})"


def _describe(t: object) -> str:
    if isinstance(t, torch.Tensor):
        return f"dtype {t.dtype} with shape {tuple(t.shape)}"
    return type(t).__name__
