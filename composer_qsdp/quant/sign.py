"""1-bit sign quantizer with an L2-norm scale (1-bit Adam / 0/1 Adam's compressor).

Per bucket of ``bucket_size`` elements (the last bucket may be partial; ``d`` counts its elements)::

    scale   = sqrt(sum(x * x) / d)       # fp32: ||x||_2 / sqrt(d), the bucket's root mean square
    code    = 1 if x >= 0 else 0         # 0 (and -0) maps to +1, as in DeepSpeed
    decoded = scale * (2 * code - 1)     # +scale or -scale

This is the compressor of 0/1 Adam (Lu et al., ICLR 2023) and 1-bit Adam as DeepSpeed implements it
(``deepspeed/runtime/comm/nccl.py``, ``compressed_allreduce``: ``scale = norm(x) / sqrt(numel)``, signs packed
8 to a byte). It is biased: it keeps only the direction of each element, so it is meant to be used with error
feedback (:func:`composer_qsdp.comm.compressed_all_reduce`), which carries what one call drops into the next.
The scale preserves each bucket's L2 norm: ``||decoded|| = ||x||``.

Wire (:mod:`composer_qsdp.quant.wire`): the sign bits packed 8 to a byte bucket by bucket, then one fp32 scale
per bucket (``1 + 32 / bucket_size`` bits per element; 1.016 with the default buckets of 2048).

Non-finite input: a NaN or an infinity makes its bucket's sum of squares, hence its scale, non-finite, so every
element of that bucket decodes to NaN or an infinity; finite buckets are unaffected. A bucket of finite values
whose squares overflow fp32 (``|x|`` beyond about ``1.8e19``) also gets an infinite scale: never finite garbage.

On CUDA tensors (see :mod:`composer_qsdp.kernels.dispatch`) ``encode_rows``/``decode_rows``/``decode_sum`` run the
Triton kernels of :mod:`composer_qsdp.kernels.sign` when ``bucket_size`` is a multiple of 8 up to 8192, else this
torch reference. The kernels write the same codes and decode bit for bit as this reference; their scales may
differ in the last bits (another order of the sum of squares), which no rank ever notices: all decode the same
wire.
"""

from __future__ import annotations

from types import ModuleType

import torch

from composer_qsdp.kernels import WireFormat, aligned_rows, bucket_wire_format, use_triton
from composer_qsdp.quant.codec import Codec, check_bits, sum_rows_in_order
from composer_qsdp.quant.wire import assemble_rows, pack_rows, read_meta, unpack_rows

__all__ = ["SignCodec"]


class SignCodec(Codec):
    """Bucketed 1-bit sign quantizer with scale ``||x||_2 / sqrt(d)`` (see the module docstring).

    Deterministic (the seed is ignored) and biased: pair it with error feedback.

    Args:
        bits: bits per code; only 1 (accepted so that ``make_codec("sign", bits=1)`` reads like the others).
        bucket_size: elements per bucket (>= 1); one fp32 scale per bucket.

    Raises:
        ValueError: ``bits`` other than 1, or an invalid ``bucket_size``.
    """

    name = "sign"

    def __init__(self, bits: int = 1, bucket_size: int = 2048) -> None:
        if bits != 1 or isinstance(bits, bool):
            raise ValueError(f"bits={bits!r} is not supported: the sign codec sends one bit per element; allowed: 1")
        super().__init__(check_bits(bits, (1,)), bucket_size)

    def wire_format(self, numel: int) -> WireFormat:
        """Wire format of ``numel`` elements."""
        self._check_numel(numel)
        return bucket_wire_format(numel, self.bucket_size, 1, meta_words=self.num_buckets(numel))

    def wire_bytes(self, numel: int) -> int:
        return self.wire_format(numel).wire_bytes

    def _kernels(self, tensor: torch.Tensor) -> ModuleType | None:
        """The kernel module when ``tensor`` should take the Triton path and a kernel covers this bucket size."""
        if not use_triton(tensor):
            return None
        from composer_qsdp.kernels import sign as kernels

        return kernels if kernels.supports(self.bucket_size) else None

    def _encode_rows(self, x: torch.Tensor, seed: int, offset: int) -> torch.Tensor:
        fmt = self.wire_format(x.shape[1])
        kernels = self._kernels(x)
        if kernels is not None:
            return kernels.encode_rows(x, self.bucket_size, fmt.wire_bytes, fmt.code_bytes, fmt.meta_offset)
        return self._encode_rows_reference(x, fmt)

    def _encode_rows_reference(self, x: torch.Tensor, fmt: WireFormat) -> torch.Tensor:
        rows, n = x.shape
        bsz, nb = self.bucket_size, fmt.num_buckets
        # Zero padding adds nothing to a bucket's sum of squares; `d` below counts only real elements.
        xb = torch.nn.functional.pad(x.to(torch.float32), (0, nb * bsz - n)).view(rows, nb, bsz)
        counts = torch.full((nb,), float(bsz), device=x.device)
        counts[-1] = fmt.last_bucket
        scale = torch.sqrt(xb.square().sum(dim=2) / counts)
        codes = (xb >= 0).view(rows, nb * bsz)
        codes[:, n:] = False  # pack_rows wants zero codes past the row's end
        return assemble_rows(pack_rows(codes, fmt, 1), scale, fmt)

    def _decode_rows(self, wire: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        fmt = self.wire_format(numel)
        kernels = self._kernels(wire)
        if kernels is not None:
            return kernels.decode_rows(aligned_rows(wire), self.bucket_size, numel, fmt.meta_offset, dtype)
        return self._decode_rows_fp32(wire, fmt).to(dtype)

    def _decode_sum(self, wire: torch.Tensor, numel: int) -> torch.Tensor:
        fmt = self.wire_format(numel)
        kernels = self._kernels(wire)
        if kernels is not None:
            return kernels.decode_sum(aligned_rows(wire), self.bucket_size, numel, fmt.meta_offset)
        return sum_rows_in_order(self._decode_rows_fp32(wire, fmt))

    def _decode_rows_fp32(self, wire: torch.Tensor, fmt: WireFormat) -> torch.Tensor:
        rows = wire.shape[0]
        signs = unpack_rows(wire, fmt, 1, self.bucket_size).to(torch.float32) * 2 - 1  # exactly +-1
        decoded = signs * read_meta(wire, fmt).unsqueeze(2)
        return decoded.view(rows, -1)[:, : fmt.numel]
