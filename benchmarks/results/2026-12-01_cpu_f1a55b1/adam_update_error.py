# Run from the repository root: PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python <this file> [SIGMA ...]
# (single process, CPU, about 8 s per SIGMA).
# Issue 50's w8g4 gradients against the lossless presets' ones: the error of Adam's update m_hat / (sqrt(v_hat) +
# eps) (beta1 0.9, beta2 0.95, the recipes') computed from the reduced quantized gradient against the one from the
# exact gradient, beside the per-step and first-moment errors of the earlier studies, and the median growth of the
# second moment (v_q / v: the noise's share, which Adam divides by) over the elements of the smallest quarter of
# scales. The gradient model is 2026-11-25_cpu_647a502/gradient_moment_error.py's (2 ranks, a drifting signal and
# per-rank noise, SNR about 0.5 per element) with the spread of its per-element log-normal scales as a parameter,
# SIGMA (1.0 is that study's model): the larger SIGMA, the more a bucket's range is set by a few elements. The real
# codecs; the LoCo residual stored as 8-bit codes, as the presets keep it.
import math
import sys

import torch

from composer_qsdp.quant import make_codec

W, n, T = 2, 4096, 200
B1, B2, EPS = 0.9, 0.95, 1e-8
CASES = {  # label: (codec options, error feedback's beta or None)
    "w8g8's g8: min-max, stochastic, b1024": (dict(bits=8, bucket_size=1024, rounding="stochastic"), None),
    "w8g4's g4: min-max, stochastic, b1024": (dict(bits=4, bucket_size=1024, rounding="stochastic"), None),
    "w8g4-h128: Hadamard, stochastic, b128": (dict(bits=4, bucket_size=128, rounding="stochastic", hadamard=True), None),
    "w8g4-loco: Hadamard, nearest, b256, LoCo": (dict(bits=4, bucket_size=256, rounding="nearest", hadamard=True), 0.5),
    "qwd-w3g3-loco's g3: as -loco, 3 bits": (dict(bits=3, bucket_size=256, rounding="nearest", hadamard=True), 0.5),
}
_G3 = dict(bits=3, bucket_size=256, rounding="nearest", hadamard=True)
#: Issue 46's ablation arms of qwd-w3g3-loco's gradients (convergence_arms._ABLATIONS), one option changed each.
ABLATIONS = {
    "g3, fp32 residual": (_G3, 0.5, "fp32"),
    "g3, bf16 residual": (_G3, 0.5, "bf16"),
    "g3, beta 0 (classic error feedback)": (_G3, 0.0, "int8"),
    "g3, beta 0.8 (DeepSpeed's err_beta)": (_G3, 0.8, "int8"),
    "g3, stochastic rounding": ({**_G3, "rounding": "stochastic"}, 0.5, "int8"),
    "g3, groups of 128": ({**_G3, "bucket_size": 128}, 0.5, "int8"),
    "g3, no Hadamard rotation": ({**_G3, "hadamard": False}, 0.5, "int8"),
    "g3 without feedback (nearest)": (_G3, None, "int8"),
    "g2: qwd-w3g2-loco's": ({**_G3, "bits": 2}, 0.5, "int8"),
}


def gradient_model(sigma):
    """The per-rank gradients of step ``t`` and the per-element scales (the earlier study's model at ``sigma``)."""
    torch.manual_seed(0)
    scale = torch.exp(torch.randn(W * n) * sigma)
    mu = torch.randn(W * n) * scale

    def grads(t):
        drift = mu * math.cos(t / 50) + 0.3 * torch.randn(W * n, generator=torch.Generator().manual_seed(t)) * scale
        return [drift + 2.0 * torch.randn(W * n, generator=torch.Generator().manual_seed(1000 * t + r + 7)) * scale
                for r in range(W)]

    return grads, scale


def store(e, dtype="int8"):
    """The residual as it comes back from storage: fp32, bf16, or as the presets keep it, 8-bit symmetric codes with
    one scale per 256 elements (absmax, nearest)."""
    if dtype == "fp32":
        return e
    if dtype == "bf16":
        return e.to(torch.bfloat16).to(torch.float32)
    blocks = e.view(-1, 256)
    s = blocks.abs().amax(dim=1, keepdim=True) / 127
    s = torch.where(s > 0, s, torch.ones_like(s))
    return (torch.round(blocks / s).clamp(-127, 127) * s).view(-1)


def run(grads, small, options, beta, residual="int8"):
    codec = make_codec("minmax", **options)
    e = [torch.zeros(W * n) for _ in range(W)]
    m, v, m_q, v_q = (torch.zeros(W * n) for _ in range(4))
    one, mom, upd, grow = [], [], [], []
    for t in range(T):
        gs = grads(t)
        exact = sum(gs) / W
        red = torch.zeros(W * n)
        for r in range(W):
            c = gs[r] + e[r] if beta is not None else gs[r]
            q = codec.decode_rows(codec.encode_rows(c.view(W, n), seed=1000 * t + r), n).reshape(-1)
            if beta is not None:
                e[r] = store(beta * e[r] + (1 - beta) * (c - q), residual)
            red += q / W
        m, m_q = B1 * m + (1 - B1) * exact, B1 * m_q + (1 - B1) * red
        v, v_q = B2 * v + (1 - B2) * exact ** 2, B2 * v_q + (1 - B2) * red ** 2
        c1, c2 = 1 - B1 ** (t + 1), 1 - B2 ** (t + 1)
        u, u_q = (m / c1) / ((v / c2).sqrt() + EPS), (m_q / c1) / ((v_q / c2).sqrt() + EPS)
        if t >= 20:
            one.append(((red - exact).norm() / exact.norm()).item())
            mom.append(((m_q - m).norm() / m.norm()).item())
            upd.append(((u_q - u).norm() / u.norm()).item())
            grow.append((v_q[small] / v[small]).median().item())
    return [sum(xs) / len(xs) for xs in (one, mom, upd, grow)]


if __name__ == "__main__":
    for sigma in [float(a) for a in sys.argv[1:]] or [0.4, 0.5, 0.7, 1.0]:
        grads, scale = gradient_model(sigma)
        small = scale <= scale.quantile(0.25)
        print(f"\nSIGMA {sigma}\n{'gradients':<41} per-step  momentum  Adam update  v_q / v (smallest quarter)")
        for label, (options, beta) in CASES.items():
            print(f"{label:<41} {'  '.join(f'{x:8.3f}' for x in run(grads, small, options, beta))}", flush=True)
        for label, (options, beta, residual) in ABLATIONS.items():
            print(f"{label:<41} {'  '.join(f'{x:8.3f}' for x in run(grads, small, options, beta, residual))}",
                  flush=True)
