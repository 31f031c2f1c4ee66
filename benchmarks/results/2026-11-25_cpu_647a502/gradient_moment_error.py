# Run from the repository root: PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python <this file> (single process, CPU).
# Error of Adam's first moment (EMA, beta1=0.9) of the reduced gradient vs the exact one, per compressor option.
import torch, math
from composer_qsdp.quant import make_codec
torch.manual_seed(0)
W, n, T = 2, 4096, 200
# gradient sequence: slowly drifting signal + per-rank noise (SNR ~ 0.5 per element), heavy-tailed scale per row
scale = torch.exp(torch.randn(W * n) * 1.0)
mu = torch.randn(W * n) * scale
def grads(t):
    drift = mu * math.cos(t / 50) + 0.3 * torch.randn(W * n, generator=torch.Generator().manual_seed(t)) * scale
    return [drift + 2.0 * torch.randn(W * n, generator=torch.Generator().manual_seed(1000 * t + r + 7)) * scale for r in range(W)]
def run(bits, bucket, rounding, ef, beta):
    codec = make_codec("minmax", bits=bits, bucket_size=bucket, rounding=rounding, hadamard=True)
    e = [torch.zeros(W * n) for _ in range(W)]
    m_q = torch.zeros(W * n); m = torch.zeros(W * n); errs = []; one = []
    for t in range(T):
        gs = grads(t)
        exact = sum(gs) / W
        red = torch.zeros(W * n)
        for r in range(W):
            c = gs[r] + e[r] if ef else gs[r]
            q = codec.decode_rows(codec.encode_rows(c.view(W, n), seed=1000 * t + r), n).reshape(-1)
            if ef:
                e[r] = beta * e[r] + (1 - beta) * (c - q)
            red += q / W
        m = 0.9 * m + 0.1 * exact; m_q = 0.9 * m_q + 0.1 * red
        if t >= 20:
            errs.append(((m_q - m).norm() / m.norm()).item()); one.append(((red - exact).norm() / exact.norm()).item())
    return sum(one) / len(one), sum(errs) / len(errs)
CASES = [("g4 b128 stoch", (4, 128, "stochastic", False, 0)), ("g3 b256 stoch", (3, 256, "stochastic", False, 0)),
         ("g2 b256 stoch", (2, 256, "stochastic", False, 0)), ("g2 b256 near", (2, 256, "nearest", False, 0)),
         ("g2 b256 stoch loco0.8", (2, 256, "stochastic", True, 0.8)), ("g2 b256 near loco0.8", (2, 256, "nearest", True, 0.8)),
         ("g2 b256 stoch ef0", (2, 256, "stochastic", True, 0.0)), ("g2 b256 near ef0", (2, 256, "nearest", True, 0.0)),
         ("g2 b256 near loco0.3", (2, 256, "nearest", True, 0.3)), ("g2 b256 near loco0.5", (2, 256, "nearest", True, 0.5)),
         ("g2 b128 near loco0.5", (2, 128, "nearest", True, 0.5)), ("g2 b512 near loco0.5", (2, 512, "nearest", True, 0.5)),
         ("g3 b256 near loco0.5", (3, 256, "nearest", True, 0.5))]
if __name__ == "__main__":  # 2026-11-27_cpu_2a76699 imports the gradient model
    for label, args in CASES:
        a, b = run(*args); print(f"{label:<24} per-step rel err {a:.3f}  momentum rel err {b:.3f}", flush=True)
