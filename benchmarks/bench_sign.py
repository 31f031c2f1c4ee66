"""1-bit sign codec kernels (0/1 Adam's compressed all-reduce) on a CUDA GPU: achieved bandwidth against a
device-to-device copy and eager PyTorch.

Same harness, timing, table and output conventions as ``bench_kernels.py`` (``kernel_timing.py``: header,
``do_bench`` median, copy roof; ``--out-dir DIR``: ``DIR/bench_sign.{md,json}``). For 16M, 64M and 256M
elements of bf16 and fp32: quantize (``SignCodec.encode_rows`` on one row), dequantize (``decode_rows`` to the
input dtype) and decode_sum of 8 rows of ``n / 8`` elements into fp32, each beside its eager PyTorch reference.

Usage::

    python benchmarks/bench_sign.py            # full table (about a minute on one H100)
    python benchmarks/bench_sign.py --quick    # smoke check: 16M bf16
"""

from __future__ import annotations

import sys

import torch

import kernel_timing as timing
from composer_qsdp.quant import make_codec
from kernel_timing import REDUCE_ROWS

#: The rounding column of every row: signs are deterministic.
DETERMINISTIC = "-"


def _measure(record: timing.Recorder, bucket: int) -> None:
    """Record the sign codec's three calls on ``record``'s input size and dtype."""
    size, dtype = record.size, record.dtype
    x = torch.randn(1, size, device=timing.DEVICE, dtype=dtype)
    in_bytes = size * x.element_size()
    codec = make_codec("sign", bits=1, bucket_size=bucket)
    wire = codec.encode_rows(x)
    record("quantize", 1, DETERMINISTIC, in_bytes + wire.numel(), lambda: codec.encode_rows(x), True)
    record("dequantize", 1, DETERMINISTIC, wire.numel() + in_bytes, lambda: codec.decode_rows(wire, size, dtype),
           True)  # fmt: skip
    chunk = size // REDUCE_ROWS
    wires = codec.encode_rows(x.view(REDUCE_ROWS, chunk))
    record(f"decode_sum ({REDUCE_ROWS} rows)", 1, DETERMINISTIC, wires.numel() + 4 * chunk,
           lambda: codec.decode_sum(wires, chunk), True)  # fmt: skip


def main() -> int:
    args = timing.arg_parser(__doc__, bucket_size=2048).parse_args()
    if timing.cuda_missing():
        return 2

    header = timing.header()
    rows, copies = timing.measure_grid(args.quick, lambda record, _bits: _measure(record, args.bucket_size))
    text = timing.header_text(header)
    text += f"Sign codec, bucket {args.bucket_size}, fp32 scale per bucket.\n\n" + timing.table(rows, copies)
    print("\n" + text)
    timing.write_out(args.out_dir, "bench_sign", text, {"header": header, "copy_gbps": copies, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
