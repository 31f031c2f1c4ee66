# Run from the repository root on any machine (no GPU: Triton's bundled ptxas compiles for sm_90):
#   D=benchmarks/results/2026-12-06_cpu_76531ca; .venv/bin/python $D/feedback_sass_shapes.py > $D/feedback_sass_shapes.md
# Issue 48 point 2: the rotated feedback encode's SASS per element at its default launch (4 buckets of 256 per
# program, 2 warps: 16 elements per thread) and at one warp (32 per thread), compiled as
# 2026-12-02_cpu_ac6c92b/feedback_sass.py compiles the timed launch (its functions, imported). The launch shape never
# changes the result (the kernel tests and bench_feedback.py's sweep check it bit for bit); it decides how far the
# per-thread fixed work (divisions, reductions, index math) spreads.
import copy
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location(
    "feedback_sass_ac6c92b", ROOT / "benchmarks" / "results" / "2026-12-02_cpu_ac6c92b" / "feedback_sass.py")
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)
SHAPES = ((4, 2), (4, 1))  # (buckets per program, warps)


def main() -> None:
    vs = []
    for bits, residual in old.CASES:
        for bpp, warps in SHAPES:
            v = copy.deepcopy(old.variant(bits, residual))
            v["constants"]["BPP"], v["num_warps"] = bpp, warps
            v["name"] = f"| {bits} | {residual} | {bpp} x {warps}"
            vs.append(v)
    report = old.compile_report(vs)
    print("| bits | residual | buckets per program x warps | elements per thread | registers | local (spill) bytes "
          "| SASS per thread | SASS per element |")
    print("|---|---|---|---|---|---|---|---|")
    for v in vs:
        counts, k, usage = report["opcodes"][v["name"]], v["constants"], report["usage"][v["name"]]
        per_thread = k["BPP"] * k["BUCKET"] // (32 * v["num_warps"])
        regs, local = usage.split("REG:")[1].split()[0], usage.split("LOCAL:")[1].split()[0]
        sass = sum(counts.values())
        print(f"{v['name']} | {per_thread} | {regs} | {local} | {sass} | {sass / per_thread:.1f} |")


if __name__ == "__main__":
    main()
