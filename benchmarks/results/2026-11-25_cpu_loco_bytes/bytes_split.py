"""Where the LoCo presets' bytes go: an independent count (numel x bits / 8 + scales) against a run's counters.

    python benchmarks/results/2026-11-25_cpu_loco_bytes/bytes_split.py RAW_DIR

``RAW_DIR``: the ``raw/`` folder of a convergence run (``benchmarks/convergence.py --collect``), with one folder per
arm holding ``metrics-00.json``. For GPT-125M (seq 512, tied embeddings) on 2 ranks, per rank, NCCL's convention
((W - 1) / W of each collective's volume): each unit's chunk is FSDP2's shard (dim 0 padded to a multiple of W),
the weight differences are symmetric codes in groups of 2048 with one fp32 scale per group, the gradients
Hadamard-rotated min-max codes in groups of 256 (the chunk zero-padded to whole groups) with two fp32 words per
group. Nothing here calls the package's codecs: the formulas are the wire format's definition.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from composer_qsdp.recipes.models.config import gpt_config
from composer_qsdp.recipes.models.gpt import GPT

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/
from wire_bytes import cdiv, hadamard_minmax_bytes, symmetric_bytes  # noqa: E402

W = 2
ARMS = {"qwd-w4g2-loco": (4, 2), "qwd-w3g2-loco": (3, 2), "qwd-w3g3-loco": (3, 3), "qwd-w4g4": (4, 4)}


def unit_chunks() -> list[int]:
    """Elements of each FSDP2 unit's per-rank chunk: the root (embeddings, final norm) and the 12 blocks."""
    with torch.device("meta"):
        model = GPT(gpt_config("125m", position_embedding="learned", tie_word_embeddings=True, max_seq_len=512))
    shard = lambda p: cdiv(p.shape[0], W) * (p.numel() // p.shape[0])  # noqa: E731
    root = [p for n, p in model.named_parameters() if not n.startswith("blocks.")]
    return [sum(shard(p) for p in unit) for unit in [root, *(list(b.parameters()) for b in model.blocks)]]


def expected(weight_bits: int, grad_bits: int) -> dict[str, int]:
    """Per-step bytes of one rank, by category (``k`` = 1 reduce-scatter; multiply the grads by the microbatches)."""
    chunks = unit_chunks()
    grad_group = 128 if grad_bits == 4 else 256  # qwd-w4g4: groups of 128; the loco presets: 256
    return {
        "numel_per_rank": sum(chunks),
        "weights_bf16_gather": (W - 1) * 2 * sum(chunks),
        "weights_update": (W - 1) * sum(symmetric_bytes(n, weight_bits, 2048) for n in chunks),
        "grads_fp32_rs": (W - 1) * 4 * sum(chunks),
        "grads_rs": (W - 1) * sum(hadamard_minmax_bytes(n, grad_bits, grad_group) for n in chunks),
        "loco_residual_gather_per_checkpoint": (W - 1) * 4 * W * sum(chunks),
    }


def main(raw: Path) -> None:
    for arm, (wb, gb) in ARMS.items():
        path = raw / arm / "metrics-00.json"
        if not path.is_file():
            continue
        data = json.loads(path.read_text())
        series = {k: dict(v) for k, v in data["metrics"].items()}
        comm = data["communication"]["QSDP"]
        e = expected(wb, gb)
        steps = max(series["qsdp/weights/bytes_sent"])
        w, g = series["qsdp/weights/bytes_sent"], series["qsdp/grads/bytes_sent"]
        k = round(g[2] / e["grads_rs"])
        assert g[2] == k * e["grads_rs"], (arm, g[2], e["grads_rs"])
        assert w[1] == e["weights_bf16_gather"] and all(w[s] == e["weights_update"] for s in range(2, steps + 1))
        evals = len(series.get("metrics/val/LanguageCrossEntropy", {}))
        extra_gathers = (comm["weights"]["sent"] - sum(w.values())) // e["weights_update"]
        sent = comm["total"]["sent"]
        preset_sent = e["weights_update"] + e["grads_rs"]
        preset_base = 2 * e["weights_bf16_gather"] + e["grads_fp32_rs"]
        run_base = e["weights_bf16_gather"] + k * e["grads_fp32_rs"]
        run_sent = e["weights_update"] + k * e["grads_rs"]
        fsdp2_base = 2 * k * e["weights_bf16_gather"] + k * e["grads_fp32_rs"]
        print(f"## {arm}: {steps} steps, {k} microbatches (reduce-scatters) per step, {evals} evaluations")
        print(f"  per step, per rank: weight update {e['weights_update']:,} B (measured: every step after the first), "
              f"grad reduce-scatter {e['grads_rs']:,} B x {k} (measured {g[2]:,})")
        print(f"  first step: keyframe {e['weights_bf16_gather']:,} B (bf16) instead of an update: "
              f"+{e['weights_bf16_gather'] - e['weights_update']:,} B")
        print(f"  after the last batch: {extra_gathers} update gather(s) (the final evaluation's) = "
              f"{extra_gathers * e['weights_update']:,} B; all other evaluation gathers served from the reference")
        print(f"  preset count (1 reduce-scatter, baseline with the backward re-gather): "
              f"{preset_base:,} / {preset_sent:,} = {preset_base / preset_sent:.3f}x")
        print(f"  counters per step ({k} reduce-scatters, baseline = collectives that ran): "
              f"{run_base:,} / {run_sent:,} = {run_base / run_sent:.3f}x")
        print(f"  plain FSDP2 with {k} microbatches (forward + backward gather each): "
              f"{fsdp2_base:,} / {run_sent:,} = {fsdp2_base / run_sent:.3f}x")
        print(f"  whole run, counters: {comm['total']['native']:,} / {sent:,} = {comm['total']['native'] / sent:.3f}x; "
              f"mean of per-batch ratios {sum(series['qsdp/compression_vs_unquantized'].values()) / steps:.3f}x")
        ckpt = e["loco_residual_gather_per_checkpoint"] if "loco" in arm else 0
        saves = steps // 100
        print(f"  not in the counters: LoCo's checkpoint gathers of the residuals, {ckpt:,} B x {saves} saves = "
              f"{ckpt * saves:,} B ({100 * ckpt * saves / sent:.1f}% of the counted bytes)")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
