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

from composer_qsdp.quant import hadamard_rows

_SPEC = importlib.util.spec_from_file_location(
    "adam_update_error", Path(__file__).parents[1] / "2026-12-01_cpu_f1a55b1" / "adam_update_error.py")
study = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(study)
W = study.W
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
    and rotated back (the candidate; the same as keeping H r, up to fp32 rounding of the two rotations). Each call's
    relative storage error is kept in STORED."""
    if storage == "int8 rotated":
        out = rotate(PRESETS_STORE(rotate(e), "int8"))
    else:
        out = PRESETS_STORE(e, storage)
    STORED.append(((out - e).norm() / e.norm()).item())
    return out


PRESETS_STORE, STORED = study.store, []
study.store = store  # the study's run() stores every residual through this


def run(grads, small, options, storage):
    """The study's errors (per-step, momentum, Adam update, v_q / v) with LoCo's beta 0.5, and the storage's relative
    error averaged over the same steps (20-200, both ranks)."""
    STORED.clear()
    errors = study.run(grads, small, options, 0.5, storage)
    kept = STORED[20 * W:]
    return [*errors, sum(kept) / len(kept)]


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
