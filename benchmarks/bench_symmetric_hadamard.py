"""Symmetric abs-max codec kernels and the Walsh-Hadamard kernel on a CUDA GPU: achieved bandwidth against a
device-to-device copy and eager PyTorch.

Same harness, timing, table and output conventions as ``bench_kernels.py`` (whose helpers it imports: header,
``do_bench`` median, copy roof; ``$OUT/bench_symmetric_hadamard.{md,json}`` when ``$OUT`` is set). For 16M,
64M and 256M elements of bf16 and fp32:

* quantize (``SymmetricCodec.encode_rows`` on one row), dequantize (``decode_rows`` to the input dtype) and
  decode_sum of 8 rows of ``n / 8`` elements into fp32, at 8/4/2 bits;
* the Hadamard rotation alone (``hadamard_rows`` to fp32) at orders 32, 128 and 1024;
* rotated 4-bit quantize, dequantize and decode_sum end to end (``make_codec("symmetric", hadamard=True)``: the
  codec's kernels apply the rotation in registers, one pass over memory) at the same bucket size;
* the eager PyTorch reference of the 4-bit calls.

Usage::

    python benchmarks/bench_symmetric_hadamard.py            # full table (a few minutes on one H100)
    python benchmarks/bench_symmetric_hadamard.py --quick    # smoke check: 16M bf16
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from bench_kernels import DTYPE_NAMES, MI, REDUCE_ROWS, _copy_gbps, _gbps, _header, _ms, _ms_twice, _table
from composer_qsdp.kernels import backend
from composer_qsdp.quant import make_codec
from composer_qsdp.quant.hadamard import hadamard_rows

DEVICE = "cuda"


def _measure(rows: list[dict], size: int, dtype: torch.dtype, bits_list: tuple[int, ...], bucket: int,
             copy_gbps: float) -> None:  # fmt: skip
    x = torch.randn(1, size, device=DEVICE, dtype=dtype)
    in_bytes = size * x.element_size()

    def record(op: str, bits: int | str, nbytes: int, fn: Callable[[], object], eager: bool) -> None:
        # Rows in bench_kernels.py's schema, so its table writer formats them.
        ms, spread = _ms_twice(fn)
        row = {"elements": size, "dtype": DTYPE_NAMES[dtype], "op": op, "bits": bits, "rounding": "nearest",
               "bytes": nbytes, "ms": ms, "spread_pct": spread, "gbps": _gbps(nbytes, ms),
               "pct_copy": 100 * _gbps(nbytes, ms) / copy_gbps, "eager_ms": None, "eager_gbps": None}  # fmt: skip
        if eager:
            with backend("torch"):
                row["eager_ms"] = _ms(fn)
            row["eager_gbps"] = _gbps(nbytes, row["eager_ms"])
        rows.append(row)
        print(f"  {row['dtype']} {size // MI}M {op:<28} {bits}b {ms * 1e3:9.1f} us {row['gbps']:7.0f} GB/s "
              f"{row['pct_copy']:5.1f}% of copy", flush=True)  # fmt: skip

    for bits in bits_list:
        codec = make_codec("symmetric", bits=bits, bucket_size=bucket)
        wire = codec.encode_rows(x)
        record("quantize", bits, in_bytes + wire.numel(), lambda: codec.encode_rows(x), bits == 4)
        record("dequantize", bits, wire.numel() + in_bytes, lambda: codec.decode_rows(wire, size, dtype), bits == 4)
        chunk = size // REDUCE_ROWS
        wires = codec.encode_rows(x.view(REDUCE_ROWS, chunk))
        record(f"decode_sum ({REDUCE_ROWS} rows)", bits, wires.numel() + 4 * chunk,
               lambda: codec.decode_sum(wires, chunk), bits == 4)  # fmt: skip
    for order in (32, 128, 1024):
        record(f"hadamard order {order}", "-", in_bytes + 4 * size,
               lambda: hadamard_rows(x, order, size, torch.float32), order == 128)  # fmt: skip
    rotated = make_codec("symmetric", bits=4, bucket_size=bucket, hadamard=True)
    wire = rotated.encode_rows(x)
    record("hadamard + quantize", 4, in_bytes + wire.numel(), lambda: rotated.encode_rows(x), False)
    record("dequantize + hadamard", 4, wire.numel() + in_bytes, lambda: rotated.decode_rows(wire, size, dtype), False)
    chunk = size // REDUCE_ROWS
    wires = rotated.encode_rows(x.view(REDUCE_ROWS, chunk))
    record(f"decode_sum + hadamard ({REDUCE_ROWS} rows)", 4, wires.numel() + 4 * chunk,
           lambda: rotated.decode_sum(wires, chunk), False)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke check: 16M bf16")
    parser.add_argument("--bucket-size", type=int, default=2048, help="elements per bucket (default 2048)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_symmetric_hadamard.py needs a CUDA GPU", file=sys.stderr)
        return 2

    header = _header("python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]))
    rows: list[dict] = []
    copies: dict[str, float] = {}
    sizes = (16 * MI,) if args.quick else (16 * MI, 64 * MI, 256 * MI)
    dtypes = (torch.bfloat16,) if args.quick else (torch.bfloat16, torch.float32)
    for size in sizes:
        for dtype in dtypes:
            copy = _copy_gbps(size, dtype)
            copies[f"{size // MI}M {DTYPE_NAMES[dtype]}"] = copy
            print(f"{size // MI}M {DTYPE_NAMES[dtype]}: copy {copy:.0f} GB/s", flush=True)
            _measure(rows, size, dtype, (8, 4) if args.quick else (8, 4, 2), args.bucket_size, copy)
            torch.cuda.empty_cache()
    text = "\n".join(f"- {k}: {v}" for k, v in header.items()) + "\n\n"
    text += f"Symmetric codec, bucket {args.bucket_size}, fp32 scale per bucket.\n\n" + _table(rows, copies)
    print("\n" + text)
    if os.environ.get("OUT"):
        out = Path(os.environ["OUT"])
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench_symmetric_hadamard.md").write_text(text + "\n")
        raw = {"header": header, "copy_gbps": copies, "rows": rows}
        (out / "bench_symmetric_hadamard.json").write_text(json.dumps(raw, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
