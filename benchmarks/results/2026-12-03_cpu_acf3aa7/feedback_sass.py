# Run from the repository root on any machine (no GPU: Triton's bundled ptxas compiles for sm_90):
#   D=benchmarks/results/2026-12-03_cpu_acf3aa7; .venv/bin/python $D/feedback_sass.py > $D/feedback_sass.md
# Issue 48 point 2: what one thread of the fused error-feedback encode issues (SASS instructions by opcode, the kernel
# having no loops) in the launch bench_feedback.py times, compiled exactly as 2026-12-02_cpu_ac6c92b/feedback_sass.py
# compiles it (its functions, imported), for the kernels of this tree. No H200 times: those of that record are of the
# kernels before this change.
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location(
    "feedback_sass_ac6c92b", ROOT / "benchmarks" / "results" / "2026-12-02_cpu_ac6c92b" / "feedback_sass.py")
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)


def print_table(vs: list[dict], labels: list[tuple], columns: list[str]) -> dict:
    """Print the SASS table of the variants ``vs`` (one row each, led by its ``labels`` cells under ``columns``) and
    return each variant's opcode counts by name."""
    report = old.compile_report(vs)
    usage, counts = report["usage"], report["opcodes"]
    print("| " + " | ".join(columns) + " | registers | SASS per thread | elements per thread | SASS per element | "
          + " | ".join(old.GROUPS) + " |")
    print("|---" * len(columns) + "|---|---|---|---|" + "---|" * len(old.GROUPS))
    for label, v in zip(labels, vs):
        c, k = counts[v["name"]], v["constants"]
        per_thread = k["BPP"] * k["BUCKET"] // (32 * v["num_warps"])
        sass = sum(c.values())
        regs = usage[v["name"]].split("REG:")[1].split()[0]
        groups = " | ".join(f"{sum(c.get(op, 0) for op in ops) / per_thread:.1f}" for ops in old.GROUPS.values())
        print(f"| {' | '.join(map(str, label))} | {regs} | {sass} | {per_thread} | {sass / per_thread:.1f} | {groups} |")
    print("\nColumns after `SASS per element`: instructions per element by kind (the groups of ac6c92b's script). "
          "Integer arguments specialized as divisible by 16, as at the launch: "
          + "; ".join(f"{v['name']}: {', '.join(v['divisible']) or 'none'}" for v in vs) + ".")
    return counts


def main() -> None:
    print_table([old.variant(bits, residual) for bits, residual in old.CASES], old.CASES, ["bits", "residual"])


if __name__ == "__main__":
    main()
