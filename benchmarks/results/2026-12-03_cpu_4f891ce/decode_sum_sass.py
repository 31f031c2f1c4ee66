# Run from the repository root on any machine (no GPU: Triton's bundled ptxas compiles for sm_90):
#   D=benchmarks/results/2026-12-03_cpu_4f891ce
#   .venv/bin/python $D/decode_sum_sass.py > $D/decode_sum_sass.md
#   .venv/bin/python $D/decode_sum_sass.py 3 > $D/sass_by_line_3b.txt
# Issue 48 point 2: what one thread of the min-max decode-sum rotated back issues (SASS instructions by opcode, the
# kernel's loop over the W = 4 wire rows being one unrolled step) in the launch bench_feedback.py times:
# HadamardCodec(MinMaxCodec(bits, 256, nearest)).decode_sum of one GPT-1.3B block's reduce-scatter chunk on 4 ranks.
# The compile takes the GPU launch shape the kernel tests compile (test_minmax_kernels._hopper_variant) and the
# launch's own integer arguments, captured from the launcher on CPU without running the kernel (Triton specializes an
# integer argument divisible by 16). Counting is 2026-12-02_cpu_ac6c92b's (groups) and 2026-12-03_cpu_acf3aa7's (by
# source line), their functions imported. With a width as argument: that width's SASS by source line.
import importlib.util
import inspect
import sys
import types
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[3]
RESULTS = ROOT / "benchmarks" / "results"


def _load(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ac6c92b's script puts tests/kernels, tests and benchmarks on the path and sets TRITON_INTERPRET before the kernels
# import.
old = _load("feedback_sass_ac6c92b", RESULTS / "2026-12-02_cpu_ac6c92b" / "feedback_sass.py")
by_line = _load("sass_by_line_acf3aa7", RESULTS / "2026-12-03_cpu_acf3aa7" / "sass_by_line.py")
encode = _load("feedback_sass_acf3aa7", RESULTS / "2026-12-03_cpu_acf3aa7" / "feedback_sass.py")  # its table

import torch  # noqa: E402
from bench_feedback import BLOCK_1_3B  # noqa: E402
from test_minmax_kernels import _hopper_variant  # noqa: E402

from composer_qsdp.kernels import backend, bucket_decode  # noqa: E402
from composer_qsdp.quant import HadamardCodec, MinMaxCodec  # noqa: E402

RANKS, BUCKET, WIDTHS = 4, 256, (2, 3, 4)
# acf3aa7's compile takes constexprs as values; the decode-sum's DECODE_TILE is a jit function, named as the kernel
# tests' compile names it ("jit:<module>:<function>").
by_line._COMPILE = by_line._COMPILE.replace("for p in kernel.params:", """for k, c in list(v["constants"].items()):
    if isinstance(c, str) and c.startswith("jit:"):
        m, f = c[4:].split(":")
        v["constants"][k] = getattr(importlib.import_module(m), f)
for p in kernel.params:""", 1)


def launch_arguments(bits: int) -> tuple[dict, dict]:
    """The kernel's runtime arguments by name and its keyword arguments at bench_feedback's decode-sum call."""
    n = -(-BLOCK_1_3B // RANKS)
    codec = HadamardCodec(MinMaxCodec(bits=bits, bucket_size=BUCKET, rounding="nearest"))
    wire = torch.zeros(RANKS, codec.wire_bytes(n), dtype=torch.uint8)
    calls = []
    launcher = mock.MagicMock()
    launcher.__getitem__.return_value = lambda *args, **kwargs: calls.append((args, kwargs))
    with mock.patch.object(bucket_decode, "_dequantize_sum_kernel", launcher), backend("triton"):
        codec.decode_sum(wire, n)
    args, kwargs = calls[-1]
    names = [p for p, v in inspect.signature(bucket_decode._dequantize_sum_kernel.fn).parameters.items()
             if "constexpr" not in str(v.annotation)]
    return dict(zip(names, args)), kwargs


def variant(bits: int, _residual: object = None) -> dict:
    """The GPU launch shape the kernel tests compile for this decode-sum, specialized as the launch specializes it."""
    args, kwargs = launch_arguments(bits)
    constants = {k: kwargs[k] for k in ("ROWS", "BITS", "DIVIDE", "STEP", "ROTATE", "LOG_B")}
    v = _hopper_variant(f"decode_sum {bits} bits, {RANKS} rows", "_dequantize_sum_kernel",
                        {"out_ptr": "*fp32", "divisor": "fp32", "scale_rot": "fp32"},
                        {**constants, "EMULATE_BF16_RNE": False}, BUCKET, True)  # fmt: skip
    assert all(v["constants"][k] == kwargs[k] for k in ("LOG_ROW", "GROUPS", "BUCKET", "VEC")), (v, kwargs)
    v["divisible"] = [k for k, a in args.items() if type(a) is int and a % 16 == 0]
    return v


def main() -> None:
    if len(sys.argv) > 1:  # acf3aa7's listing by source line, of this launch
        by_line.old = types.SimpleNamespace(variant=variant)
        sys.argv[2:] = ["decode_sum"]  # its second argument, the residual, only names the cubin file
        by_line.main()
        return
    vs = [variant(bits) for bits in WIDTHS]
    counts = encode.print_table(vs, [(bits,) for bits in WIDTHS], ["bits"])
    print("\nOpcodes per thread: " + "; ".join(
        f"{bits} bits: " + " ".join(f"{op}:{c}" for op, c in sorted(counts[v['name']].items(), key=lambda kv: -kv[1]))
        for bits, v in zip(WIDTHS, vs)) + ".")


if __name__ == "__main__":
    main()
