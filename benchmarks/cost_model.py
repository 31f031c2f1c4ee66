"""Cluster cost model: predicted step time and cross-node bytes of FSDP2 training with QSDP's settings.

We cannot rent 16 nodes, so this predicts them from things measured on one host. Inputs:

* a model shape (a :data:`composer_qsdp.recipes.models.GPT_PRESETS` preset, or the 6.7B shape of SDP4Bit §3.4), laid out
  as FSDP units the way Composer wraps our GPT: one unit per transformer block plus the root (embeddings, final
  norm; the tied output head computes with the root's embedding);
* a cluster: nodes x GPUs per node, the bus bandwidth of NCCL ring collectives inside a node (NVLink) and the
  network bandwidth of each node, the all-to-all efficiency relative to a ring, per-call latencies;
* the compute-only step time of the model on ONE GPU at the per-GPU batch (``bench_e2e.py``'s ``compute-bound``
  configuration), split over units by their FLOPs (backward = 2 x forward);
* a setting: how weights and gradients move (:class:`Setting`; plain FSDP2, HSDP, flat QSDP, TLq-HS, qgZ, hpZ,
  qWD).

Collectives (per FSDP unit, ``W = M x L`` ranks on ``M`` nodes of ``L``):

* NCCL's ring all-gather / reduce-scatter of ``V`` bytes: every ring edge, a node's outgoing edges included,
  carries ``(W-1)/W * V``; the time is that over the slower of NVLink and the node's network.
* All-to-all (QSDP's flat quantized reduce-scatter sends each chunk straight to its owner): each GPU sends
  ``L-1`` chunks over NVLink and the node sends ``L * (M-1) * L`` chunks over its network, ``L`` times a ring's
  cross-node volume at the same bytes per element.
* Two-level (ZeRO++ qgZ, SDP4Bit TLq-HS; ``composer_qsdp.comm.two_level_reduce_scatter``): an all-to-all of
  ``M`` chunks per peer inside the node, then one of 1 chunk per other node: the node sends ``L * (M-1)``
  chunks across. The hops run one after the other, as in our implementation (SDP4Bit pipelines them).
* hpZ's backward gather: a ring over the node in bf16. HSDP: rings inside the node, then a ring all-reduce of
  the shard over the ``M`` replicas (``2 (M-1)/M * V`` fp32 bytes leave each node).
* A quantized call adds a fixed cost (kernel launches, allocations) and its codec kernels' memory traffic at
  ``hbm_gbs``, on the communication stream. Wire sizes come from the codecs themselves
  (``composer_qsdp.quant.make_codec(...).wire_bytes``).

Schedule (FSDP2's, one micro-batch per step; ``composer_qsdp.auto.choice.schedule_step``, which the automatic policy
uses too): one compute stream and one FIFO communication queue. Forward: the
all-gather of unit ``i+1`` is issued when unit ``i`` starts computing (implicit prefetch, one ahead). Backward
(root first, for the tied head, then the blocks in reverse): the next unit's all-gather is issued when a unit
starts, its reduce-scatter when it ends (the root's at the very end); the optimizer runs after the last
reduction. Two simplifications to keep in mind: collectives on FSDP's separate all-gather and reduce-scatter
streams share the links, modelled as one queue; and the codec kernels take no time from the compute stream.

The model's arithmetic is ``cluster_model.py``; this module checks it against the committed one-host records,
predicts clusters and the papers' conditions with it, and is the command line.

Usage (CPU only, a few seconds; prints markdown, and with ``--out-dir DIR`` also writes
``cost_model-<command>.md`` there with a header naming the date, git revision, command and the records read)::

    python benchmarks/cost_model.py validate   # predictions vs the committed one-host records
    python benchmarks/cost_model.py predict    # GPT-1.3B / 6.7B on 8 nodes x 8 H100 at 100, 200, 400 Gbps
    python benchmarks/cost_model.py papers     # SDP4Bit's published speedups beside the model's
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cluster_model import (GB, HBM_GBS, MEGATRON, OPTIMIZER_BYTES_PER_PARAM, SETTINGS, Cluster, NetworkFit, Unit,
                           collective_row_prediction, fit_network, model_shape, model_units, predict)
from provenance import command_line, git_revision

RESULTS = Path(__file__).resolve().parent / "results"


# ---------------------------------------------------------------------------------------------- validation
#: The one-host records this model is checked against (benchmarks/RESULTS.md).
COLLECTIVE_RECORDS = {"nvlink": "2026-11-21_h200x2_37e8cf4/bench_collectives-default.json",
                      "socket": "2026-11-21_h200x2_37e8cf4/bench_collectives-socket.json"}
E2E_RECORDS = [  # (record, model, micro-batch, compute-bound record if the run has none, and its micro-batch)
    ("2026-11-21_h200x4_e33c130/bench_e2e-gpt-1.3b-4x.json", "1.3b", 16, None),
    ("2026-11-21_h200x4_803ed0d/bench_e2e-gpt-1.3b-4x.json", "1.3b", 24,
     ("2026-11-21_h200x4_e33c130/bench_e2e-gpt-1.3b-4x.json", 16)),
    ("2026-11-21_h200x4_9e5abe9/bench_e2e-gpt-350m-4x.json", "350m", 32, None),
]
#: bench_e2e configurations as settings.
E2E_SETTINGS = {"baseline": SETTINGS["plain FSDP2"], "qsdp-w8g8": SETTINGS["QSDP W8G8 (flat)"],
                "qsdp-w4g4": SETTINGS["QSDP W4G4 (flat)"]}


def _read(path: str) -> Any:
    """The JSON record ``path`` (``<results folder>/<file>``)."""
    return json.loads((RESULTS / path).read_text())


def network_fits() -> dict[str, tuple[NetworkFit, int]]:
    """The fitted parameters of each network's 2-GPU collective record, with its GPU count."""
    fits = {}
    for network, path in COLLECTIVE_RECORDS.items():
        record = _read(path)
        world = int(record["header"]["device"].split(" x ")[0])
        fits[network] = (fit_network(record["rows"], world), world)
    return fits


def validate_collectives() -> list[dict]:
    """Measured vs fitted time of every row of the 2-GPU collective records (the calibration set)."""
    out = []
    for network, (fit, world) in network_fits().items():
        for row in _read(COLLECTIVE_RECORDS[network])["rows"]:
            predicted = collective_row_prediction(row, world, fit)
            out.append({"network": network, "op": row["op"], "size_mb": row["size_mb"],
                        "precision": row["precision"], "measured_ms": row["ms"], "predicted_ms": predicted * 1e3})
    return out


def _probe_busbw(record: dict, network: str) -> float:
    """The record's own NCCL all-gather bus bandwidth at its largest probe size (GB/s)."""
    rows = [r for r in record["networks"][network]["probe"]["rows"] if r["op"] == "all_gather"]
    return max(rows, key=lambda r: r["size_mb"])["busbw_gbps"]


def validate_e2e() -> list[dict]:
    """Predicted vs measured step time of every configuration of the 4-GPU end-to-end records.

    Inputs per record: its own probe bandwidth and compute-only step (scaled by the micro-batch where the run has
    none), and the latency, codec and all-to-all parameters fitted on the 2-GPU collective record of the same
    network: nothing is fitted on these runs.
    """
    fits = network_fits()
    out = []
    for path, model, micro, bound_source in E2E_RECORDS:
        record = _read(path)
        seq = record["settings"]["seq_len"]
        units = model_units(model_shape(model), seq)
        if bound_source is None:
            one_gpu = record["compute_bound"]["step_time_s"]
        else:
            source, source_micro = bound_source
            one_gpu = _read(source)["compute_bound"]["step_time_s"] * micro / source_micro
        nproc = record["settings"]["nproc"]
        for network, table in record["tables"].items():
            fit = fits["nvlink" if network == "nvlink" else "socket"][0]
            busbw = _probe_busbw(record, network)
            cluster = Cluster(1, nproc, busbw, busbw, fit.a2a_efficiency, fit.a2a_efficiency, fit.latency_s,
                              fit.codec_call_s)
            for row in table:
                if row["config"] not in E2E_SETTINGS or row.get("step_time_s") is None:
                    continue
                p = predict(units, cluster, E2E_SETTINGS[row["config"]], one_gpu)
                out.append({"model": model, "micro_batch": micro, "network": network, "config": row["config"],
                            "measured_s": row["step_time_s"], "predicted_s": p.step_s,
                            "record": path.split("/")[0]})
    return out


# ---------------------------------------------------------------------------------------------- predictions
#: Conditions of the predicted table: 8 nodes x 8 H100 SXM.
PREDICTED_MODELS = ("1.3b", "6.7b")
PREDICTED_GBPS = (100, 200, 400)
TOKENS_PER_GPU = 2 * 2048  # SDP4Bit §3.4: micro-batch 2 for 1.3B and 6.7B (Table 7), 2048 tokens, no accumulation
#: Assumed fraction of the line rate NCCL reaches across nodes, for rings and all-to-alls alike (not measured
#: here: the emulated socket network's all-to-all efficiency is a property of TCP over loopback).
NETWORK_EFFICIENCY = 0.9


def h100_one_gpu_step(units: Sequence[Unit], seq_len: int, tokens: int) -> float:
    """Compute-only step of a model on one H100 at ``tokens`` per step, scaled by FLOPs from the measured GPT-1.3B
    compute-only step (H200, micro-batch 16 x 2048; the H100 SXM has the same SMs and clocks, less HBM)."""
    record = _read(E2E_RECORDS[0][0])
    measured = record["compute_bound"]
    ref_units = model_units(model_shape("1.3b"), seq_len)
    ref_tokens = measured["tokens_per_step"]
    ref_params = sum(u.numel for u in ref_units)
    ref_opt = OPTIMIZER_BYTES_PER_PARAM * ref_params / (HBM_GBS * GB)
    per_flop = (measured["step_time_s"] - ref_opt) / (ref_tokens * sum(u.fwd_flops_per_token for u in ref_units))
    params = sum(u.numel for u in units)
    return per_flop * tokens * sum(u.fwd_flops_per_token for u in units) + OPTIMIZER_BYTES_PER_PARAM * params / (
        HBM_GBS * GB)


def prediction_table(models: Sequence[str] = PREDICTED_MODELS, gbps: Sequence[float] = PREDICTED_GBPS,
                     nodes: int = 8, gpus_per_node: int = 8, tokens: int = TOKENS_PER_GPU) -> list[dict]:
    """Predicted step time, speedup over plain FSDP2, TFLOPs per GPU and cross-node GB per node and step."""
    fit = network_fits()["nvlink"][0]
    seq = 2048
    out = []
    for model in models:
        units = model_units(model_shape(model), seq)
        one_gpu = h100_one_gpu_step(units, seq, tokens)
        flops_per_step = 3 * tokens * sum(u.fwd_flops_per_token for u in units)
        for rate in gbps:
            cluster = Cluster(nodes, gpus_per_node, fit.busbw_gbs, rate / 8 * NETWORK_EFFICIENCY, fit.a2a_efficiency,
                              1.0, fit.latency_s, fit.codec_call_s)
            base = predict(units, cluster, SETTINGS["plain FSDP2"], one_gpu).step_s
            for setting in SETTINGS.values():
                p = predict(units, cluster, setting, one_gpu)
                out.append({"model": model, "gbps": rate, "setting": setting.name, "step_s": p.step_s,
                            "speedup": base / p.step_s, "tflops_per_gpu": flops_per_step / p.step_s / 1e12,
                            "cross_node_gb": p.cross_node_gb, "compute_s": p.compute_s})
    return out


#: Dense bf16 tensor peaks (TFLOPs): the compute of another GPU is the H100 step scaled by their ratio.
PEAK_TFLOPS = {"H100": 989.0, "H800": 989.0, "A100": 312.0}
#: SDP4Bit §3.4-3.5, Table 2: end-to-end speedup of SDP4Bit (qWD + TLq-HS) over Megatron-LM, 16 nodes.
PAPER_CONDITIONS = (
    ("1.3b", "A100", 4, 100, 2.39),
    ("6.7b", "A100", 4, 100, 3.44),  # the paper ran 6.7B with tensor parallelism 4
    ("1.3b", "H800", 8, 3200, 1.53),
    ("6.7b", "H800", 8, 3200, 2.97),
)


def paper_table(tokens: int = TOKENS_PER_GPU) -> list[dict]:
    """SDP4Bit's published speedups (Table 2) beside this model's at the same nodes, GPUs per node and network,
    with the compute scaled from our H100-class measurement by the GPUs' bf16 peaks."""
    fit = network_fits()["nvlink"][0]
    out = []
    for model, gpu, per_node, gbps, published in PAPER_CONDITIONS:
        units = model_units(model_shape(model), 2048)
        one_gpu = h100_one_gpu_step(units, 2048, tokens) * PEAK_TFLOPS["H100"] / PEAK_TFLOPS[gpu]
        cluster = Cluster(16, per_node, fit.busbw_gbs, gbps / 8 * NETWORK_EFFICIENCY, fit.a2a_efficiency, 1.0,
                          fit.latency_s, fit.codec_call_s)
        steps = {name: predict(units, cluster, SETTINGS[name], one_gpu).step_s
                 for name in (MEGATRON, "plain FSDP2", "SDP4Bit: qWD + TLq-HS")}
        out.append({"model": model, "gpu": gpu, "nodes": 16, "gpus_per_node": per_node, "gbps": gbps,
                    "published": published, "vs_megatron": steps[MEGATRON] / steps["SDP4Bit: qWD + TLq-HS"],
                    "vs_fsdp2": steps["plain FSDP2"] / steps["SDP4Bit: qWD + TLq-HS"]})
    return out


# ---------------------------------------------------------------------------------------------- output
def _pct(measured: float, predicted: float) -> str:
    return f"{(predicted - measured) / measured * 100:+.1f}%"


def markdown_validation() -> str:
    """The validation tables (markdown)."""
    lines = ["Link parameters fitted on the 2x H200 collective records (git 37e8cf4):", "",
             "| network | ring busbw (GB/s) | NCCL call (ms) | quantized call (ms) | all-to-all / ring |",
             "|---|---:|---:|---:|---:|"]
    for network, (fit, _) in network_fits().items():
        lines.append(f"| {network} | {fit.busbw_gbs:.1f} | {fit.latency_s * 1e3:.3f} | {fit.codec_call_s * 1e3:.3f} "
                     f"| {fit.a2a_efficiency:.2f} |")
    lines += ["", "Collectives, 2x H200 (the fit's own data):", "",
              "| network | op | MB | precision | measured ms | model ms | error |", "|---|---|---:|---|---:|---:|---:|"]
    for r in validate_collectives():
        lines.append(f"| {r['network']} | {r['op']} | {r['size_mb']} | {r['precision']} | {r['measured_ms']:.3f} | "
                     f"{r['predicted_ms']:.3f} | {_pct(r['measured_ms'], r['predicted_ms'])} |")
    lines += ["", "End to end, 4x H200 (out of sample: each run's probe bandwidth and 1-GPU step, the fitted link "
              "parameters):", "", "| record | model | micro-batch | network | config | measured step (s) | "
              "predicted (s) | error |", "|---|---|---:|---|---|---:|---:|---:|"]
    for r in validate_e2e():
        lines.append(f"| {r['record']} | {r['model']} | {r['micro_batch']} | {r['network']} | {r['config']} | "
                     f"{r['measured_s']:.3f} | {r['predicted_s']:.3f} | {_pct(r['measured_s'], r['predicted_s'])} |")
    return "\n".join(lines) + "\n"


def markdown_predictions(rows: Sequence[dict]) -> str:
    """The predicted table (markdown)."""
    lines = ["| model | Gbps/node | setting | step (ms) | vs plain FSDP2 | TFLOPs/GPU | cross-node GB/node/step |",
             "|---|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['gbps']:g} | {r['setting']} | {r['step_s'] * 1e3:.0f} | "
                     f"{r['speedup']:.2f}x | {r['tflops_per_gpu']:.0f} | {r['cross_node_gb']:.2f} |")
    return "\n".join(lines) + "\n"


def markdown_papers(rows: Sequence[dict]) -> str:
    """The papers' conditions table (markdown)."""
    lines = ["| model | GPUs (16 nodes) | Gbps/node | SDP4Bit published (Table 2) | model: vs Megatron-like | "
             "model: vs plain FSDP2 |", "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['gpus_per_node']} x {r['gpu']} | {r['gbps']:g} | {r['published']:.2f}x | "
                     f"{r['vs_megatron']:.2f}x | {r['vs_fsdp2']:.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("validate", help="predictions vs the committed one-host records")
    pred = sub.add_parser("predict", help="the multi-node table")
    pred.add_argument("--model", nargs="+", default=list(PREDICTED_MODELS))
    pred.add_argument("--gbps", type=float, nargs="+", default=list(PREDICTED_GBPS), help="network per node, Gbit/s")
    pred.add_argument("--nodes", type=int, default=8)
    pred.add_argument("--gpus-per-node", type=int, default=8)
    pred.add_argument("--tokens-per-gpu", type=int, default=TOKENS_PER_GPU)
    sub.add_parser("papers", help="SDP4Bit's published speedups beside the model's at their conditions")
    for command in sub.choices.values():
        command.add_argument("--out-dir", help="also write cost_model-<command>.md here")
    args = parser.parse_args(argv)
    if args.command == "validate":
        table = markdown_validation()
    elif args.command == "papers":
        table = markdown_papers(paper_table())
    else:
        table = markdown_predictions(prediction_table(args.model, args.gbps, args.nodes, args.gpus_per_node,
                                                      args.tokens_per_gpu))
    print(table)
    if args.out_dir:
        records = [*COLLECTIVE_RECORDS.values(), *(r[0] for r in E2E_RECORDS)]
        header = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                  "git": git_revision(), "command": command_line(),
                  "records": ", ".join(sorted(set(records)))}
        lines = [f"### cost_model {args.command} (predictions, computed on a CPU)", ""]
        lines += [f"- {k}: `{v}`" for k, v in header.items()]
        Path(args.out_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.out_dir) / f"cost_model-{args.command}.md").write_text("\n".join(lines) + "\n\n" + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
