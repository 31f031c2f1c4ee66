"""Decode kernels shared by the codecs whose wire is packed codes plus fp32 words of per-bucket metadata (min-max,
learned levels): ``decode_rows`` into any float dtype, and ``decode_sum`` of the rows in fp32, optionally divided
by an integer (a reduce-scatter's average) and rounded into any float dtype.

A codec passes its per-tile decoder, a ``@triton.jit`` function with the signature of ``minmax._decode_tile``
(``(wire_ptr, meta_ptr, row, b, g, lane, e, valid, n, num_buckets, meta_offset, wire_row_stride, BITS, BUCKET, BPP,
GS=8)`` -> fp32 values on the tile of groups of ``GS``), as the constexpr ``DECODE_TILE``: Triton compiles one variant
per decoder, and the loops, stores and launch logic live here once. Tiles are
:func:`composer_qsdp.kernels.groups.split_tile`'s (coalesced stores); outputs go through
:func:`composer_qsdp.kernels.cast.store_cast` (round to nearest even); the sum runs over rows in order from +0.0 and
divides with ``div_rn``, as the codecs' torch references do.

``decode_sum`` can also rotate the sum back (``rotate``): the sum of a ``HadamardCodec``'s rotated rows, each bucket
multiplied by the normalized Walsh-Hadamard matrix in registers (the reference's additions in its order) before the
store, in one pass instead of the fp32 sum written, read back and rewritten by ``hadamard_rows``. Buckets of up to
256 elements are tiled as rows of 16 (:func:`composer_qsdp.kernels.hadamard.rotation_rows`), as the min-max feedback
quantize tiles them: a thread decodes one row's code word and sums it, runs the rotation's first stages inside the
row and, after one exchange, the others along a column (:func:`composer_qsdp.kernels.hadamard.butterflies_rows`),
then stores its row. Larger buckets rotate flat (:func:`composer_qsdp.kernels.hadamard.rotated_store`), which moves
the tile through shared memory at every stage that crosses threads.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from composer_qsdp.kernels.cast import emulate_bf16_rne, store_average, store_cast
from composer_qsdp.kernels.groups import (GPU_TILE, INTERPRETER_TILE, cdiv, launch_shape, output_buffer, row_stride,
                                          rows_aligned, split_tile, tile, vec)
from composer_qsdp.kernels.hadamard import butterflies_rows, rotated_store, rotation_rows, rotation_scale
from composer_qsdp.kernels.wire_format import WireFormat, aligned_rows

__all__ = ["BucketDecoder", "ROTATED_ELEMENTS_PER_THREAD", "ROWS_PER_STEP", "rotated_sum_launch"]

#: Elements per thread of a decode-sum that rotates back. Compiled for sm_90 with the flat rotation, the 8-bit sum of 8
#: rows over buckets of 1024 spills at 32 (255 registers) and takes 135 at 16; in rows of 16 (buckets of up to 256) a
#: thread holds one row.
ROTATED_ELEMENTS_PER_THREAD = 16
#: Rows a decode-sum loop step decodes, unrolled: a loop step's loads wait for the previous step's adds, so a program
#: has the codes of ``ROWS_PER_STEP`` rows in flight rather than one.
ROWS_PER_STEP = 4


@triton.jit
def _dequantize_kernel(
    wire_ptr, meta_ptr, out_ptr,
    n, num_buckets, meta_offset, wire_row_stride, out_row_stride,
    DECODE_TILE: tl.constexpr, BITS: tl.constexpr, BUCKET: tl.constexpr, GROUPS: tl.constexpr, BPP: tl.constexpr,
    VEC: tl.constexpr, EMULATE_BF16_RNE: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    b, g, lane, e, valid = split_tile(pid, n, BUCKET, GROUPS, BPP, VEC)
    y = DECODE_TILE(wire_ptr, meta_ptr, row, b, g, lane, e, valid, n, num_buckets, meta_offset, wire_row_stride,
                    BITS, BUCKET, BPP)  # fmt: skip
    store_cast(out_ptr + row * out_row_stride + e, y, valid, EMULATE_BF16_RNE)


@triton.jit
def _dequantize_sum_kernel(
    wire_ptr, meta_ptr, out_ptr,
    n, n_out, num_buckets, meta_offset, wire_row_stride, divisor, scale_rot,
    DECODE_TILE: tl.constexpr, ROWS: tl.constexpr, BITS: tl.constexpr, BUCKET: tl.constexpr, GROUPS: tl.constexpr,
    BPP: tl.constexpr, VEC: tl.constexpr, DIVIDE: tl.constexpr, EMULATE_BF16_RNE: tl.constexpr,
    STEP: tl.constexpr, ROTATE: tl.constexpr, LOG_B: tl.constexpr, LOG_ROW: tl.constexpr = 0,
):  # fmt: skip
    """Sum the decodes of the ``ROWS`` wire rows, ``STEP`` rows per loop step (unrolled); with ``ROTATE`` rotate each
    bucket of the sum back and store its first ``n_out`` columns: as ``GROUPS`` rows of ``2**LOG_ROW`` elements per
    bucket where ``LOG_ROW > 0``, else flat."""
    pid = tl.program_id(0)
    GS: tl.constexpr = (1 << LOG_ROW) if LOG_ROW > 0 else 8
    if ROTATE:  # the rotation rearranges the tile anyway
        b, g, lane, e, valid = tile(pid, n, BUCKET, GROUPS, BPP, VEC, GS)
    else:
        b, g, lane, e, valid = split_tile(pid, n, BUCKET, GROUPS, BPP, VEC)
    acc = tl.zeros(e.shape, tl.float32)
    for first in range(0, ROWS - ROWS % STEP, STEP):  # in row order, like the references
        for k in tl.static_range(STEP):
            acc += DECODE_TILE(wire_ptr, meta_ptr, tl.cast(first + k, tl.int64), b, g, lane, e, valid, n,
                               num_buckets, meta_offset, wire_row_stride, BITS, BUCKET, BPP, GS)  # fmt: skip
    for row in tl.static_range(ROWS - ROWS % STEP, ROWS):
        acc += DECODE_TILE(wire_ptr, meta_ptr, tl.cast(row, tl.int64), b, g, lane, e, valid, n, num_buckets,
                           meta_offset, wire_row_stride, BITS, BUCKET, BPP, GS)  # fmt: skip
    if ROTATE and LOG_ROW > 0:  # an average divides after the rotation back, as the reference does
        v = butterflies_rows(acc, LOG_B - LOG_ROW, LOG_ROW) * scale_rot
        store_average(out_ptr + e, v, valid & (e < n_out), divisor, DIVIDE, EMULATE_BF16_RNE)
    elif ROTATE:
        rotated_store(out_ptr, acc, pid, n_out, BUCKET, LOG_B, scale_rot, EMULATE_BF16_RNE, divisor, DIVIDE)
    else:
        store_average(out_ptr + e, acc, valid, divisor, DIVIDE, EMULATE_BF16_RNE)


class BucketDecoder:
    """The ``decode_rows`` / ``decode_sum`` launchers of one codec's kernels module.

    Args:
        decode_tile: the codec's ``@triton.jit`` tile decoder (module docstring).
        check: ``check(bits, bucket_size, rows, fmt)`` raises ``ValueError`` for a configuration the kernels do
            not cover.
        launch_shape: ``launch_shape(bucket_size, num_buckets, on_gpu, aligned_rows, buckets_per_program,
            num_warps)`` -> ``(GROUPS, buckets per program, warps)``; ``aligned_rows``: the output's rows start on
            16-element boundaries.
    """

    def __init__(self, decode_tile: object, check: Callable[..., None],
                 launch_shape: Callable[..., tuple[int, int, int]]) -> None:  # fmt: skip
        self._decode_tile = decode_tile
        self._check = check
        self._launch_shape = launch_shape

    def decode_rows(self, wire: torch.Tensor, bits: int, bucket_size: int, fmt: WireFormat, dtype: torch.dtype, *,
                    out: torch.Tensor | None = None, buckets_per_program: int | None = None,
                    num_warps: int | None = None) -> torch.Tensor:  # fmt: skip
        """Decode a ``[R, fmt.wire_bytes]`` wire into ``[R, fmt.numel]`` values of ``dtype``: into ``out`` when
        given (that shape and dtype, rows contiguous). ``buckets_per_program`` and ``num_warps`` override the
        launch heuristic for benchmark sweeps; they never change the result."""
        return self._decode(wire, bits, bucket_size, fmt, dtype, False, out, 1, buckets_per_program, num_warps)

    def decode_sum(self, wire: torch.Tensor, bits: int, bucket_size: int, fmt: WireFormat, *,
                   out: torch.Tensor | None = None, divisor: int = 1, rotate: bool = False, numel: int | None = None,
                   buckets_per_program: int | None = None, num_warps: int | None = None,
                   rows_per_step: int | None = None) -> torch.Tensor:  # fmt: skip
        """Sum of the fp32 decodes of the rows of a ``[R, fmt.wire_bytes]`` wire, in row order, divided by
        ``divisor`` in fp32: fp32 ``[numel]``, or rounded into ``out`` (``[numel]``, any float dtype) when given.

        ``rotate``: the sum's buckets (``bucket_size`` a power of two) are rotated back, ``HadamardCodec``'s
        ``decode_sum`` of this codec, and its first ``numel <= fmt.numel`` (default ``fmt.numel``) elements kept,
        each divided by ``divisor`` after the rotation. ``buckets_per_program``, ``num_warps`` and ``rows_per_step``
        (rows a loop step decodes, default :data:`ROWS_PER_STEP`) override the launch for benchmark sweeps, never
        the result.
        """
        numel = fmt.numel if numel is None else numel
        if numel != fmt.numel and not rotate:
            raise ValueError(f"numel={numel} differs from the wire's {fmt.numel} elements without rotate")
        if rotate and (not 0 < numel <= fmt.numel or bucket_size & (bucket_size - 1)):
            raise ValueError(f"a rotated decode_sum needs a power-of-two bucket_size and 0 < numel <= {fmt.numel}; "
                             f"got bucket_size={bucket_size}, numel={numel}")
        if rows_per_step is not None and rows_per_step < 1:
            raise ValueError(f"rows_per_step={rows_per_step} must be >= 1")
        dtype = torch.float32 if out is None else out.dtype
        return self._decode(wire, bits, bucket_size, fmt, dtype, True, out, divisor, buckets_per_program,
                            num_warps, rotate, numel, rows_per_step)  # fmt: skip

    def _decode(self, wire: torch.Tensor, bits: int, bucket_size: int, fmt: WireFormat, dtype: torch.dtype,
                sum_rows: bool, out: torch.Tensor | None, divisor: int, buckets_per_program: int | None,
                num_warps: int | None, rotate: bool = False, numel: int | None = None,
                rows_per_step: int | None = None) -> torch.Tensor:  # fmt: skip
        self._check(bits, bucket_size, wire.shape[0], fmt)
        wire = aligned_rows(wire)
        shape = (fmt.numel if numel is None else numel,) if sum_rows else (wire.shape[0], fmt.numel)
        out = output_buffer(shape, dtype, wire.device, out)
        log_row = 0
        if rotate:
            launch, log_row = rotated_sum_launch(bits, bucket_size, fmt.num_buckets, out.is_cuda, buckets_per_program,
                                                 num_warps)  # fmt: skip
        else:  # the sum's output is one row, which starts aligned
            launch = self._launch_shape(bucket_size, fmt.num_buckets, out.is_cuda, sum_rows or rows_aligned(out),
                                        buckets_per_program, num_warps)  # fmt: skip
        step = min(wire.shape[0], ROWS_PER_STEP if rows_per_step is None else rows_per_step)
        return _launch(wire, fmt, out, sum_rows, self._decode_tile, bits, bucket_size, launch, divisor, rotate, step,
                       log_row)



def rotated_sum_launch(bits: int, bucket_size: int, num_buckets: int, cuda: bool,
                       buckets_per_program: int | None = None,
                       num_warps: int | None = None) -> tuple[tuple[int, int, int], int]:
    """The launch ``(GROUPS, buckets per program, warps)`` and ``LOG_ROW`` of a decode-sum of ``bits``-bit codes that
    rotates ``num_buckets`` buckets of ``bucket_size`` back: a tile row of ``2**LOG_ROW`` elements per thread where
    :func:`~composer_qsdp.kernels.hadamard.rotation_rows` gives rows, else the flat rotation's
    :data:`ROTATED_ELEMENTS_PER_THREAD` (it holds more per element than the sum alone) and ``LOG_ROW`` 0."""
    log_row = rotation_rows(bits, bucket_size)
    launch = launch_shape(bucket_size, num_buckets, cuda, GPU_TILE, INTERPRETER_TILE, ROTATED_ELEMENTS_PER_THREAD,
                          buckets_per_program, num_warps)  # fmt: skip
    return ((bucket_size >> log_row, *launch[1:]) if log_row else launch), log_row


def _launch(wire: torch.Tensor, fmt: WireFormat, out: torch.Tensor, sum_rows: bool, decode_tile: object,
            bits: int, bucket_size: int, launch: tuple[int, int, int], divisor: int, rotate: bool = False,
            step: int = 1, log_row: int = 0) -> torch.Tensor:  # fmt: skip
    """Decode the ``[R, wire_bytes]`` ``wire`` (rows 4-byte aligned) into ``out`` with ``decode_tile``; ``launch``
    is ``(GROUPS, buckets per program, warps)``; a sum is divided by ``divisor`` in fp32, decodes ``step`` rows per
    loop step and, with ``rotate``, is rotated back into the ``out.numel()`` elements of ``out`` (in rows of
    ``2**log_row`` elements where ``log_row > 0``). Returns ``out``."""
    groups, bpp, warps = launch
    nb = fmt.num_buckets
    constants = {"DECODE_TILE": decode_tile, "BITS": bits, "BUCKET": bucket_size, "GROUPS": groups, "BPP": bpp,
                 "VEC": vec(out.dtype), "EMULATE_BF16_RNE": emulate_bf16_rne(), "num_warps": warps,
                 "enable_fp_fusion": False}  # fmt: skip
    meta = wire.view(torch.float32)
    if sum_rows:
        _dequantize_sum_kernel[(cdiv(nb, bpp),)](
            wire, meta, out, fmt.numel, out.numel(), nb, fmt.meta_offset, row_stride(wire), float(divisor),
            rotation_scale(bucket_size) if rotate else 1.0,
            ROWS=wire.shape[0], DIVIDE=divisor != 1, STEP=step, ROTATE=rotate, LOG_B=bucket_size.bit_length() - 1,
            LOG_ROW=log_row,
            **constants,
        )  # fmt: skip
    else:
        _dequantize_kernel[(cdiv(nb, bpp), wire.shape[0])](
            wire, meta, out, fmt.numel, nb, fmt.meta_offset, row_stride(wire), row_stride(out), **constants,
        )  # fmt: skip
    return out
