# Run from the repository root on any machine (no GPU: Triton's bundled ptxas compiles for sm_90):
#   D=benchmarks/results/2026-12-06_cpu_54e724b; .venv/bin/python $D/residual_ops.py > $D/residual_ops.md
# Issue 48 point 2: what the int8 residual's own decode and encode add to the fused rotated encode, by SASS opcode
# per element, against the bf16 residual (no codes), both at 32 elements per thread (4 buckets of 256 per program,
# one warp), 3 bits, bench_feedback.py's launch as 2026-12-02_cpu_ac6c92b/feedback_sass.py compiles it.
import copy
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location(
    "feedback_sass_ac6c92b", ROOT / "benchmarks" / "results" / "2026-12-02_cpu_ac6c92b" / "feedback_sass.py")
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)
PER_THREAD = 32


def main() -> None:
    vs = []
    for residual in ("int8", "bf16"):
        v = copy.deepcopy(old.variant(3, residual))
        v["constants"]["BPP"], v["num_warps"], v["name"] = 4, 1, residual
        vs.append(v)
    counts = old.compile_report(vs)["opcodes"]
    a, b = counts["int8"], counts["bf16"]
    ops = sorted(set(a) | set(b), key=lambda op: (-(a.get(op, 0) - b.get(op, 0)), op))
    print("| opcode | int8 residual | bf16 residual | int8 - bf16 |")
    print("|---|---|---|---|")
    for op in ops:
        x, y = a.get(op, 0) / PER_THREAD, b.get(op, 0) / PER_THREAD
        if x or y:
            print(f"| {op} | {x:.2f} | {y:.2f} | {x - y:+.2f} |")
    x, y = sum(a.values()) / PER_THREAD, sum(b.values()) / PER_THREAD
    print(f"| **all** | **{x:.1f}** | **{y:.1f}** | **{x - y:+.1f}** |")


if __name__ == "__main__":
    main()
