# Run from the repository root: PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python <this file> (single process, CPU).
# qWD reference error on an Adam trajectory: ||w~_t - w_t|| / ||w_t - w_{t-1}|| averaged over steps.
import torch, math
from composer_qsdp.quant import make_codec
torch.manual_seed(0)
n, T, lr = 1 << 16, 150, 1e-3
scale = torch.exp(torch.randn(n))          # per-coordinate gradient scale (heavy-tailed)
w0 = torch.randn(n) * 0.02
def run(bits, bucket, hadamard):
    codec = make_codec("symmetric", bits=bits, bucket_size=bucket, hadamard=hadamard)
    w, ref = w0.clone(), w0.clone()
    m, v = torch.zeros(n), torch.zeros(n); errs = []
    for t in range(1, T + 1):
        g = (torch.sin(torch.arange(n) * 0.001 + t / 30) + 2 * torch.randn(n, generator=torch.Generator().manual_seed(t))) * scale
        m = 0.9 * m + 0.1 * g; v = 0.95 * v + 0.05 * g * g
        step = lr * (m / (1 - 0.9 ** t)) / ((v / (1 - 0.95 ** t)).sqrt() + 1e-8)
        w_prev = w.clone(); w -= step
        wire = codec.encode_difference_rows(w.view(1, n), ref.view(1, n))
        ref += codec.decode_rows(wire, n).view(-1)
        if t > 10:
            errs.append(((ref - w).norm() / (w - w_prev).norm()).item())
    return sum(errs) / len(errs), codec.wire_bytes(n) * 8 / n
for args in [(4, 2048, False), (3, 2048, False), (3, 2048, True), (3, 256, False), (3, 256, True), (2, 2048, True), (2, 256, True)]:
    e, b = run(*args)
    print(f"W{args[0]} groups {args[1]:>4} hadamard={args[2]!s:<5} bits/elem {b:.3f}  ref error / step size {e:.3f}", flush=True)
