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
stdout and, when ``$OUT`` is set, to ``$OUT/bench_kernels.md`` with the raw rows in ``$OUT/bench_kernels.json``.

Usage::

    python benchmarks/bench_kernels.py            # full table, < 4 minutes on one H100
    python benchmarks/bench_kernels.py --quick    # smoke check: 16M bf16, 8 and 4 bits
    python benchmarks/bench_kernels.py --sweep    # launch-configuration sweep at 64M bf16 (tuning data)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

from composer_qsdp.kernels import backend
from composer_qsdp.kernels import minmax as kernels
from composer_qsdp.quant.minmax import MinMaxCodec

MI = 2**20
DEVICE = "cuda"
REDUCE_ROWS = 8
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float32: "fp32"}


def _git_revision() -> str:
    if os.environ.get("GIT_REV"):
        return os.environ["GIT_REV"]
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                             cwd=Path(__file__).resolve().parent).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "composer_qsdp", "benchmarks"], capture_output=True,
                               text=True, cwd=Path(__file__).resolve().parent).stdout.strip()  # fmt: skip
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (set GIT_REV)"


def _header(command: str) -> dict[str, str]:
    props = torch.cuda.get_device_properties(0)
    return {
        "device": f"{props.name} ({props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB, "
        f"L2 {props.L2_cache_size / MI:.0f} MiB)",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "git": _git_revision(),
        "command": command,
    }


def _ms(fn: Callable[[], object]) -> float:
    return do_bench(fn, warmup=10, rep=50, return_mode="median")


def _ms_twice(fn: Callable[[], object]) -> tuple[float, float]:
    """(the faster of two medians, their difference in % of it): a difference between versions smaller than
    that spread is noise (the first H100 run had isolated 2-3x slow medians)."""
    first, second = _ms(fn), _ms(fn)
    return min(first, second), 100 * abs(first - second) / min(first, second)


def _gbps(nbytes: int, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9


def _measure(rows: list[dict], size: int, dtype: torch.dtype, bits_list: tuple[int, ...], bucket: int,
             eager_bits: int, copy_gbps: float) -> None:  # fmt: skip
    """Append one row per codec call for ``size`` elements of ``dtype``."""
    x = torch.randn(1, size, device=DEVICE, dtype=dtype)
    in_bytes = size * x.element_size()

    def record(op: str, bits: int, rounding: str, nbytes: int, fn: Callable[[], object], eager: bool) -> None:
        ms, spread = _ms_twice(fn)
        row = {"elements": size, "dtype": DTYPE_NAMES[dtype], "op": op, "bits": bits, "rounding": rounding,
               "bytes": nbytes, "ms": ms, "spread_pct": spread, "gbps": _gbps(nbytes, ms),
               "pct_copy": 100 * _gbps(nbytes, ms) / copy_gbps, "eager_ms": None, "eager_gbps": None}  # fmt: skip
        if eager:
            with backend("torch"):
                row["eager_ms"] = _ms(fn)
            row["eager_gbps"] = _gbps(nbytes, row["eager_ms"])
        rows.append(row)
        print(f"  {row['dtype']} {size // MI}M {op:<26} {bits}b {rounding:<10} {ms * 1e3:9.1f} us "
              f"{row['gbps']:7.0f} GB/s {row['pct_copy']:5.1f}% of copy", flush=True)  # fmt: skip

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


def _copy_gbps(size: int, dtype: torch.dtype) -> float:
    src = torch.randn(size, device=DEVICE, dtype=dtype)
    dst = torch.empty_like(src)
    return _gbps(2 * src.numel() * src.element_size(), _ms(lambda: dst.copy_(src)))


def _table(rows: list[dict], copies: dict[str, float]) -> str:
    lines = [
        "| elements | dtype | op | bits | rounding | Triton us | spread % | Triton GB/s | % of copy | eager us | "
        "eager GB/s | speedup |",
        "|---:|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        eager = (f"{r['eager_ms'] * 1e3:.0f} | {r['eager_gbps']:.0f} | {r['eager_ms'] / r['ms']:.1f}x"
                 if r["eager_ms"] is not None else "- | - | -")  # fmt: skip
        lines.append(f"| {r['elements'] // MI}M | {r['dtype']} | {r['op']} | {r['bits']} | {r['rounding']} | "
                     f"{r['ms'] * 1e3:.1f} | {r['spread_pct']:.0f} | {r['gbps']:.0f} | {r['pct_copy']:.1f} | "
                     f"{eager} |")  # fmt: skip
    lines.append("")
    lines.append("Copy (read + write) GB/s: " + ", ".join(f"{k}: {v:.0f}" for k, v in copies.items()))
    return "\n".join(lines)


def _sweep(bucket: int) -> str:
    """GB/s of 8- and 4-bit quantize/dequantize at 64M bf16 over buckets per program x warps."""
    size, dtype = 64 * MI, torch.bfloat16
    x = torch.randn(1, size, device=DEVICE, dtype=dtype)
    copy = _copy_gbps(size, dtype)
    tile = triton.next_power_of_2(-(-bucket // 8)) * 8
    _, default_bpp, default_warps = kernels._config(bucket, -(-size // bucket), True, True, None, None)
    lines = [f"Launch sweep, {size // MI}M bf16, bucket {bucket}, stochastic rounding (copy {copy:.0f} GB/s); "
             f"default launch: {default_bpp} buckets/program, {default_warps} warps", "",
             "| bits | buckets/program | warps | elements/thread | quantize GB/s | dequantize GB/s |",
             "|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for bits in (8, 4):
        codec = MinMaxCodec(bits=bits, bucket_size=bucket)
        layout = codec.layout(size)
        wire = codec.encode_rows(x, seed=1)
        nbytes = wire.numel() + size * 2
        for bpp in (1, 2, 4, 8, 16):
            for warps in (1, 2, 4, 8, 16):
                per_thread = bpp * tile // (32 * warps)
                if per_thread not in (8, 16, 32, 64):
                    continue
                launch = {"buckets_per_program": bpp, "num_warps": warps}
                q = _ms(lambda: kernels.encode_rows(x, bits, bucket, layout, True, 1, 0, **launch))
                d = _ms(lambda: kernels.decode_rows(wire, bits, bucket, layout, dtype, **launch))
                lines.append(f"| {bits} | {bpp} | {warps} | {per_thread} | {_gbps(nbytes, q):.0f} | "
                             f"{_gbps(nbytes, d):.0f} |")  # fmt: skip
                print(lines[-1], flush=True)
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke check: 16M bf16, 8 and 4 bits")
    parser.add_argument("--sweep", action="store_true", help="only the launch-configuration sweep at 64M bf16")
    parser.add_argument("--bucket-size", type=int, default=1024, help="elements per bucket (default 1024)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_kernels.py needs a CUDA GPU", file=sys.stderr)
        return 2

    header = _header("python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]))
    text = "\n".join(f"- {k}: {v}" for k, v in header.items()) + "\n\n"
    rows: list[dict] = []
    copies: dict[str, float] = {}
    if args.sweep:
        text += _sweep(args.bucket_size)
    else:
        sizes = (16 * MI,) if args.quick else (16 * MI, 64 * MI, 256 * MI)
        dtypes = (torch.bfloat16,) if args.quick else (torch.bfloat16, torch.float32)
        bits_list = (8, 4) if args.quick else (8, 4, 2)
        for size in sizes:
            for dtype in dtypes:
                copy = _copy_gbps(size, dtype)
                copies[f"{size // MI}M {DTYPE_NAMES[dtype]}"] = copy
                print(f"{size // MI}M {DTYPE_NAMES[dtype]}: copy {copy:.0f} GB/s", flush=True)
                _measure(rows, size, dtype, bits_list, args.bucket_size, eager_bits=4, copy_gbps=copy)
                torch.cuda.empty_cache()
        text += f"Min-max codec, bucket {args.bucket_size}, fp32 metadata.\n\n" + _table(rows, copies)
    print("\n" + text)
    if os.environ.get("OUT"):
        out = Path(os.environ["OUT"])
        out.mkdir(parents=True, exist_ok=True)
        name = "bench_kernels_sweep" if args.sweep else "bench_kernels"
        (out / f"{name}.md").write_text(text + "\n")
        (out / f"{name}.json").write_text(json.dumps({"header": header, "copy_gbps": copies, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
