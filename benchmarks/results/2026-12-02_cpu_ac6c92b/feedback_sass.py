# Run from the repository root on any machine (no GPU: Triton's bundled ptxas compiles for sm_90):
#   D=benchmarks/results/2026-12-02_cpu_ac6c92b; .venv/bin/python $D/feedback_sass.py > $D/feedback_sass.md
# Issue 48 point 2: what one thread of the fused error-feedback encode issues (SASS instructions by opcode, the
# kernel having no loops) in the launch bench_feedback.py timed on an H200 at git 5251474 (one GPT-1.3B block on 4
# ranks, Hadamard-rotated min-max in buckets of 256, round to nearest), beside those times. The compile takes the GPU
# launch shape the kernel tests compile (test_minmax_kernels._feedback_variants) and the launch's own integer
# arguments, captured from the launcher on CPU without running the kernel: Triton specializes an integer argument
# divisible by 16 at a launch, and that decides whether the loads and stores are vectorized.
# If the times follow the instructions per element rather than the bytes, the kernel is bound by issuing
# instructions, and the instructions per element it may issue at 70% of a copy's bandwidth follow from the rate.
import copy
import inspect
import json
import os
import sys
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "tests" / "kernels"), str(ROOT / "tests"), str(ROOT / "benchmarks")]
os.environ.setdefault("TRITON_INTERPRET", "1")  # the kernels import as the CPU tests import them

import torch  # noqa: E402
from bench_feedback import BLOCK_1_3B, make_residual  # noqa: E402
from hopper import compile_report  # noqa: E402
from test_minmax_kernels import _feedback_variants  # noqa: E402

from composer_qsdp.kernels import backend  # noqa: E402
from composer_qsdp.kernels import minmax as kernels  # noqa: E402
from composer_qsdp.quant import HadamardCodec, MinMaxCodec  # noqa: E402

TIMED = ROOT / "benchmarks" / "results" / "2026-11-30_h200x2_5251474" / "bench_feedback.json"
RANKS, BUCKET = 4, 256
CASES = ((3, "fp32"), (3, "bf16"), (3, "int8"), (2, "int8"), (4, "int8"))
POINTER = {"fp32": "*fp32", "bf16": "*bf16", "int8": "*u8"}
GROUPS = {"FADD": ("FADD",), "FMUL/FFMA": ("FMUL", "FFMA"), "min/max/select": ("FMNMX", "VIMNMX", "FSEL", "SEL"),
          "integer/logic": ("IADD3", "IMAD", "LOP3", "SHF", "ISETP", "FSETP", "LEA", "PRMT", "VIADD", "P2R", "MOV"),
          "global ld/st": ("LDG", "STG"), "shared/shuffle/barrier": ("LDS", "LDSM", "STS", "SHFL", "BAR")}


def launch_arguments(bits: int, residual: str) -> tuple[dict, dict]:
    """The kernel's runtime arguments by name and its keyword arguments at bench_feedback's call, from the launcher."""
    n = -(-BLOCK_1_3B // RANKS)
    codec = HadamardCodec(MinMaxCodec(bits=bits, bucket_size=BUCKET, rounding="nearest"))
    x = torch.zeros(RANKS, n, dtype=torch.bfloat16)
    r = make_residual(residual, torch.zeros(RANKS, n), BUCKET)
    calls = []
    launcher = mock.MagicMock()
    launcher.__getitem__.return_value = lambda *args, **kwargs: calls.append((args, kwargs))
    with mock.patch.object(kernels, "_quantize_feedback_kernel", launcher), backend("triton"):
        codec.encode_rows_feedback(x, r, 0.5)
    args, kwargs = calls[-1]
    names = [p for p, v in inspect.signature(kernels._quantize_feedback_kernel.fn).parameters.items()
             if "constexpr" not in str(v.annotation)]
    return dict(zip(names, args)), kwargs


def variant(bits: int, residual: str) -> dict:
    """The GPU launch shape the kernel tests compile, specialized as the launch's arguments specialize it."""
    tested = [v for v in _feedback_variants(True) if " bucket 256 rotate=True stochastic=False " in v["name"]
              and v["types"]["r_ptr"] == POINTER[residual]]
    v = copy.deepcopy(next((t for t in tested if t["constants"]["BITS"] == bits), None) or tested[0])
    assert kernels.rotation_rows(bits, BUCKET) == v["constants"]["LOG_ROW"]
    args, kwargs = launch_arguments(bits, residual)
    v["name"] = f"{bits} bits, {residual} residual"
    v["constants"].update(BITS=bits, R_ALIGN=kwargs["R_ALIGN"])
    v["divisible"] = [k for k, a in args.items() if type(a) is int and a % 16 == 0 and k not in ("seed", "offset")]
    return v


def main() -> None:
    vs = [variant(bits, residual) for bits, residual in CASES]
    report = compile_report(vs)
    usage, counts = report["usage"], report["opcodes"]
    timed = json.loads(TIMED.read_text())["rows"]
    print("| bits | residual | registers | SASS per thread | elements per thread | SASS per element | "
          + " | ".join(GROUPS) + " | H200 ms (5251474) | % of copy | ms per SASS/element |")
    print("|---|---|---|---|---|---|" + "---|" * len(GROUPS) + "---|---|---|")
    for (bits, residual), v in zip(CASES, vs):
        c, k = counts[v["name"]], v["constants"]
        per_thread = k["BPP"] * k["BUCKET"] // (32 * v["num_warps"])
        sass = sum(c.values())
        row = next(r for r in timed if r["bits"] == bits and r["way"] == "fused" and r["residual"] == residual)
        regs = usage[v["name"]].split("REG:")[1].split()[0]
        groups = " | ".join(f"{sum(c.get(op, 0) for op in ops) / per_thread:.1f}" for ops in GROUPS.values())
        print(f"| {bits} | {residual} | {regs} | {sass} | {per_thread} | {sass / per_thread:.1f} | {groups} | "
              f"{row['ms']:.3f} | {row['pct_copy']:.0f} | {1000 * row['ms'] / (sass / per_thread):.2f} us |")
    print("\nColumns after `SASS per element`: instructions per element by kind. `ms per SASS/element`: the H200 time "
          "divided by the instructions per element (the same where the time follows the instructions). Integer "
          "arguments specialized as divisible by 16, as at the launch: "
          + "; ".join(f"{v['name']}: {', '.join(v['divisible'])}" for v in vs) + ".")


if __name__ == "__main__":
    main()
