# Run from the repository root: PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python <this file> [SIGMA ...]
# (single process, CPU, about 10 s per SIGMA).
# Issue 48's candidate for a faster int8 feedback encode keeps LoCo's residual in the rotated basis (r' = H r: the
# kernel quantizes H x + r' and stores r', with no inverse rotation). In exact arithmetic that is the same recursion;
# what changes is where the residual's 8-bit storage rounds: today each bucket of 256 of r is coded (abs-max, nearest),
# the candidate codes each bucket of r' = H r. This study measures what that does to the errors that order the seed
# protocol's gaps (2026-12-01_cpu_f1a55b1): per step, first moment, Adam's update, beside an fp32 residual (no storage
# error) and the storage's own relative error. The gradient model, its SIGMA and the averaging are that study's
# (its script is imported, unchanged).
import importlib.util
import sys
from pathlib import Path

import torch

from composer_qsdp.quant import hadamard_rows, make_codec

_SPEC = importlib.util.spec_from_file_location(
    "adam_update_error", Path(__file__).parents[1] / "2026-12-01_cpu_f1a55b1" / "adam_update_error.py")
study = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(study)
W, n, T, B1, B2, EPS = study.W, study.n, study.T, study.B1, study.B2, study.EPS
GROUP = 256  # the presets' Hadamard groups, which are also the residual's int8 buckets

CODECS = {  # label: codec options (LoCo's gradients, beta 0.5)
    "w8g4-loco's g4": dict(bits=4, bucket_size=GROUP, rounding="nearest", hadamard=True),
    "qwd-w3g3-loco's g3": dict(bits=3, bucket_size=GROUP, rounding="nearest", hadamard=True),
    "qwd-w3g2-loco's g2": dict(bits=2, bucket_size=GROUP, rounding="nearest", hadamard=True),
}
STORAGES = ("fp32", "int8", "int8 rotated")


def rotate(e):
    """Each rank's row of groups of 256, by the codec's normalized Walsh-Hadamard matrix (its own inverse)."""
    return hadamard_rows(e.view(1, -1), GROUP, e.numel(), torch.float32).view(-1)


def store(e, storage):
    """The residual as storage gives it back: exact, 8-bit codes of r (the presets), or 8-bit codes of H r decoded
    and rotated back (the candidate; the same as keeping H r, up to fp32 rounding of the two rotations)."""
    if storage == "fp32":
        return e
    if storage == "int8":
        return study.store(e, "int8")
    return rotate(study.store(rotate(e), "int8"))


def run(grads, small, options, storage, beta=0.5):
    codec = make_codec("minmax", **options)
    e = [torch.zeros(W * n) for _ in range(W)]
    m, v, m_q, v_q = (torch.zeros(W * n) for _ in range(4))
    one, mom, upd, grow, stored = [], [], [], [], []
    for t in range(T):
        gs = grads(t)
        exact = sum(gs) / W
        red = torch.zeros(W * n)
        for r in range(W):
            c = gs[r] + e[r]
            q = codec.decode_rows(codec.encode_rows(c.view(W, n), seed=1000 * t + r), n).reshape(-1)
            target = beta * e[r] + (1 - beta) * (c - q)
            e[r] = store(target, storage)
            if t >= 20 and r == 0:
                stored.append(((e[r] - target).norm() / target.norm()).item())
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
    return [sum(xs) / len(xs) for xs in (one, mom, upd, grow, stored)]


if __name__ == "__main__":
    print("| SIGMA | gradients | residual | per-step | momentum | Adam update | v_q / v, smallest quarter | "
          "residual storage error |\n|---|---|---|---|---|---|---|---|")
    for sigma in [float(a) for a in sys.argv[1:]] or [0.4, 1.0]:
        grads, scale = study.gradient_model(sigma)
        small = scale <= scale.quantile(0.25)
        for label, options in CODECS.items():
            for storage in STORAGES:
                cells = run(grads, small, options, storage)
                print(f"| {sigma} | {label} | {storage} | " + " | ".join(f"{x:.4f}" for x in cells) + " |", flush=True)
