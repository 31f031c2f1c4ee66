# Run from the repository root: PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python <this file> (single process, CPU).
# LoCo's error feedback with its residual stored in less precision: the error of Adam's first moment (EMA, beta1 =
# 0.9) of the reduced gradient against the exact one, with the residual kept in fp32, bf16, or as 8/6/4-bit
# symmetric codes with one fp32 scale per bucket of 256 (absmax, round to nearest), after every update. Same
# gradient model and codecs as 2026-11-25_cpu_647a502/gradient_moment_error.py (min-max, Hadamard-rotated, groups of
# 256, round to nearest, beta 0.5).
import importlib.util
from pathlib import Path

import torch

from composer_qsdp.quant import make_codec

# The earlier study's gradient model (its seed, sizes and gradient sequence).
_spec = importlib.util.spec_from_file_location(
    "gradient_moment_error", Path(__file__).parents[1] / "2026-11-25_cpu_647a502" / "gradient_moment_error.py")
_earlier = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_earlier)
W, n, T, grads = _earlier.W, _earlier.n, _earlier.T, _earlier.grads


def store(e, residual):
    """The residual as it comes back from storage."""
    if residual == "fp32":
        return e
    if residual == "bf16":
        return e.to(torch.bfloat16).to(torch.float32)
    bits = int(residual.removeprefix("int"))
    levels = 2 ** (bits - 1) - 1
    blocks = e.view(-1, 256)
    s = blocks.abs().amax(dim=1, keepdim=True) / levels
    s = torch.where(s > 0, s, torch.ones_like(s))
    return (torch.round(blocks / s).clamp(-levels, levels) * s).view(-1)


def run(bits, residual, beta=0.5):
    codec = make_codec("minmax", bits=bits, bucket_size=256, rounding="nearest", hadamard=True)
    e = [torch.zeros(W * n) for _ in range(W)]
    m_q, m, errs, one = torch.zeros(W * n), torch.zeros(W * n), [], []
    for t in range(T):
        gs = grads(t)
        exact = sum(gs) / W
        red = torch.zeros(W * n)
        for r in range(W):
            c = gs[r] + e[r]
            q = codec.decode_rows(codec.encode_rows(c.view(W, n), seed=1000 * t + r), n).reshape(-1)
            e[r] = store(beta * e[r] + (1 - beta) * (c - q), residual)
            red += q / W
        m = 0.9 * m + 0.1 * exact
        m_q = 0.9 * m_q + 0.1 * red
        if t >= 20:
            errs.append(((m_q - m).norm() / m.norm()).item())
            one.append(((red - exact).norm() / exact.norm()).item())
    return sum(one) / len(one), sum(errs) / len(errs)


for bits in (3, 2):
    for residual in ("fp32", "bf16", "int8", "int6", "int4"):
        a, b = run(bits, residual)
        print(f"g{bits} b256 near loco0.5, residual {residual:<5} per-step rel err {a:.3f}  momentum rel err {b:.3f}",
              flush=True)
