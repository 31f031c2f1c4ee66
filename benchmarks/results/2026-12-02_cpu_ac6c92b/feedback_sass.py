# Run from the repository root on any machine (no GPU: Triton's bundled ptxas compiles for sm_90):
#   D=benchmarks/results/2026-12-02_cpu_ac6c92b; .venv/bin/python $D/feedback_sass.py > $D/feedback_sass.md
# Issue 48 point 2: what one thread of the fused error-feedback encode issues (SASS instructions by opcode, the
# kernels having no loops), in the launch shapes the kernel tests compile (test_minmax_kernels._feedback_variants,
# 16-byte aligned rows), beside the H200 times of bench_feedback.py at git 5251474 (one GPT-1.3B block on 4 ranks).
# If a variant's time follows its instructions per element rather than its bytes, the kernel is bound by issuing
# instructions, and the instructions per element it may issue at 70% of a copy's bandwidth follow from the rate.
import copy
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "tests" / "kernels"), str(ROOT / "tests")]
import os  # noqa: E402

os.environ.setdefault("TRITON_INTERPRET", "1")  # the test module imports the kernels as the CPU tests do
from hopper import opcode_counts, resource_usage  # noqa: E402
from test_minmax_kernels import _feedback_variants  # noqa: E402

from composer_qsdp.kernels import minmax as kernels  # noqa: E402

TIMED = ROOT / "benchmarks" / "results" / "2026-11-30_h200x2_5251474" / "bench_feedback.json"
RESIDUAL = {"fp32": "fp32", "bf16": "bf16", "u8": "int8"}
GROUPS = {"FADD": ("FADD",), "FMUL/FFMA": ("FMUL", "FFMA"), "min/max/select": ("FMNMX", "VIMNMX", "FSEL", "SEL"),
          "integer/logic": ("IADD3", "IMAD", "LOP3", "SHF", "ISETP", "FSETP", "LEA", "PRMT", "VIADD", "P2R", "MOV"),
          "global ld/st": ("LDG", "STG"), "shared/shuffle/barrier": ("LDS", "LDSM", "STS", "SHFL", "BAR")}


def variants() -> list[dict]:
    chosen = [v for v in _feedback_variants(True) if " bucket 256 rotate=True stochastic=False " in v["name"]
              and v["constants"]["BITS"] in (2, 3)]
    four = copy.deepcopy(next(v for v in chosen if v["constants"]["BITS"] == 3 and v["types"]["r_ptr"] == "*u8"))
    assert kernels.rotation_rows(4, 256) == four["constants"]["LOG_ROW"]
    four["constants"]["BITS"] = 4  # w8g4-loco's and the 4-bit rows' of bench_feedback: rotated, to nearest
    four["name"] = four["name"].replace("feedback 3b", "feedback 4b")
    return [v for v in chosen if v["constants"]["BITS"] == 3 or v["types"]["r_ptr"] == "*u8"] + [four]


def main() -> None:
    vs = variants()
    usage, counts = resource_usage(vs), opcode_counts(vs)
    timed = json.loads(TIMED.read_text())["rows"]
    print("| bits | residual | registers | SASS per thread | elements per thread | SASS per element | "
          + " | ".join(GROUPS) + " | H200 ms (5251474) | % of copy | ms per SASS/element |")
    print("|---|---|---|---|---|---|" + "---|" * len(GROUPS) + "---|---|---|")
    for v in vs:
        c, k = counts[v["name"]], v["constants"]
        per_thread = k["BPP"] * k["BUCKET"] // (32 * v["num_warps"])
        sass = sum(c.values())
        residual = RESIDUAL[v["types"]["r_ptr"][1:]]
        row = next(r for r in timed if r["bits"] == k["BITS"] and r["way"] == "fused" and r["residual"] == residual)
        regs = usage[v["name"]].split("REG:")[1].split()[0]
        groups = " | ".join(f"{sum(c.get(op, 0) for op in ops) / per_thread:.1f}" for ops in GROUPS.values())
        print(f"| {k['BITS']} | {residual} | {regs} | {sass} | {per_thread} | {sass / per_thread:.1f} | {groups} | "
              f"{row['ms']:.3f} | {row['pct_copy']:.0f} | {1000 * row['ms'] / (sass / per_thread):.2f} us |")
    print("\nColumns after `SASS per element`: instructions per element by kind. `ms per SASS/element`: the H200 time "
          "divided by the instructions per element (the same where the time follows the instructions).")


if __name__ == "__main__":
    main()
