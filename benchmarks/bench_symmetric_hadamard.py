"""Symmetric abs-max codec kernels and the Walsh-Hadamard kernel on a CUDA GPU: achieved bandwidth against a
device-to-device copy and eager PyTorch.

Same harness, timing, table and output conventions as ``bench_kernels.py`` (both use ``kernel_timing.py``:
header, ``do_bench`` median, copy roof; ``--out-dir DIR``: ``DIR/bench_symmetric_hadamard.{md,json}``). For
16M, 64M and 256M elements of bf16 and fp32:

* quantize (``SymmetricCodec.encode_rows`` on one row), dequantize (``decode_rows`` to the input dtype) and
  decode_sum of 8 rows of ``n / 8`` elements into fp32, at 8/4/2 bits;
* the Hadamard rotation alone (``hadamard_rows`` to fp32) at orders 32, 128 and 1024;
* rotated 4-bit quantize, dequantize and decode_sum end to end (``make_codec("symmetric", hadamard=True)``: the
  codec's kernels apply the rotation in registers, one pass over memory) at the same bucket size;
* the eager PyTorch reference of the 4-bit calls.

Usage::

    python benchmarks/bench_symmetric_hadamard.py            # full table (a few minutes on one H100)
    python benchmarks/bench_symmetric_hadamard.py --quick    # smoke check: 16M bf16
    python benchmarks/bench_symmetric_hadamard.py --sweep    # launch sweep of the rotated 4-bit kernels (tuning)
"""

from __future__ import annotations

import sys

import torch

import kernel_timing as timing
from composer_qsdp.kernels import symmetric as kernels
from composer_qsdp.quant import make_codec
from composer_qsdp.quant.hadamard import hadamard_rows
from kernel_timing import MI, REDUCE_ROWS

#: The rounding column of every row: the symmetric codec's kernels round to nearest.
NEAREST = "nearest"


def _measure(record: timing.Recorder, bits_list: tuple[int, ...], bucket: int) -> None:
    """Record one row per codec and Hadamard call on ``record``'s input size and dtype."""
    size, dtype = record.size, record.dtype
    x = torch.randn(1, size, device=timing.DEVICE, dtype=dtype)
    in_bytes = size * x.element_size()
    for bits in bits_list:
        codec = make_codec("symmetric", bits=bits, bucket_size=bucket)
        wire = codec.encode_rows(x)
        record("quantize", bits, NEAREST, in_bytes + wire.numel(), lambda: codec.encode_rows(x), bits == 4)
        record("dequantize", bits, NEAREST, wire.numel() + in_bytes, lambda: codec.decode_rows(wire, size, dtype),
               bits == 4)  # fmt: skip
        chunk = size // REDUCE_ROWS
        wires = codec.encode_rows(x.view(REDUCE_ROWS, chunk))
        record(f"decode_sum ({REDUCE_ROWS} rows)", bits, NEAREST, wires.numel() + 4 * chunk,
               lambda: codec.decode_sum(wires, chunk), bits == 4)  # fmt: skip
    for order in (32, 128, 1024):
        record(f"hadamard order {order}", "-", NEAREST, in_bytes + 4 * size,
               lambda: hadamard_rows(x, order, size, torch.float32), order == 128)  # fmt: skip
    rotated = make_codec("symmetric", bits=4, bucket_size=bucket, hadamard=True)
    wire = rotated.encode_rows(x)
    record("hadamard + quantize", 4, NEAREST, in_bytes + wire.numel(), lambda: rotated.encode_rows(x), False)
    record("dequantize + hadamard", 4, NEAREST, wire.numel() + in_bytes, lambda: rotated.decode_rows(wire, size, dtype),
           False)  # fmt: skip
    chunk = size // REDUCE_ROWS
    wires = rotated.encode_rows(x.view(REDUCE_ROWS, chunk))
    record(f"decode_sum + hadamard ({REDUCE_ROWS} rows)", 4, NEAREST, wires.numel() + 4 * chunk,
           lambda: rotated.decode_sum(wires, chunk), False)  # fmt: skip


def _sweep() -> str:
    """GB/s of the rotated 4-bit quantize and dequantize at 64M elements over buckets per program x warps, for
    Hadamard orders (= buckets) 128 and 2048, bf16 and fp32, beside the default launch."""
    size, bits = 64 * MI, 4
    lines = ["Launch sweep of the fused Hadamard + 4-bit symmetric kernels, 64M elements", "",
             "| dtype | bucket | buckets/program | warps | default | quantize GB/s | dequantize GB/s | % of copy (q / dq) |",
             "|---|---:|---:|---:|---|---:|---:|---:|"]  # fmt: skip
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(1, size, device=timing.DEVICE, dtype=dtype)
        copy = timing.copy_gbps(size, dtype)
        for bucket in (128, 2048):
            fmt = make_codec("symmetric", bits=bits, bucket_size=bucket).wire_format(size)
            wire = kernels.encode_rows(x, bits, bucket, fmt, rotate=True)
            nbytes = wire.numel() + size * x.element_size()
            _, default_bpp, default_warps = kernels._config(bits, bucket, 1, fmt, True, True, None, None)
            for bpp in (1, 2, 4, 8, 16):
                for warps in (1, 2, 4, 8, 16):
                    if bpp * bucket // (32 * warps) not in (4, 8, 16, 32, 64, 128):
                        continue
                    launch = {"buckets_per_program": bpp, "num_warps": warps}
                    q = timing.median_ms(lambda: kernels.encode_rows(x, bits, bucket, fmt, True, **launch))
                    d = timing.median_ms(lambda: kernels.decode_rows(wire, bits, bucket, fmt, dtype, True, **launch))
                    qg, dg = timing.gbps(nbytes, q), timing.gbps(nbytes, d)
                    default = "yes" if (bpp, warps) == (default_bpp, default_warps) else ""
                    lines.append(f"| {timing.DTYPE_NAMES[dtype]} | {bucket} | {bpp} | {warps} | {default} | {qg:.0f} | "
                                 f"{dg:.0f} | {100 * qg / copy:.0f} / {100 * dg / copy:.0f} |")  # fmt: skip
                    print(lines[-1], flush=True)
        torch.cuda.empty_cache()
    return "\n".join(lines)


def main() -> int:
    parser = timing.arg_parser(__doc__, bucket_size=2048)
    parser.add_argument("--sweep", action="store_true", help="only the launch sweep of the rotated 4-bit kernels")
    args = parser.parse_args()
    if timing.cuda_missing():
        return 2

    header = timing.header()
    if args.sweep:
        text = timing.header_text(header) + _sweep()
        print("\n" + text)
        timing.write_out(args.out_dir, "bench_symmetric_hadamard_sweep", text, {"header": header})
        return 0
    rows, copies = timing.measure_grid(
        args.quick, lambda record, bits_list: _measure(record, bits_list, args.bucket_size))
    text = timing.header_text(header)
    text += f"Symmetric codec, bucket {args.bucket_size}, fp32 scale per bucket.\n\n" + timing.table(rows, copies)
    print("\n" + text)
    timing.write_out(args.out_dir, "bench_symmetric_hadamard", text, {"header": header, "copy_gbps": copies, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
