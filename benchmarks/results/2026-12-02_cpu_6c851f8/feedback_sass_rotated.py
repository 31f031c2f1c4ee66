# Run from the repository root with the trial kernel applied (no GPU: Triton's bundled ptxas compiles for sm_90):
#   D=benchmarks/results/2026-12-02_cpu_6c851f8; git apply $D/rotated_residual_kernel.patch
#   .venv/bin/python $D/feedback_sass_rotated.py > $D/feedback_sass_rotated.md; git apply -R $D/rotated_residual_kernel.patch
# 2026-12-02_cpu_ac6c92b/feedback_sass.py's count (its script imported, unchanged) for the int8 residual at 3 and 4
# bits, beside the trial kernel's R_ROTATED path (LoCo's int8 residual kept in the rotated basis: quantize H x + r',
# store r', no inverse rotation of the decode), compiled as the int8 case is. The trial is not timed.
import importlib.util
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location(
    "feedback_sass", Path(__file__).parents[1] / "2026-12-02_cpu_ac6c92b" / "feedback_sass.py")
sass = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(sass)


def rotated(bits: int) -> dict:
    """The int8 case's compile with the trial's rotated-basis residual."""
    v = sass.variant(bits, "int8")
    v["name"] = f"{bits} bits, int8 residual, rotated basis"
    v["constants"]["R_ROTATED"] = True
    return v


def main() -> None:
    vs = [variant for bits in (3, 4) for variant in (sass.variant(bits, "int8"), rotated(bits))]
    report = sass.compile_report(vs)
    print("| bits | residual | registers | SASS per thread | elements per thread | SASS per element | "
          + " | ".join(sass.GROUPS) + " |")
    print("|---|---|---|---|---|---|" + "---|" * len(sass.GROUPS))
    for v in vs:
        c, k = report["opcodes"][v["name"]], v["constants"]
        per_thread = k["BPP"] * k["BUCKET"] // (32 * v["num_warps"])
        total = sum(c.values())
        regs = report["usage"][v["name"]].split("REG:")[1].split()[0]
        groups = " | ".join(f"{sum(c.get(op, 0) for op in ops) / per_thread:.1f}" for ops in sass.GROUPS.values())
        residual = "int8, rotated basis (trial)" if k.get("R_ROTATED") else "int8 (the presets)"
        print(f"| {k['BITS']} | {residual} | {regs} | {total} | {per_thread} | {total / per_thread:.1f} | {groups} |")


if __name__ == "__main__":
    main()
