"""Min-max codec kernels on a CUDA GPU: achieved bandwidth against a device-to-device copy and eager PyTorch.

For 16M, 64M and 256M elements of bf16 and fp32 it times, with ``triton.testing.do_bench`` (median; do_bench
clears the L2 cache before every timed call, so even the 16M inputs come from HBM):

* quantize (``MinMaxCodec.encode_rows`` on one row): 8/4/2 bits, stochastic and nearest rounding, plus 4-bit
  stochastic at an unaligned counter offset (two Philox calls per 8 elements instead of one);
* dequantize (``decode_rows`` to the input dtype);
* decode_sum of 8 rows of ``n / 8`` elements into fp32 (the reduce side of an 8-way reduce-scatter);
* a device-to-device copy of the input (``dst.copy_(src)``), measured in the same run: the roof;
* the eager PyTorch reference of the same codec call (4-bit only, to bound the run time).

Bandwidth counts the bytes each call must read plus write (input, wire, output). Each Triton call is timed
twice; the table shows the faster median and the two medians' difference ("spread", % of the faster). The
markdown table goes to
stdout and, with ``--out-dir DIR``, to ``DIR/bench_kernels.md`` with the raw rows in ``DIR/bench_kernels.json``.

With ``--learned`` it times instead the learned-levels codec's kernels against the min-max codec's in the same
run, at the same bits (8 and 4, stochastic rounding) and bucket size, for 16M and 64M elements of bf16 and fp32:
quantize, dequantize and decode_sum of each, the learned codec's levels fitted to the input beforehand. Its table
(``DIR/bench_kernels_learned.{md,json}``) puts the two side by side with the ratio learned / min-max, and the
eager PyTorch learned codec at 4 bits.

Usage::

    python benchmarks/bench_kernels.py            # full table, < 4 minutes on one H100
    python benchmarks/bench_kernels.py --quick    # smoke check: 16M bf16, 8 and 4 bits
    python benchmarks/bench_kernels.py --sweep    # launch-configuration sweep at 64M bf16 (tuning data)
    python benchmarks/bench_kernels.py --learned  # learned-levels vs min-max kernels (~1 minute)
"""

from __future__ import annotations

import sys

import torch
import triton

import kernel_timing as timing
from composer_qsdp.kernels import minmax as kernels
from composer_qsdp.quant.learned import LearnedLevelsCodec
from composer_qsdp.quant.minmax import MinMaxCodec
from kernel_timing import MI, REDUCE_ROWS


def _measure(record: timing.Recorder, bits_list: tuple[int, ...], bucket: int, eager_bits: int) -> None:
    """Record one row per codec call on ``record``'s input size and dtype."""
    size, dtype = record.size, record.dtype
    x = torch.randn(1, size, device=timing.DEVICE, dtype=dtype)
    in_bytes = size * x.element_size()
    for bits in bits_list:
        for rounding in ("stochastic", "nearest"):
            codec = MinMaxCodec(bits=bits, bucket_size=bucket, rounding=rounding)
            wire_bytes = codec.wire_bytes(size)
            eager = bits == eager_bits
            record("quantize", bits, rounding, in_bytes + wire_bytes, lambda: codec.encode_rows(x, seed=1), eager)
            if rounding == "stochastic" and bits == eager_bits:
                record("quantize (unaligned counters)", bits, rounding, in_bytes + wire_bytes,
                       lambda: codec.encode_rows(x, seed=1, offset=1), False)  # fmt: skip
        codec = MinMaxCodec(bits=bits, bucket_size=bucket)
        wire = codec.encode_rows(x, seed=1)
        record("dequantize", bits, "-", wire.numel() + in_bytes, lambda: codec.decode_rows(wire, size, dtype),
               bits == eager_bits)  # fmt: skip
        chunk = size // REDUCE_ROWS
        wires = codec.encode_rows(x.view(REDUCE_ROWS, chunk), seed=2)
        record(f"decode_sum ({REDUCE_ROWS} rows)", bits, "-", wires.numel() + 4 * chunk,
               lambda: codec.decode_sum(wires, chunk), bits == eager_bits)  # fmt: skip


#: The codecs of ``--learned``, in the order of their rows.
COMPARED = ("min-max", "learned")


def _measure_learned(record: timing.Recorder, bits_list: tuple[int, ...], bucket: int) -> None:
    """Record a min-max row then a learned-levels row per codec call, at each of ``bits_list``; the op names start
    with the codec's name (:data:`COMPARED`)."""
    size, dtype = record.size, record.dtype
    x = torch.randn(1, size, device=timing.DEVICE, dtype=dtype)
    in_bytes = size * x.element_size()
    chunk = size // REDUCE_ROWS
    for bits in bits_list:
        learned = LearnedLevelsCodec(bits=bits, bucket_size=bucket)
        learned.fit(x)  # outside the timed calls: a fit runs once per refresh_every seeds
        for name, codec in zip(COMPARED, (MinMaxCodec(bits=bits, bucket_size=bucket), learned)):
            eager = name == "learned" and bits == 4
            wire = codec.encode_rows(x, seed=1)
            record(f"{name} quantize", bits, "stochastic", in_bytes + wire.numel(),
                   lambda: codec.encode_rows(x, seed=1), eager)  # fmt: skip
            record(f"{name} dequantize", bits, "-", wire.numel() + in_bytes,
                   lambda: codec.decode_rows(wire, size, dtype), eager)  # fmt: skip
            wires = codec.encode_rows(x.view(REDUCE_ROWS, chunk), seed=2)
            record(f"{name} decode_sum ({REDUCE_ROWS} rows)", bits, "-", wires.numel() + 4 * chunk,
                   lambda: codec.decode_sum(wires, chunk), eager)  # fmt: skip


def _learned_table(rows: list[timing.Row], copies: dict[str, float]) -> str:
    """Markdown table pairing each learned-levels row with the min-max row of the same call."""
    minmax = {(r["elements"], r["dtype"], r["op"].removeprefix("min-max "), r["bits"]): r for r in rows
              if r["op"].startswith("min-max ")}  # fmt: skip
    lines = ["| elements | dtype | op | bits | min-max us | learned us | learned / min-max | learned GB/s | "
             "learned % of copy | eager learned us | speedup over eager |",
             "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        if not r["op"].startswith("learned "):
            continue
        op = r["op"].removeprefix("learned ")
        base = minmax[(r["elements"], r["dtype"], op, r["bits"])]
        eager = (f"{r['eager_ms'] * 1e3:.0f} | {r['eager_ms'] / r['ms']:.1f}x" if r["eager_ms"] is not None
                 else "- | -")  # fmt: skip
        lines.append(f"| {r['elements'] // MI}M | {r['dtype']} | {op} | {r['bits']} | {base['ms'] * 1e3:.1f} | "
                     f"{r['ms'] * 1e3:.1f} | **{r['ms'] / base['ms']:.2f}x** | {r['gbps']:.0f} | "
                     f"{r['pct_copy']:.1f} | {eager} |")  # fmt: skip
    lines.append("")
    lines.append("Copy (read + write) GB/s: " + ", ".join(f"{k}: {v:.0f}" for k, v in copies.items()))
    return "\n".join(lines)


def _sweep(bucket: int) -> str:
    """GB/s of 8- and 4-bit quantize/dequantize at 64M bf16 over buckets per program x warps."""
    size, dtype = 64 * MI, torch.bfloat16
    x = torch.randn(1, size, device=timing.DEVICE, dtype=dtype)
    copy = timing.copy_gbps(size, dtype)
    tile = triton.next_power_of_2(-(-bucket // 8)) * 8
    _, default_bpp, default_warps = kernels._config(bucket, -(-size // bucket), True, True, None, None)
    lines = [f"Launch sweep, {size // MI}M bf16, bucket {bucket}, stochastic rounding (copy {copy:.0f} GB/s); "
             f"default launch: {default_bpp} buckets/program, {default_warps} warps", "",
             "| bits | buckets/program | warps | elements/thread | quantize GB/s | dequantize GB/s |",
             "|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for bits in (8, 4):
        codec = MinMaxCodec(bits=bits, bucket_size=bucket)
        fmt = codec.wire_format(size)
        wire = codec.encode_rows(x, seed=1)
        nbytes = wire.numel() + size * 2
        for bpp in (1, 2, 4, 8, 16):
            for warps in (1, 2, 4, 8, 16):
                per_thread = bpp * tile // (32 * warps)
                if per_thread not in (8, 16, 32, 64):
                    continue
                launch = {"buckets_per_program": bpp, "num_warps": warps}
                q = timing.median_ms(lambda: kernels.encode_rows(x, bits, bucket, fmt, True, 1, 0, **launch))
                d = timing.median_ms(lambda: kernels.decode_rows(wire, bits, bucket, fmt, dtype, **launch))
                lines.append(f"| {bits} | {bpp} | {warps} | {per_thread} | {timing.gbps(nbytes, q):.0f} | "
                             f"{timing.gbps(nbytes, d):.0f} |")  # fmt: skip
                print(lines[-1], flush=True)
    return "\n".join(lines)


def main() -> int:
    parser = timing.arg_parser(__doc__, bucket_size=1024)
    parser.add_argument("--sweep", action="store_true", help="only the launch-configuration sweep at 64M bf16")
    parser.add_argument("--learned", action="store_true",
                        help="learned-levels vs min-max kernels, 16M and 64M, bf16 and fp32, 8 and 4 bits")  # fmt: skip
    args = parser.parse_args()
    if timing.cuda_missing():
        return 2

    header = timing.header()
    text = timing.header_text(header)
    rows: list[timing.Row] = []
    copies: dict[str, float] = {}
    if args.sweep:
        text += _sweep(args.bucket_size)
    elif args.learned:
        rows, copies = timing.measure_grid(
            args.quick, lambda record, bits_list: _measure_learned(record, bits_list, args.bucket_size),
            sizes=(16 * MI, 64 * MI), bits_list=(8, 4))  # fmt: skip
        text += (f"Learned-levels vs min-max codec kernels, bucket {args.bucket_size}, stochastic rounding, "
                 f"the same bits.\n\n" + _learned_table(rows, copies))  # fmt: skip
    else:
        rows, copies = timing.measure_grid(
            args.quick, lambda record, bits_list: _measure(record, bits_list, args.bucket_size, eager_bits=4))
        text += f"Min-max codec, bucket {args.bucket_size}, fp32 metadata.\n\n" + timing.table(rows, copies)
    print("\n" + text)
    name = "bench_kernels_sweep" if args.sweep else "bench_kernels_learned" if args.learned else "bench_kernels"
    timing.write_out(args.out_dir, name, text, {"header": header, "copy_gbps": copies, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
