# Run from the repository root on any machine (no GPU):
#   D=benchmarks/results/2026-12-03_cpu_acf3aa7
#   .venv/bin/python $D/sass_by_line.py 3 int8 > $D/sass_by_line_3b_int8.txt
# The SASS of the fused error-feedback encode in the launch 2026-12-02_cpu_ac6c92b/feedback_sass.py compiles (bits and
# residual dtype as arguments), counted by the source line that nvdisasm's line table gives each instruction (the
# innermost inlined frame), opcodes without modifiers. "division slow path" is the subroutine the IEEE divisions
# (div_rn) call only for operands their fast path cannot round (zero, infinite, NaN or subnormal quotients).
import collections
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location(
    "feedback_sass_ac6c92b", ROOT / "benchmarks" / "results" / "2026-12-02_cpu_ac6c92b" / "feedback_sass.py")
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)

_COMPILE = """
import importlib, inspect, json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
v = json.loads(sys.stdin.read())
kernel = getattr(importlib.import_module(v["module"]), v["kernel"])
for p in kernel.params:
    if p.is_constexpr and p.name not in v["constants"] and p.default is not inspect.Parameter.empty:
        v["constants"][p.name] = p.default
sig = {p.name: "constexpr" if p.is_constexpr else v["types"].get(p.name, "i32") for p in kernel.params}
aligned = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(kernel.params)
           if p.name.endswith("ptr") or p.name in set(v["divisible"])}
compiled = triton.compile(ASTSource(kernel, sig, v["constants"], aligned), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": v["num_warps"], "enable_fp_fusion": False})
sys.stdout.buffer.write(compiled.asm["cubin"])
"""


def main() -> None:
    bits, residual = int(sys.argv[1]), sys.argv[2]
    v = old.variant(bits, residual)
    env = {k: val for k, val in os.environ.items() if k != "TRITON_INTERPRET"}
    cubin = subprocess.run([sys.executable, "-c", _COMPILE], input=json.dumps(v).encode(), capture_output=True,
                           env=env, check=True).stdout
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"feedback_{bits}b_{residual}.cubin"
    path.write_bytes(cubin)
    import triton
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    listing = subprocess.run([str(tool), "-gi", str(path)], capture_output=True, text=True, check=True).stdout
    where, counts, ops = None, collections.Counter(), collections.defaultdict(collections.Counter)
    for line in listing.splitlines():
        m = re.search(r'//## File "(.*?)", line (\d+)', line)
        if m:
            where = f"{Path(m.group(1)).name}:{m.group(2)}"
            continue
        if re.match(r"\$__internal_\d+_\$__cuda_\w*div\w*slowpath:", line.strip()):
            where = "division slow path"
        m = re.search(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if m and m.group(1) != "NOP":
            counts[where] += 1
            ops[where][m.group(1).split(".")[0]] += 1
    print(f"{v['name']}: {sum(counts.values())} SASS instructions per thread, 16 elements per thread")
    for key, n in sorted(counts.items(), key=lambda kv: (kv[0].split(":")[0], int(kv[0].split(":")[-1])
                                                          if kv[0][-1].isdigit() else 0)):
        print(f"{n:5d}  {key:24s} " + " ".join(f"{o}:{c}" for o, c in ops[key].most_common()))


if __name__ == "__main__":
    main()
