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
``n`` elements, bf16). The decode-sum (the owner's side) sums the ``W`` wire rows in fp32 and rotates the sum back:
``kernels`` is ``HadamardCodec.decode_sum``, one kernel that rotates the sum in registers
(``MinMaxCodec.decode_sum_rotated``); ``unfused`` the two launches it replaced (the min-max decode-sum writing the
fp32 sum, then ``hadamard_rows`` reading and rewriting it); both against the floor of the one pass: the ``W`` wire
rows read, ``n * 4`` bytes written. The residual (column ``residual``) is fp32, bf16, or ``int8``: a ``CodedResidual`` of
``SymmetricCodec(8, 256)``, 1 byte per element plus one fp32 scale per bucket of 256 (the reference and the unfused
composition run with fp32 and int8, the fused kernel with all three). Each call is timed with
``triton.testing.do_bench`` (median of two medians; their spread is the noise). Bytes counted for the fused call are
its floor: the gradient read, the residual read and written, the codes written; GB/s against a device copy of the
same number of bytes.

``--sweep`` times the kernels of the preset's codec (``--preset``, default ``qwd-w4g3-loco``: 3 bits, groups of
256) over the launch shapes of :data:`SWEEP_GRID` (buckets per program x warps; the results never depend on them),
on the same rows: the fused feedback quantize (rotated and not; fp32, bf16 and int8 residual), the min-max decode-sum of
the ``--ranks`` wire rows (fp32, as the rotated codec sums before rotating back), that sum's inverse rotation
(``hadamard_rows``), and the decode-sum that rotates back in the same kernel (``decode_sum rotated``, what
``HadamardCodec.decode_sum`` runs). The two decode-sums also run their default shape at each of
:data:`SWEEP_ROWS_PER_STEP` rows per loop step (column ``rows_per_step``; empty: the default). Worker processes first
compile every shape and check its output against the torch reference (Triton's on-disk cache then serves the timing
process); a shape that fails to compile or spills registers is recorded and not timed. Bytes per launch, read plus written: feedback ``R*n*2`` (bf16 gradient) +
twice the residual (read and written: ``R*n*s`` for ``s``-byte floats, the ``R`` coded rows ``R*(n + 4*ceil(n/256))``
bytes (up to 3 bytes of padding each) for int8) + the ``R`` wire rows; decode-sum the ``R`` wire rows + ``n*4``
(the padded ``n`` unrotated); rotation ``2*n*4``. % of copy is against a device copy moving the same number of bytes.

Usage::

    python benchmarks/bench_feedback.py --out-dir DIR            # 2, 3 and 4 bits, 4 ranks
    python benchmarks/bench_feedback.py --sweep --out-dir DIR    # launch-shape sweep; timing stops after --budget-s (85 s)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import torch
import triton

import kernel_timing as timing
from composer_qsdp.config import preset_names
from composer_qsdp.kernels import backend, bucket_decode
from composer_qsdp.kernels import hadamard as hadamard_kernels
from composer_qsdp.kernels import minmax as minmax_kernels
from composer_qsdp.quant import Codec, CodedResidual, HadamardCodec, MinMaxCodec, SymmetricCodec
from composer_qsdp.quant.hadamard import hadamard_rows
from composer_qsdp.registry import PRESETS

BLOCK_1_3B = 12 * 2048 * 2048 + 13 * 2048  # GPT-1.3B block: attention and MLP matrices, biases, two norms


def _packed_widths_only(bits: int, *args: int) -> bool:
    """The kernels' coverage before odd widths had kernels (1, 2, 4, 8 bits)."""
    return bits in (1, 2, 4, 8) and minmax_kernels.supports_packed(bits, *args)


#: Residual kinds: a float dtype, or ``int8``, the residual coded as ``SymmetricCodec(8, bucket)``'s wire rows.
RESIDUALS = ("fp32", "bf16", "int8")
_RESIDUAL_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def make_residual(kind: str, values: torch.Tensor, bucket: int) -> torch.Tensor | CodedResidual:
    """The ``[R, n]`` fp32 ``values`` as a residual of ``kind`` (:data:`RESIDUALS`): a flat float tensor, or a coded
    residual in buckets of ``bucket`` elements (the min-max codec's, so the fused kernel reads it)."""
    if kind == "int8":
        coded = CodedResidual(SymmetricCodec(8, bucket), *values.shape, device=values.device)
        coded.store(values)
        return coded
    return values.reshape(-1).to(_RESIDUAL_DTYPES[kind])


def copy_residual(residual: torch.Tensor | CodedResidual) -> torch.Tensor | CodedResidual:
    """A copy of ``residual`` that a feedback call can update without touching the original."""
    if isinstance(residual, CodedResidual):
        copy = CodedResidual(residual.codec, residual.rows, residual.numel, residual.device)
        copy.wire.copy_(residual.wire)
        return copy
    return residual.clone()


def residual_bytes(kind: str, rows: int, n: int, bucket: int) -> int:
    """Bytes of one ``[rows, n]`` residual of ``kind``: ``s`` per element for ``s``-byte floats; for int8 the coded
    rows, 1 byte per element and 4 per bucket of ``bucket`` elements (plus each row's padding to 4 bytes)."""
    if kind == "int8":
        return rows * SymmetricCodec(8, bucket).wire_bytes(n)
    return rows * n * _RESIDUAL_DTYPES[kind].itemsize


def measure(bits: int, ranks: int) -> list[dict]:
    n = -(-BLOCK_1_3B // ranks)
    bucket = 256
    codec = HadamardCodec(MinMaxCodec(bits=bits, bucket_size=bucket, rounding="nearest"))
    x = torch.randn(ranks, n, device="cuda", dtype=torch.bfloat16)
    values = 1e-3 * torch.randn(ranks, n, device="cuda")
    residuals = {kind: make_residual(kind, values, bucket) for kind in RESIDUALS}
    wire_bytes = codec.wire_bytes(n) * ranks
    floors = {kind: x.numel() * 2 + 2 * residual_bytes(kind, ranks, n, bucket) + wire_bytes for kind in RESIDUALS}
    # A copy moving the same bytes (read + write) as each fused call's floor.
    roofs = {kind: timing.copy_gbps(floor // 8, torch.float32) for kind, floor in floors.items()}
    rows = []

    def record(way: str, op: str, residual: str, fn, nbytes: int | None, roof: float | None = None) -> None:
        ms, spread = timing.median_ms_twice(fn)
        rows.append({"bits": bits, "ranks": ranks, "n": n, "way": way, "op": op, "residual": residual, "ms": ms,
                     "spread_pct": spread, "gbps": None if nbytes is None else timing.gbps(nbytes, ms),
                     "pct_copy": None if nbytes is None else 100 * timing.gbps(nbytes, ms) / roof})

    def unfused(kind: str) -> Callable[[], object]:
        return lambda: Codec._encode_rows_feedback(codec, x, residuals[kind], 0.5, 0, 0)

    # The reference ran the two-pass decode-sum (sum, then rotation) where the min-max kernels covered the width.
    with mock.patch.object(minmax_kernels, "supports", _packed_widths_only), \
            mock.patch.object(MinMaxCodec, "decode_sum_rotated", lambda *args: None):  # fmt: skip
        record("reference", "feedback encode", "fp32", unfused("fp32"), None)
        wire = codec.encode_rows(x.float())
        record("reference", "decode_sum", "", lambda: codec.decode_sum(wire, n), None)
    for kind in ("fp32", "int8"):
        record("unfused", "feedback encode", kind, unfused(kind), None)
    for kind in RESIDUALS:
        record("fused", "feedback encode", kind, lambda kind=kind: codec.encode_rows_feedback(x, residuals[kind], 0.5),
               floors[kind], roofs[kind])  # fmt: skip
    sum_floor = wire_bytes + n * 4  # the wire rows read, the fp32 sum written once
    sum_roof = timing.copy_gbps(sum_floor // 8, torch.float32)
    padded = codec.padded(n)
    two_passes = lambda: hadamard_kernels.hadamard_rows(  # noqa: E731
        codec.inner.decode_sum(wire, padded).view(1, -1), bucket, n, torch.float32)
    record("unfused", "decode_sum", "", two_passes, sum_floor, sum_roof)
    record("kernels", "decode_sum", "", lambda: codec.decode_sum(wire, n), sum_floor, sum_roof)
    return rows


# --------------------------------------------------------------------------------------------- --sweep
#: Launch shapes of ``--sweep``, ``(buckets per program, warps)`` per kernel at 256-element buckets: the grid
#: 1..16 x 1..16 (powers of two) at 2 to 64 elements per thread (``bpp * 256 / (32 * warps)``), less the shapes
#: whose sm_90 compile spills registers (``tests/kernels/hopper.py``, 3 bits, bf16 gradient, fp32 and bf16
#: residual; the sweep records each launch's registers, the int8 residual's too). Each kernel's default launch is
#: timed too, as its own row.
SWEEP_GRID: dict[str, tuple[tuple[int, int], ...]] = {
    "feedback rotated": ((1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (2, 4), (2, 8), (4, 1), (4, 2), (4, 4), (4, 8),
                         (4, 16), (8, 2), (8, 4), (8, 8), (8, 16), (16, 4), (16, 8), (16, 16)),
    "feedback": ((1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (4, 4), (8, 2), (8, 4), (8, 8), (16, 4), (16, 8), (16, 16)),
    "decode_sum": ((1, 1), (1, 2), (2, 1), (2, 2), (2, 4), (4, 1), (4, 2), (4, 4), (4, 8), (8, 1), (8, 2), (8, 4),
                   (8, 8), (8, 16), (16, 2), (16, 4), (16, 8), (16, 16)),
    "decode_sum rotated": ((1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (4, 4), (8, 1), (8, 2), (8, 4), (8, 8), (16, 2),
                           (16, 4), (16, 8), (32, 4), (32, 8)),
    "hadamard": ((2, 1), (2, 2), (2, 4), (4, 1), (4, 2), (4, 4), (4, 8), (8, 1), (8, 2), (8, 4), (8, 8), (8, 16),
                 (16, 2), (16, 4), (16, 8), (16, 16), (32, 4), (32, 8), (32, 16)),
}  # fmt: skip
#: Rows per loop step of the decode-sums' extra default-shape launches (``rows_per_step``; at most ``--ranks``).
SWEEP_ROWS_PER_STEP = (1, 2, 4, 8)
SWEEP_COLUMNS = ("op", "residual", "bpp", "warps", "rows_per_step", "el_per_thread", "status", "regs", "spills", "smem",
                 "ms", "spread_pct", "bytes", "gbps", "pct_copy")  # fmt: skip
_DECODE_SUMS = ("decode_sum", "decode_sum rotated")
_SWEEP_CASES = tuple((op, kind) for op in ("feedback rotated", "feedback") for kind in RESIDUALS) + (
    ("decode_sum", ""), ("hadamard", ""), ("decode_sum rotated", ""))  # fmt: skip


class _Sweep:
    """The codec and the inputs of a sweep over one GPT-1.3B block on ``ranks`` ranks, the same in every process
    (fixed seed); ``reference``: also the torch reference's outputs, which every launch shape must give."""

    def __init__(self, preset: str, ranks: int, reference: bool) -> None:
        options = PRESETS.lookup(preset)
        self.bits, self.bucket = options["grad_bits"], options["grad_bucket_size"]
        self.ranks, self.n = ranks, -(-BLOCK_1_3B // ranks)
        self.inner = MinMaxCodec(bits=self.bits, bucket_size=self.bucket, rounding="nearest")
        self.rotated = HadamardCodec(self.inner)
        self.padded = self.rotated.padded(self.n)
        gen = torch.Generator(device="cuda").manual_seed(0)
        self.x = torch.randn(ranks, self.n, device="cuda", dtype=torch.bfloat16, generator=gen)
        r = 1e-3 * torch.randn(ranks, self.n, device="cuda", generator=gen)
        self.residual = {kind: make_residual(kind, r, self.bucket) for kind in RESIDUALS}
        self.expected: dict[tuple[str, str], Any] = {}
        with backend("torch"):
            self.wire = self.rotated.encode_rows(self.x)
            self.total = self.inner.decode_sum(self.wire, self.padded)
            if reference:
                for op, residual in _SWEEP_CASES:
                    if not op.startswith("feedback"):
                        continue
                    new = copy_residual(self.residual[residual])
                    codec = self.rotated if op == "feedback rotated" else self.inner
                    self.expected[op, residual] = (codec.encode_rows_feedback(self.x, new, 0.5), new)
                self.expected["decode_sum", ""] = self.total
                self.expected["hadamard", ""] = hadamard_rows(self.total.view(1, -1), self.bucket, self.n,
                                                              torch.float32)  # fmt: skip
                self.expected["decode_sum rotated", ""] = self.expected["hadamard", ""][0]

    def nbytes(self, op: str, residual: str) -> int:
        """Bytes one launch of ``op`` reads plus writes (module docstring)."""
        wire = self.ranks * self.inner.wire_bytes(self.padded if op != "feedback" else self.n)
        if op.startswith("feedback"):
            return self.x.numel() * 2 + 2 * residual_bytes(residual, self.ranks, self.n, self.bucket) + wire
        if op == "decode_sum":
            return wire + self.padded * 4
        return wire + self.n * 4 if op == "decode_sum rotated" else 2 * self.n * 4

    def call(self, spec: dict[str, Any], residual: torch.Tensor | CodedResidual | None = None) -> Any:
        """Launch ``spec`` once; the feedback quantize updates ``residual`` (default: the sweep's own)."""
        bpp, warps = spec["bpp"], spec["warps"]
        op = spec["op"]
        if op.startswith("feedback"):
            rotate = op == "feedback rotated"
            r = self.residual[spec["residual"]] if residual is None else residual
            r = r.wire if isinstance(r, CodedResidual) else r  # the launcher takes a coded residual's wire rows
            fmt = self.inner.wire_format(self.padded if rotate else self.n)
            return minmax_kernels.encode_rows_feedback(self.x, r, 0.5, self.bits, self.bucket, fmt, False, 0, 0,
                                                       rotate, buckets_per_program=bpp, num_warps=warps)  # fmt: skip
        if op in _DECODE_SUMS:
            rotate = op == "decode_sum rotated"
            return minmax_kernels.decode_sum(self.wire, self.bits, self.bucket, self.inner.wire_format(self.padded),
                                             rotate=rotate, numel=self.n if rotate else None, buckets_per_program=bpp,
                                             num_warps=warps, rows_per_step=spec.get("rows_per_step"))  # fmt: skip
        return hadamard_kernels.hadamard_rows(self.total.view(1, -1), self.bucket, self.n, torch.float32, bpp, warps)

    def matches_reference(self, spec: dict[str, Any]) -> bool:
        """Whether one launch of ``spec`` gives the torch reference's outputs bit for bit."""
        expected = self.expected[spec["op"], spec["residual"]]
        if spec["op"].startswith("feedback"):
            new = copy_residual(self.residual[spec["residual"]])
            same_wire = torch.equal(self.call(spec, new), expected[0])
            if isinstance(new, CodedResidual):
                return same_wire and torch.equal(new.wire, expected[1].wire)
            return same_wire and torch.equal(new, expected[1])
        return torch.equal(self.call(spec), expected)


def _launched_kernel(launch: Callable[[], object]) -> Any:
    """The compiled Triton kernel (its ``n_regs``, ``n_spills``, ``metadata.shared``) that ``launch`` ran last,
    found among the codec kernel modules' compiled kernels by its function handle; ``None`` if not found."""
    handles = []

    def record(metadata: Any) -> None:  # a LazyDict of the launch
        handles.append(metadata.get()["function"])

    triton.knobs.runtime.launch_enter_hook.add(record)
    try:
        launch()
    finally:
        triton.knobs.runtime.launch_enter_hook.remove(record)
    for module in (minmax_kernels, bucket_decode, hadamard_kernels):
        for fn in vars(module).values():
            if isinstance(fn, triton.runtime.JITFunction):
                for caches in fn.device_caches.values():
                    for kernel in caches[0].values():
                        if handles and getattr(kernel, "function", None) == handles[-1]:
                            return kernel
    return None


_WORKER_SWEEP: list[_Sweep] = []


def _compile_and_check(preset: str, ranks: int, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """In a worker process: launch each of ``specs`` once (compiling it into Triton's on-disk cache) and return
    its registers, spills, shared memory and status: ``ok``, ``spills``, ``wrong result`` (not the torch
    reference's bits) or the error that stopped it."""
    if not _WORKER_SWEEP:
        _WORKER_SWEEP.append(_Sweep(preset, ranks, reference=True))
    sweep = _WORKER_SWEEP[0]
    results = []
    for spec in specs:
        result: dict[str, Any] = {"status": "ok"}
        try:
            kernel = _launched_kernel(lambda: sweep.call(spec, copy_residual(sweep.residual[spec["residual"]]))
                                      if spec["residual"] else sweep.call(spec))  # fmt: skip
            if kernel is not None:
                result.update(regs=kernel.n_regs, spills=kernel.n_spills, smem=kernel.metadata.shared)
                if spec["warps"] is None:  # a default launch: time it with the warps it picked, which it reports
                    result["warps"] = kernel.metadata.num_warps
            if kernel is not None and kernel.n_spills:
                result["status"] = "spills"
            elif not sweep.matches_reference(spec):
                result["status"] = "wrong result"
        except Exception as err:  # noqa: BLE001 - a shape that does not compile or launch is recorded, not fatal
            result["status"] = f"error: {type(err).__name__}: {' '.join(str(err).split())[:200]}"
        results.append(result)
    return results


def _sweep_specs(bucket: int, ranks: int) -> list[dict[str, Any]]:
    """Every (op, residual, launch shape) of the sweep, the default launches (``bpp`` and ``warps`` None) first, then
    the decode-sums' default shapes at each of :data:`SWEEP_ROWS_PER_STEP` up to ``ranks``."""
    specs = [{"op": op, "residual": residual, "bpp": None, "warps": None} for op, residual in _SWEEP_CASES]
    specs += [{"op": op, "residual": "", "bpp": None, "warps": None, "rows_per_step": step}
              for op in _DECODE_SUMS for step in SWEEP_ROWS_PER_STEP if step <= ranks]  # fmt: skip
    specs += [{"op": op, "residual": residual, "bpp": bpp, "warps": warps}
              for op, residual in _SWEEP_CASES for bpp, warps in SWEEP_GRID[op]]  # fmt: skip
    for spec in specs:
        spec["el_per_thread"] = None if spec["bpp"] is None else spec["bpp"] * bucket // (32 * spec["warps"])
    return specs


def sweep(preset: str, ranks: int, jobs: int, budget_s: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Compile and check every launch shape in ``jobs`` worker processes, then time those that compiled without
    spills and match the reference, stopping after ``budget_s`` seconds in all. Returns the rows and the run's
    facts (copy roofs, bytes per launch)."""
    start = time.monotonic()
    probe = _Sweep(preset, ranks, reference=False)
    specs = _sweep_specs(probe.bucket, ranks)
    chunks = [specs[i::jobs] for i in range(jobs)]
    spawn = multiprocessing.get_context("spawn")  # CUDA does not survive fork
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=spawn) as pool:
        futures = [pool.submit(_compile_and_check, preset, ranks, chunk) for chunk in chunks]
        for chunk, future in zip(chunks, futures):
            try:
                results = future.result()
            except Exception as err:  # noqa: BLE001 - a crashed worker takes its shapes with it, not the sweep
                results = [{"status": f"error: worker: {type(err).__name__}"}] * len(chunk)
            for spec, result in zip(chunk, results):
                spec.update(result)
    compiled_s = time.monotonic() - start
    print(f"compiled and checked {len(specs)} launches in {compiled_s:.0f} s", flush=True)
    for spec in specs:
        if spec["status"] != "ok":
            print(f"  not timed: {spec['op']} {spec['residual']} bpp {spec['bpp']} warps {spec['warps']} rows per "
                  f"step {spec.get('rows_per_step')}: {spec['status']}", flush=True)  # fmt: skip
    nbytes = {f"{op} {residual}".strip(): probe.nbytes(op, residual) for op, residual in _SWEEP_CASES}
    roofs = {name: timing.copy_gbps(b // 8, torch.float32) for name, b in nbytes.items()}  # same bytes moved
    for spec in specs:
        name = f"{spec['op']} {spec['residual']}".strip()
        spec["bytes"] = nbytes[name]
        if spec["status"] != "ok":
            continue
        if time.monotonic() - start > budget_s:
            spec["status"] = "not timed: budget"
            continue
        spec["ms"], spec["spread_pct"] = timing.median_ms_twice(lambda: probe.call(spec))
        spec["gbps"] = timing.gbps(spec["bytes"], spec["ms"])
        spec["pct_copy"] = 100 * spec["gbps"] / roofs[name]
        print(f"  {name:<22} bpp {spec['bpp'] or 'default':>7} warps {spec['warps'] or '':>2} rows/step "
              f"{spec.get('rows_per_step') or '':>1} regs {spec.get('regs', '?'):>3} {spec['ms'] * 1e3:7.1f} us "
              f"{spec['pct_copy']:5.1f}% of copy", flush=True)  # fmt: skip
    facts = {"preset": preset, "bits": probe.bits, "bucket_size": probe.bucket, "ranks": ranks, "n": probe.n,
             "bytes_per_launch": nbytes, "copy_gbps": roofs, "compile_s": compiled_s,
             "total_s": time.monotonic() - start}  # fmt: skip
    return specs, facts


def write_sweep(out_dir: Path, specs: list[dict[str, Any]], facts: dict[str, Any]) -> None:
    """``bench_feedback_sweep.csv`` (one row per launch, :data:`SWEEP_COLUMNS`) and ``bench_feedback_sweep.json``
    (the header, the facts, the rows) in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "bench_feedback_sweep.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, SWEEP_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for spec in specs:
            writer.writerow({k: "default" if k in ("bpp", "warps") and spec[k] is None else
                             round(v, 4) if isinstance(v := spec.get(k), float) else v for k in SWEEP_COLUMNS})
    record = {"header": timing.header(), **facts, "rows": specs}
    (out_dir / "bench_feedback_sweep.json").write_text(json.dumps(record, indent=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bits", type=int, nargs="+", default=[2, 3, 4])
    parser.add_argument("--ranks", type=int, default=4, help="rows of the reduce-scatter input (default 4)")
    parser.add_argument("--out-dir", help="also write bench_feedback.md / .json there (--sweep: _sweep.csv / .json)")
    parser.add_argument("--sweep", action="store_true", help="time the preset's kernels over SWEEP_GRID's launches")
    parser.add_argument("--preset", default="qwd-w4g3-loco", choices=[p for p in preset_names() if "loco" in p],
                        help="--sweep: the preset whose gradient bits and bucket size to time")
    parser.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1),
                        help="--sweep: processes compiling the launches (default min(8, CPUs))")
    parser.add_argument("--budget-s", type=float, default=85.0,
                        help="--sweep: stop timing after this many seconds in all (default 85)")
    args = parser.parse_args(argv)
    if timing.cuda_missing():
        return 2
    if args.sweep:
        specs, facts = sweep(args.preset, args.ranks, args.jobs, args.budget_s)
        if args.out_dir:
            write_sweep(Path(args.out_dir), specs, facts)
        print(f"sweep: {sum('ms' in s for s in specs)} of {len(specs)} launches timed in {facts['total_s']:.0f} s")
        return 0
    rows = [row for bits in args.bits for row in measure(bits, args.ranks)]
    head = timing.header()
    fmt = lambda v, spec: "" if v is None else format(v, spec)  # noqa: E731
    lines = ["### bench_feedback: LoCo's error-feedback encode and decode-sum, one GPT-1.3B block", "",
             timing.header_text(head).rstrip(), "",
             "| bits | ranks | way | op | residual | ms | spread % | GB/s (floor) | % of copy |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['bits']} | {r['ranks']} | {r['way']} | {r['op']} | {r['residual']} | {r['ms']:.3f} "
              f"| {r['spread_pct']:.1f} "
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
