# Run from the repository root on any machine (no GPU: Triton's bundled ptxas compiles for sm_90):
#   D=benchmarks/results/2026-12-06_cpu_54e724b; .venv/bin/python $D/rotated_residual_sass.py > $D/rotated_residual_sass.md
# Issue 48 point 2: would keeping LoCo's residual in the rotated domain (R = H r, so H(x + r) = Hx + R and the
# error needs no rotation back) bring the int8-residual encode near 70% of a copy? This compiles the fused encode
# of composer_qsdp/kernels/minmax.py as it is and a variant of it, written to a temporary module by three text
# replacements below, that adds the residual after the rotation, takes the error in the rotated domain and stores
# it there (over the padded row): the arithmetic of that design, in the tile layouts Triton picks for it. Launch
# as bench_feedback.py's (one GPT-1.3B block on 4 ranks, 3-bit min-max, buckets of 256, round to nearest), at 16
# and 32 elements per thread; SASS per element by kind as 2026-12-02_cpu_ac6c92b/feedback_sass.py counts them.
import copy
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location(
    "feedback_sass_ac6c92b", ROOT / "benchmarks" / "results" / "2026-12-02_cpu_ac6c92b" / "feedback_sass.py")
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)

REPLACEMENTS = (
    ("""        c = _fp32(tl.load(x_row + e, mask=on, other=0.0))
        if FEEDBACK:
            r = _load_residual(r_row, e, on, r_meta_offset, num_buckets, BPP, FLAT, CODED)
            c = c + r
        xt = butterflies_rows(c, LOG_B - LOG_ROW, LOG_ROW) * scale_rot if ROWS else c
""", """        c = _fp32(tl.load(x_row + e, mask=on, other=0.0))
        xt = butterflies_rows(c, LOG_B - LOG_ROW, LOG_ROW) * scale_rot
        r = _load_residual(r_row, e, valid, r_meta_offset, num_buckets, BPP, FLAT, CODED)
        xt = xt + r
"""),
    ("""        if ROWS:
            decoded = butterflies_rows(decoded, LOG_B - LOG_ROW, LOG_ROW) * scale_rot
""", """        if ROWS:
            c = xt
"""),
    ("_store_coded_residual(r_row, r, pid, b, g, lane, e, on, n_in, num_buckets,",
     "_store_coded_residual(r_row, r, pid, b, g, lane, e, valid, n, num_buckets,"),
)
BITS = (3, 2, 4)
SHAPES = ((4, 2), (4, 1))  # (buckets per program, warps): 16 and 32 elements per thread


def rotated_residual_module(directory: str) -> str:
    """Write the variant next to nothing else in ``directory``; return its module name."""
    source = (ROOT / "composer_qsdp" / "kernels" / "minmax.py").read_text()
    for before, after in REPLACEMENTS:
        assert source.count(before) == 1, f"the kernel changed: {before[:60]!r}"
        source = source.replace(before, after)
    Path(directory, "minmax_rotated_residual.py").write_text(source)
    return "minmax_rotated_residual"


def main() -> None:
    with tempfile.TemporaryDirectory() as directory:
        module = rotated_residual_module(directory)
        os.environ["PYTHONPATH"] = os.pathsep.join([directory, *sys.path])  # the compile runs in a subprocess
        vs = []
        for bits in BITS:
            for name, mod in (("as landed", "composer_qsdp.kernels.minmax"), ("rotated", module)):
                for bpp, warps in SHAPES:
                    v = copy.deepcopy(old.variant(bits, "int8"))
                    v["module"], v["constants"]["BPP"], v["num_warps"] = mod, bpp, warps
                    v["name"] = f"| {bits} | {name} | {bpp * 256 // (32 * warps)}"
                    vs.append(v)
        report = old.compile_report(vs)
    print("| bits | residual domain | elements per thread | registers | local bytes | SASS per element | "
          + " | ".join(old.GROUPS) + " | other |")
    print("|---|---|---|---|---|---|" + "---|" * (len(old.GROUPS) + 1))
    for v in vs:
        c, k, usage = report["opcodes"][v["name"]], v["constants"], report["usage"][v["name"]]
        per_thread = k["BPP"] * k["BUCKET"] // (32 * v["num_warps"])
        kinds = [sum(c.get(op, 0) for op in ops) for ops in old.GROUPS.values()]
        other = sum(c.values()) - sum(kinds)
        print(f"{v['name']} | {usage.split('REG:')[1].split()[0]} | {usage.split('LOCAL:')[1].split()[0]} | "
              f"{sum(c.values()) / per_thread:.1f} | " + " | ".join(f"{n / per_thread:.1f}" for n in kinds)
              + f" | {other / per_thread:.1f} |")


if __name__ == "__main__":
    main()
