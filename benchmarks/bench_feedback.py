"""The codec work of one LoCo reduce-scatter on one CUDA GPU: the error-feedback encode of a unit's gradient and the
owner's decode-and-sum, as the qwd-*-loco presets run them (Hadamard-rotated min-max, round to nearest, groups of
256), three ways:

=============  ====================================================================================================
``reference``  the code before the fused kernels: 3-bit min-max had no kernel (its torch reference ran), the
               rotation and the residual update were separate passes over fp32 copies of the unit's gradient
``unfused``    the same composition (``Codec._encode_rows_feedback``: compensate, encode, decode, update) with
               every codec call on its kernel
``fused``      ``Codec.encode_rows_feedback``'s one-pass kernel: read the gradient and the residual, write the
               codes and the new residual
=============  ====================================================================================================

The input is the reduce-scatter input of one GPT-1.3B block (50.3M parameters) on ``--ranks`` ranks (``W`` rows of
``n`` elements, bf16), the residual fp32. Each call is timed with ``triton.testing.do_bench`` (median of two
medians; their spread is the noise). Bytes counted for the fused call are its floor: the gradient read, the
residual read and written, the codes written; GB/s against a device copy of the same number of bytes.

Usage::

    python benchmarks/bench_feedback.py --out-dir DIR            # 2, 3 and 4 bits, 4 ranks
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from unittest import mock

import torch

import kernel_timing as timing
from composer_qsdp.kernels import minmax as minmax_kernels
from composer_qsdp.quant import Codec, HadamardCodec, MinMaxCodec

BLOCK_1_3B = 12 * 2048 * 2048 + 13 * 2048  # GPT-1.3B block: attention and MLP matrices, biases, two norms


def _packed_widths_only(bits: int, *args: int) -> bool:
    """The kernels' coverage before odd widths had kernels (1, 2, 4, 8 bits)."""
    return bits in (1, 2, 4, 8) and minmax_kernels.supports_packed(bits, *args)


def measure(bits: int, ranks: int) -> list[dict]:
    n = -(-BLOCK_1_3B // ranks)
    codec = HadamardCodec(MinMaxCodec(bits=bits, bucket_size=256, rounding="nearest"))
    x = torch.randn(ranks, n, device="cuda", dtype=torch.bfloat16)
    residual = 1e-3 * torch.randn(ranks * n, device="cuda")
    wire_bytes = codec.wire_bytes(n) * ranks
    floor = x.numel() * 2 + 2 * residual.numel() * 4 + wire_bytes
    roof = timing.copy_gbps(floor // 8, torch.float32)  # a copy moving the same bytes (read + write)
    rows = []

    def record(way: str, op: str, fn, nbytes: int | None) -> None:
        ms, spread = timing.median_ms_twice(fn)
        rows.append({"bits": bits, "ranks": ranks, "n": n, "way": way, "op": op, "ms": ms, "spread_pct": spread,
                     "gbps": None if nbytes is None else timing.gbps(nbytes, ms),
                     "pct_copy": None if nbytes is None else 100 * timing.gbps(nbytes, ms) / roof})

    unfused = lambda: Codec._encode_rows_feedback(codec, x, residual, 0.5, 0, 0)  # noqa: E731
    with mock.patch.object(minmax_kernels, "supports", _packed_widths_only):
        record("reference", "feedback encode", unfused, None)
        wire = codec.encode_rows(x.float())
        record("reference", "decode_sum", lambda: codec.decode_sum(wire, n), None)
    record("unfused", "feedback encode", unfused, None)
    record("fused", "feedback encode", lambda: codec.encode_rows_feedback(x, residual, 0.5), floor)
    record("kernels", "decode_sum", lambda: codec.decode_sum(wire, n), wire_bytes + n * 4)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bits", type=int, nargs="+", default=[2, 3, 4])
    parser.add_argument("--ranks", type=int, default=4, help="rows of the reduce-scatter input (default 4)")
    parser.add_argument("--out-dir", help="also write bench_feedback.md / .json there")
    args = parser.parse_args(argv)
    if timing.cuda_missing():
        return 2
    rows = [row for bits in args.bits for row in measure(bits, args.ranks)]
    head = timing.header()
    fmt = lambda v, spec: "" if v is None else format(v, spec)  # noqa: E731
    lines = ["### bench_feedback: LoCo's error-feedback encode and decode-sum, one GPT-1.3B block", "",
             timing.header_text(head).rstrip(), "",
             "| bits | ranks | way | op | ms | spread % | GB/s (floor) | % of copy |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['bits']} | {r['ranks']} | {r['way']} | {r['op']} | {r['ms']:.3f} | {r['spread_pct']:.1f} "
              f"| {fmt(r['gbps'], '.0f')} | {fmt(r['pct_copy'], '.0f')} |" for r in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out_dir:
        out = Path(args.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench_feedback.md").write_text(text)
        (out / "bench_feedback.json").write_text(json.dumps({"header": head, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
