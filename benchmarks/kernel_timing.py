"""Shared timing harness of the kernel benchmarks (``bench_kernels.py``, ``bench_symmetric_hadamard.py``):
``triton.testing.do_bench`` medians, the device-to-device copy roof, one row per timed codec call, the grid of
sizes and dtypes, the markdown table and the ``--out-dir`` files.

Not a benchmark itself; the benchmarks import it from this directory.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import triton
from triton.testing import do_bench

from composer_qsdp.kernels import backend
from provenance import git_revision

MI = 2**20
DEVICE = "cuda"
#: Rows of the decode_sum case: the reduce side of an 8-way reduce-scatter.
REDUCE_ROWS = 8
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float32: "fp32"}

#: One timed call: the columns of :func:`table` and the raw values of the JSON record.
Row = dict[str, Any]


def arg_parser(doc: str, bucket_size: int) -> argparse.ArgumentParser:
    """The options both benchmarks take (``--quick``, ``--bucket-size`` defaulting to ``bucket_size``), described
    by the first paragraph of ``doc``."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke check: 16M bf16, 8 and 4 bits")
    parser.add_argument("--bucket-size", type=int, default=bucket_size,
                        help=f"elements per bucket (default {bucket_size})")  # fmt: skip
    add_out_dir(parser)
    return parser


def add_out_dir(parser: argparse.ArgumentParser) -> None:
    """``--out-dir DIR``: the folder that receives the table (``.md``) and the raw rows (``.json``)."""
    parser.add_argument("--out-dir", type=Path, help="also write <name>.md and <name>.json into this folder")


def cuda_missing() -> bool:
    """Whether there is no CUDA GPU to time on (then said on stderr). Called after parsing the arguments, so
    that ``--help`` works without one."""
    if torch.cuda.is_available():
        return False
    print(f"{Path(sys.argv[0]).name} needs a CUDA GPU", file=sys.stderr)
    return True


def header() -> dict[str, str]:
    """GPU, software versions, date (UTC), git revision and this process's command line, for a result record."""
    props = torch.cuda.get_device_properties(0)
    return {
        "device": f"{props.name} ({props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB, "
        f"L2 {props.L2_cache_size / MI:.0f} MiB)",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "git": git_revision(),
        "command": "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
    }


def median_ms(fn: Callable[[], object]) -> float:
    """Median milliseconds of ``fn`` under ``do_bench`` (which clears the L2 cache before every timed call)."""
    return do_bench(fn, warmup=10, rep=50, return_mode="median")


def median_ms_twice(fn: Callable[[], object]) -> tuple[float, float]:
    """(the faster of two medians, their difference in % of it): a difference between versions smaller than
    that spread is noise (the first H100 run had isolated 2-3x slow medians)."""
    first, second = median_ms(fn), median_ms(fn)
    return min(first, second), 100 * abs(first - second) / min(first, second)


def gbps(nbytes: int, ms: float) -> float:
    """Achieved GB/s (10^9 bytes) of moving ``nbytes`` in ``ms`` milliseconds."""
    return nbytes / (ms * 1e-3) / 1e9


def copy_gbps(size: int, dtype: torch.dtype) -> float:
    """GB/s of a device-to-device copy of ``size`` elements of ``dtype``, counting read plus write: the roof."""
    src = torch.randn(size, device=DEVICE, dtype=dtype)
    dst = torch.empty_like(src)
    return gbps(2 * src.numel() * src.element_size(), median_ms(lambda: dst.copy_(src)))


def make_row(size: int, dtype: torch.dtype, op: str, bits: int | str, rounding: str, nbytes: int, ms: float,
             spread_pct: float, roof_gbps: float) -> Row:  # fmt: skip
    """One table row of a call on ``size`` elements of ``dtype`` that moved ``nbytes`` (read plus write) in
    ``ms`` milliseconds; the eager columns start empty."""
    return {"elements": size, "dtype": DTYPE_NAMES[dtype], "op": op, "bits": bits, "rounding": rounding,
            "bytes": nbytes, "ms": ms, "spread_pct": spread_pct, "gbps": gbps(nbytes, ms),
            "pct_copy": 100 * gbps(nbytes, ms) / roof_gbps, "eager_ms": None, "eager_gbps": None}  # fmt: skip


class Recorder:
    """Times codec calls on an input of ``size`` elements of ``dtype`` and appends their rows to ``rows``.

    Args:
        rows: the table's rows so far.
        size: elements of the input.
        dtype: its dtype.
        roof_gbps: the copy roof of that size and dtype, for the rows' % of copy.
    """

    def __init__(self, rows: list[Row], size: int, dtype: torch.dtype, roof_gbps: float) -> None:
        self.rows, self.size, self.dtype, self.roof_gbps = rows, size, dtype, roof_gbps

    def __call__(self, op: str, bits: int | str, rounding: str, nbytes: int, fn: Callable[[], object],
                 eager: bool) -> None:  # fmt: skip
        """Time ``fn`` twice (Triton kernels) and, when ``eager``, once more under the eager PyTorch backend;
        ``nbytes`` is what one call must read plus write."""
        ms, spread = median_ms_twice(fn)
        row = make_row(self.size, self.dtype, op, bits, rounding, nbytes, ms, spread, self.roof_gbps)
        if eager:
            with backend("torch"):
                row["eager_ms"] = median_ms(fn)
            row["eager_gbps"] = gbps(nbytes, row["eager_ms"])
        self.rows.append(row)
        print(f"  {row['dtype']} {self.size // MI}M {op:<28} {bits}b {rounding:<10} {ms * 1e3:9.1f} us "
              f"{row['gbps']:7.0f} GB/s {row['pct_copy']:5.1f}% of copy", flush=True)  # fmt: skip


def measure_grid(quick: bool, measure: Callable[[Recorder, tuple[int, ...]], None],
                 sizes: tuple[int, ...] = (16 * MI, 64 * MI, 256 * MI), bits_list: tuple[int, ...] = (8, 4, 2)
                 ) -> tuple[list[Row], dict[str, float]]:  # fmt: skip
    """Run ``measure(recorder, bits_list)`` for ``sizes`` (elements) of bf16 and fp32 at ``bits_list`` (``quick``:
    16M bf16 at 8/4 bits), each after its copy roof. Returns the rows and the copy GB/s per
    ``"<size> <dtype>"``."""
    sizes = (16 * MI,) if quick else sizes
    dtypes = (torch.bfloat16,) if quick else (torch.bfloat16, torch.float32)
    bits_list = (8, 4) if quick else bits_list
    rows: list[Row] = []
    copies: dict[str, float] = {}
    for size in sizes:
        for dtype in dtypes:
            copy = copy_gbps(size, dtype)
            copies[f"{size // MI}M {DTYPE_NAMES[dtype]}"] = copy
            print(f"{size // MI}M {DTYPE_NAMES[dtype]}: copy {copy:.0f} GB/s", flush=True)
            measure(Recorder(rows, size, dtype, copy), bits_list)
            # Give this size's cached blocks back before the next size allocates its own.
            torch.cuda.empty_cache()
    return rows, copies


def table(rows: list[Row], copies: dict[str, float]) -> str:
    """The markdown table of ``rows`` and a line of the copy roofs."""
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


def header_text(head: dict[str, str]) -> str:
    """The record header as markdown list items, then a blank line."""
    return "\n".join(f"- {k}: {v}" for k, v in head.items()) + "\n\n"


def write_out(out_dir: Path | None, name: str, text: str, record: Mapping[str, Any]) -> None:
    """With an ``out_dir`` (``--out-dir``), write ``text`` to ``{out_dir}/{name}.md`` and ``record`` to
    ``{out_dir}/{name}.json``."""
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / f"{name}.md").write_text(text + "\n")
        (out_dir / f"{name}.json").write_text(json.dumps(record, indent=1))
