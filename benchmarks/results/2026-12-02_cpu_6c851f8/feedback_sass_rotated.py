# Run from the repository root with the trial kernel applied (no GPU: Triton's bundled ptxas compiles for sm_90):
#   D=benchmarks/results/2026-12-02_cpu_6c851f8; git apply $D/rotated_residual_kernel.patch
#   .venv/bin/python $D/feedback_sass_rotated.py > $D/feedback_sass_rotated.md; git apply -R $D/rotated_residual_kernel.patch
# 2026-12-02_cpu_ac6c92b/feedback_sass.py with two more cases: the trial kernel's R_ROTATED path (LoCo's int8
# residual kept in the rotated basis: quantize H x + r', store r', no inverse rotation of the decode), compiled as
# the int8 case is. The trial is not timed: its rows' time columns say so.
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
CASES = ((3, "int8"), (4, "int8"), (3, "int8r"), (4, "int8r"))
POINTER = {"int8r": "*u8", "fp32": "*fp32", "bf16": "*bf16", "int8": "*u8"}
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
    rot = residual == "int8r"
    residual = "int8" if rot else residual
    tested = [v for v in _feedback_variants(True) if " bucket 256 rotate=True stochastic=False " in v["name"]
              and v["types"]["r_ptr"] == POINTER[residual]]
    v = copy.deepcopy(next((t for t in tested if t["constants"]["BITS"] == bits), None) or tested[0])
    assert kernels.rotation_rows(bits, BUCKET) == v["constants"]["LOG_ROW"]
    args, kwargs = launch_arguments(bits, residual)
    v["name"] = f"{bits} bits, {residual}{' rotated' if rot else ''} residual"
    v["constants"]["R_ROTATED"] = rot
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
        regs = usage[v["name"]].split("REG:")[1].split()[0]
        groups = " | ".join(f"{sum(c.get(op, 0) for op in ops) / per_thread:.1f}" for ops in GROUPS.values())
        if residual == "int8r":
            print(f"| {bits} | int8, rotated basis (trial) | {regs} | {sass} | {per_thread} | {sass / per_thread:.1f} | "
                  f"{groups} | not timed | | |")
            continue
        row = next(r for r in timed if r["bits"] == bits and r["way"] == "fused" and r["residual"] == residual)
        print(f"| {bits} | {residual} | {regs} | {sass} | {per_thread} | {sass / per_thread:.1f} | {groups} | "
              f"{row['ms']:.3f} | {row['pct_copy']:.0f} | {1000 * row['ms'] / (sass / per_thread):.2f} us |")
    print("\nColumns after `SASS per element`: instructions per element by kind. `ms per SASS/element`: the H200 time "
          "divided by the instructions per element (the same where the time follows the instructions). Integer "
          "arguments specialized as divisible by 16, as at the launch: "
          + "; ".join(f"{v['name']}: {', '.join(v['divisible'])}" for v in vs) + ".")


if __name__ == "__main__":
    main()
