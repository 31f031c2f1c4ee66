"""CPU checks of the kernel benchmarks' shared harness (``benchmarks/kernel_timing.py``): the bandwidth and
%-of-copy arithmetic, the table, and both benchmarks' measurement loops with a stand-in for ``do_bench`` (the
real runs need a CUDA GPU)."""

from __future__ import annotations

import bench_kernels
import bench_symmetric_hadamard
import kernel_timing as timing
import pytest
import torch


def test_row_arithmetic_and_table() -> None:
    # 50 MB in 20 us is 2500 GB/s; against a 3200 GB/s copy that is 78.125 %.
    row = timing.make_row(16 * timing.MI, torch.bfloat16, "quantize", 4, "nearest", nbytes=50_000_000, ms=0.02,
                          spread_pct=3.0, roof_gbps=3200.0)  # fmt: skip
    assert row["gbps"] == pytest.approx(2500.0)
    assert row["pct_copy"] == pytest.approx(78.125)
    assert row["eager_ms"] is None
    eager = dict(row, op="dequantize", eager_ms=0.1, eager_gbps=500.0)
    lines = timing.table([row, eager], {"16M bf16": 3200.0}).splitlines()
    assert lines[2] == "| 16M | bf16 | quantize | 4 | nearest | 20.0 | 3 | 2500 | 78.1 | - | - | - |"
    assert lines[3] == "| 16M | bf16 | dequantize | 4 | nearest | 20.0 | 3 | 2500 | 78.1 | 100 | 500 | 5.0x |"
    assert lines[-1] == "Copy (read + write) GB/s: 16M bf16: 3200"


@pytest.fixture
def cpu_timing(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The harness on CPU at 1/1024 of the sizes, every timed call taking 1 ms; returns the calls made."""
    calls: list[int] = []

    def fake_do_bench(fn, warmup: int, rep: int, return_mode: str) -> float:
        assert (warmup, rep, return_mode) == (10, 50, "median")
        fn()
        calls.append(1)
        return 1.0

    monkeypatch.setattr(timing, "do_bench", fake_do_bench)
    monkeypatch.setattr(timing, "DEVICE", "cpu")
    monkeypatch.setattr(timing, "MI", 1024)
    return calls


def test_bench_kernels_measure_on_cpu(cpu_timing: list[int]) -> None:
    rows, copies = timing.measure_grid(True, lambda r, bits: bench_kernels._measure(r, bits, 1024, eager_bits=4))
    size = 16 * 1024
    # Copy roof: read + write of 16K bf16 elements in 1 ms.
    assert copies == {"16M bf16": pytest.approx(2 * size * 2 / 1e6)}
    ops = [(r["op"], r["bits"], r["rounding"]) for r in rows]
    assert ops[:5] == [("quantize", 8, "stochastic"), ("quantize", 8, "nearest"), ("dequantize", 8, "-"),
                       ("decode_sum (8 rows)", 8, "-"), ("quantize", 4, "stochastic")]  # fmt: skip
    assert ("quantize (unaligned counters)", 4, "stochastic") in ops
    quantize = rows[0]
    assert quantize["bytes"] == 2 * size + bench_kernels.MinMaxCodec(bits=8, bucket_size=1024).wire_bytes(size)
    assert quantize["pct_copy"] == pytest.approx(100 * quantize["bytes"] / (4 * size))
    eager = [r["eager_ms"] is not None for r in rows]
    assert eager == [r["bits"] == 4 and "unaligned" not in r["op"] for r in rows]
    # The copy once, every Triton call twice (the faster median wins), every eager call once.
    assert len(cpu_timing) == 1 + 2 * len(rows) + sum(eager)


def test_bench_symmetric_hadamard_measure_on_cpu(cpu_timing: list[int]) -> None:
    rows, _ = timing.measure_grid(True, lambda r, bits: bench_symmetric_hadamard._measure(r, bits, 2048))
    ops = [r["op"] for r in rows]
    assert ops[-6:] == ["hadamard order 32", "hadamard order 128", "hadamard order 1024", "hadamard + quantize",
                        "dequantize + hadamard", "decode_sum + hadamard (8 rows)"]  # fmt: skip
    assert {r["rounding"] for r in rows} == {"nearest"}
    size = 16 * 1024
    assert rows[ops.index("hadamard order 128")]["bytes"] == 2 * size + 4 * size
    assert rows[ops.index("hadamard order 128")]["eager_ms"] is not None


def test_tables_go_to_the_out_dir_named_on_the_command_line(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("OUT", str(tmp_path / "env"))  # an environment variable names no output folder
    args = timing.arg_parser("doc", bucket_size=1024).parse_args(["--out-dir", str(tmp_path / "dir")])
    timing.write_out(args.out_dir, "bench_x", "| table |", {"rows": [1]})
    assert sorted(p.name for p in (tmp_path / "dir").iterdir()) == ["bench_x.json", "bench_x.md"]
    assert (tmp_path / "dir" / "bench_x.md").read_text() == "| table |\n"
    assert not (tmp_path / "env").exists()
    timing.write_out(timing.arg_parser("doc", bucket_size=1024).parse_args([]).out_dir, "bench_y", "t", {})
    assert not list(tmp_path.glob("**/bench_y*"))
