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

Usage (CPU only, a few seconds; prints markdown, and with ``--out-dir DIR`` also writes
``cost_model-<command>.md`` there with a header naming the date, git revision, command and the records read)::

    python benchmarks/cost_model.py validate   # predictions vs the committed one-host records
    python benchmarks/cost_model.py predict    # GPT-1.3B / 6.7B on 8 nodes x 8 H100 at 100, 200, 400 Gbps
    python benchmarks/cost_model.py papers     # SDP4Bit's published speedups beside the model's
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from composer_qsdp.recipes.models import GPTConfig, gpt_config
from composer_qsdp.recipes.models.gpt import GPT
from composer_qsdp.auto.choice import fit_link, schedule_step
from composer_qsdp.quant import Codec, make_codec

from provenance import git_revision

RESULTS = Path(__file__).resolve().parent / "results"
GB = 1e9
#: SDP4Bit §3.4, Table 7: GPT-6.7B (not one of our presets).
SHAPES: dict[str, GPTConfig] = {"6.7b": gpt_config(None, d_model=4096, n_layers=32, n_heads=32)}
#: AdamW's memory traffic per parameter and step (fp32 weight, gradient, two moments: 4 reads, 3 writes).
OPTIMIZER_BYTES_PER_PARAM = 28
#: Effective bandwidth of the codec kernels on H100/H200 (benchmarks/RESULTS.md, codec kernels: 85-100% of a
#: 3.9-4.2 TB/s copy for the fp32 and nearest-rounding paths, about 2.6 TB/s for bf16 stochastic rounding).
HBM_GBS = 3500.0


# ---------------------------------------------------------------------------------------------- model
@dataclass(frozen=True)
class Unit:
    """One FSDP unit: what it communicates and computes.

    Attributes:
        name: ``"root"`` or ``"block"``.
        numel: parameters it all-gathers and reduce-scatters.
        fwd_flops_per_token: forward FLOPs per token (matrix products and attention; backward is twice this).
    """

    name: str
    numel: int
    fwd_flops_per_token: float


@functools.cache
def model_units(config: GPTConfig, seq_len: int) -> tuple[Unit, ...]:
    """The FSDP units of our GPT (``composer_qsdp.recipes.models.gpt.GPT``, blocks wrapped separately), root first.

    Parameter counts come from the module itself, built on the meta device. FLOPs: 2 per weight of each matrix
    product, plus ``4 * seq_len * d_model`` per block for the attention scores and their weighted sum.
    """
    with torch.device("meta"):
        gpt = GPT(dataclasses.replace(config, max_seq_len=max(seq_len, config.max_seq_len)))
    block = gpt.blocks[0]
    block_numel = sum(p.numel() for p in block.parameters())
    block_matmul = sum(p.numel() for p in block.parameters() if p.dim() == 2)
    root_numel = sum(p.numel() for p in gpt.parameters()) - config.n_layers * block_numel
    head_flops = 2.0 * config.d_model * config.padded_vocab_size
    block_flops = 2.0 * block_matmul + 4.0 * seq_len * config.d_model
    return (Unit("root", root_numel, head_flops), *[Unit("block", block_numel, block_flops)] * config.n_layers)


def model_shape(name: str) -> GPTConfig:
    """A preset of ``composer_qsdp.recipes.models`` or a shape of :data:`SHAPES`."""
    return SHAPES[name] if name in SHAPES else gpt_config(name)


# ---------------------------------------------------------------------------------------------- inputs
@dataclass(frozen=True)
class Cluster:
    """Where the collectives run.

    Attributes:
        nodes: nodes (``M``).
        gpus_per_node: GPUs per node (``L``).
        intra_gbs: bus bandwidth of an NCCL ring collective inside a node (GB/s per GPU, nccl-tests' busbw).
        inter_gbs: network bandwidth of one node (GB/s, all its NICs together).
        intra_a2a: all-to-all bandwidth as a fraction of the ring's, inside a node.
        inter_a2a: all-to-all bandwidth as a fraction of the ring's, across nodes.
        latency_s: fixed time of one NCCL collective call (s).
        codec_call_s: fixed extra time of one quantized call (kernel launches, allocations; s).
        hbm_gbs: effective memory bandwidth of the codec kernels (GB/s).
    """

    nodes: int
    gpus_per_node: int
    intra_gbs: float
    inter_gbs: float
    intra_a2a: float = 1.0
    inter_a2a: float = 1.0
    latency_s: float = 0.0
    codec_call_s: float = 0.0
    hbm_gbs: float = HBM_GBS

    def __post_init__(self) -> None:
        for name in ("nodes", "gpus_per_node"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"Cluster.{name}={getattr(self, name)!r} is invalid; it must be an integer >= 1")
        for name in ("intra_gbs", "inter_gbs", "intra_a2a", "inter_a2a", "hbm_gbs"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Cluster.{name}={getattr(self, name)!r} is invalid; it must be > 0")

    @property
    def world(self) -> int:
        """GPUs in all."""
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class CodecSpec:
    """A codec by its ``make_codec`` arguments (``None`` where a path is unquantized)."""

    name: str
    bits: int
    bucket_size: int

    def codec(self) -> Codec:
        return make_codec(self.name, bits=self.bits, bucket_size=self.bucket_size)


@dataclass(frozen=True)
class Setting:
    """How one step's weights and gradients move.

    Attributes:
        name: label in the tables.
        weight_codec: the weight all-gather's codec, or ``None`` for bf16.
        weights: ``"gather"`` (forward and backward all-gathers over all ranks), ``"hpz"`` (backward gather of the
            forward's weights inside the node, bf16: ZeRO++'s hpZ) or ``"once"`` (one gather per optimizer step and
            none in backward: SDP4Bit's qWD keeps the weights resident).
        grad_codec: the gradient codec (the inter-node one for two-level), or ``None`` for NCCL's fp32 ring.
        grads: ``"ring"`` (NCCL reduce-scatter, unquantized), ``"a2a"`` (QSDP's flat quantized reduce-scatter)
            or ``"two_level"``.
        intra_codec: the two-level scheme's intra-node codec.
        rotation: Hadamard block of the two-level scheme (memory passes only; sizes unchanged).
        hsdp: shard inside each node and replicate across nodes (FSDP2's HSDP; unquantized across replicas).
    """

    name: str
    weight_codec: CodecSpec | None = None
    weights: str = "gather"
    grad_codec: CodecSpec | None = None
    grads: str = "ring"
    intra_codec: CodecSpec | None = None
    rotation: int | None = None
    hsdp: bool = False


def _w(bits: int, bucket: int = 1024) -> CodecSpec:
    return CodecSpec("minmax", bits, bucket)


def _sym(bits: int, bucket: int) -> CodecSpec:
    return CodecSpec("symmetric", bits, bucket)


MEGATRON = "plain, weights gathered once (SDP4Bit's Megatron baseline)"
#: The settings of the predicted tables (codecs as in composer_qsdp.config.presets; qWD as SDP4Bit §3.1).
SETTINGS: dict[str, Setting] = {s.name: s for s in (
    Setting("plain FSDP2"),
    Setting("plain HSDP", hsdp=True),
    Setting("plain FSDP2 + hpZ", weights="hpz"),
    Setting(MEGATRON, weights="once"),
    Setting("QSDP W8G8 (flat)", _w(8), "gather", _w(8), "a2a"),
    Setting("QSDP W4G4 (flat)", _w(4), "gather", _w(4), "a2a"),
    Setting("ZeRO++ qwZ + qgZ", _sym(8, 4096), "gather", _sym(4, 2048), "two_level", _sym(4, 2048)),
    Setting("ZeRO++ qwZ + qgZ + hpZ", _sym(8, 4096), "hpz", _sym(4, 2048), "two_level", _sym(4, 2048)),
    Setting("W8 + TLq-HS", _w(8), "gather", _sym(4, 128), "two_level", _sym(8, 128), 32),
    Setting("W8 + TLq-HS + hpZ", _w(8), "hpz", _sym(4, 128), "two_level", _sym(8, 128), 32),
    Setting("SDP4Bit: qWD + TLq-HS", _sym(4, 2048), "once", _sym(4, 128), "two_level", _sym(8, 128), 32),
)}


# ---------------------------------------------------------------------------------------------- collectives
@dataclass(frozen=True)
class Cost:
    """One collective: seconds on the communication queue and bytes that leave each node."""

    seconds: float = 0.0
    node_egress: float = 0.0

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.seconds + other.seconds, self.node_egress + other.node_egress)


def ring(c: Cluster, volume: float, ranks: int, nodes: int) -> Cost:
    """NCCL ring all-gather / reduce-scatter of ``volume`` bytes (all chunks) over ``ranks`` ranks on ``nodes``."""
    if ranks == 1:
        return Cost()
    per_edge = (ranks - 1) / ranks * volume
    bandwidth = c.intra_gbs if nodes == 1 else min(c.intra_gbs, c.inter_gbs)
    return Cost(c.latency_s + per_edge / (bandwidth * GB), per_edge if nodes > 1 else 0.0)


def all_to_all(c: Cluster, per_peer: float, node_peers: int, off_node_peers: int) -> Cost:
    """An all-to-all in which every rank sends ``per_peer`` bytes to each of ``node_peers`` ranks on its node and
    ``off_node_peers`` ranks on other nodes; the ``gpus_per_node`` ranks of a node do so at once, sharing its
    network."""
    if node_peers + off_node_peers == 0:
        return Cost()
    intra = node_peers * per_peer / (c.intra_gbs * c.intra_a2a * GB)
    egress = c.gpus_per_node * off_node_peers * per_peer
    inter = egress / (c.inter_gbs * c.inter_a2a * GB)
    return Cost(c.latency_s + max(intra, inter), egress)


def _codec_cost(c: Cluster, touched: float) -> Cost:
    return Cost(c.codec_call_s + touched / (c.hbm_gbs * GB))


def weight_gather(c: Cluster, numel: int, codec: CodecSpec | None, ranks: int, nodes: int) -> Cost:
    """All-gather of a unit's bf16 weights over ``ranks`` ranks on ``nodes`` nodes, quantized by ``codec``."""
    shard = numel / ranks
    if codec is None:
        return ring(c, 2 * numel, ranks, nodes)
    wire = codec.codec().wire_bytes(max(1, round(shard)))
    touched = 2 * shard + wire + ranks * wire + 2 * numel  # encode the shard; decode every shard to bf16
    return ring(c, ranks * wire, ranks, nodes) + _codec_cost(c, touched)


def grad_reduce(c: Cluster, numel: int, s: Setting) -> Cost:
    """Reduce-scatter of a unit's fp32 gradients over the whole cluster (FSDP2 layouts; HSDP: :func:`hsdp_reduce`)."""
    m, l, w = c.nodes, c.gpus_per_node, c.world
    shard = max(1, round(numel / w))
    if s.grads == "ring":
        return ring(c, 4 * numel, w, m)
    inter = s.grad_codec.codec()
    if s.grads == "a2a":
        wire = inter.wire_bytes(shard)
        touched = 4 * numel + 2 * w * wire + 8 * shard  # encode W chunks; decode-sum W wires; write the shard
        return all_to_all(c, wire, l - 1, (m - 1) * l) + _codec_cost(c, touched)
    if s.grads != "two_level":
        raise ValueError(f"Setting.grads={s.grads!r} is invalid; allowed: ring, a2a, two_level")
    if m == 1 or l == 1:  # one hop: the flat collective with that hop's codec
        single = dataclasses.replace(s, grads="a2a", grad_codec=s.intra_codec if m == 1 else s.grad_codec)
        return grad_reduce(c, numel, single)
    w1, w2 = s.intra_codec.codec().wire_bytes(shard), inter.wire_bytes(shard)
    touched = (4 * numel + 3 * w * w1          # encode W chunks, reorder the wires
               + l * m * w1 + 4 * m * shard     # decode-sum the node's M chunks
               + 4 * m * shard + 2 * m * w2     # encode them again, decode-sum M wires
               + 8 * shard)                     # write the shard
    if s.rotation:
        touched += 8 * numel + 8 * shard  # rotate the input to fp32, rotate the result back
    hop1 = all_to_all(c, m * w1, l - 1, 0)  # M chunks to each node peer
    hop2 = all_to_all(c, w2, 0, m - 1)  # 1 chunk to the same local rank of each other node
    return hop1 + hop2 + _codec_cost(c, touched) + Cost(c.codec_call_s)  # a second codec call for hop 2


def hsdp_reduce(c: Cluster, numel: int) -> Cost:
    """HSDP: fp32 ring reduce-scatter inside the node, then a ring all-reduce of the shard over the replicas."""
    m, l = c.nodes, c.gpus_per_node
    cost = ring(c, 4 * numel, l, 1)
    if m > 1:  # L rings of M replicas share each node's network; each moves 2 (M-1)/M of its shard out
        egress = 2 * (m - 1) / m * 4 * numel
        cost += Cost(c.latency_s + egress / (c.inter_gbs * GB), egress)
    return cost


# ---------------------------------------------------------------------------------------------- schedule
@dataclass(frozen=True)
class Prediction:
    """One predicted step.

    Attributes:
        step_s: step time (s).
        compute_s: the compute stream's busy time (s).
        cross_node_gb: bytes that leave each node per step (GB).
    """

    step_s: float
    compute_s: float
    cross_node_gb: float


def predict(units: Sequence[Unit], c: Cluster, s: Setting, one_gpu_step_s: float) -> Prediction:
    """Step time of ``s`` on ``c`` for a model of ``units`` whose compute-only step on one GPU, at the same
    per-GPU batch, takes ``one_gpu_step_s`` (forward, backward and the optimizer over all parameters)."""
    params = sum(u.numel for u in units)
    opt_one = OPTIMIZER_BYTES_PER_PARAM * params / (c.hbm_gbs * GB)
    flops = sum(u.fwd_flops_per_token for u in units)
    fwd = [(one_gpu_step_s - opt_one) / 3 * u.fwd_flops_per_token / flops for u in units]
    ranks, nodes = (c.gpus_per_node, 1) if s.hsdp else (c.world, c.nodes)
    gather = [weight_gather(c, u.numel, s.weight_codec, ranks, nodes) for u in units]
    if s.weights == "gather" or s.hsdp:
        regather = gather
    elif s.weights == "hpz":
        regather = [weight_gather(c, u.numel, None, c.gpus_per_node, 1) for u in units]
    elif s.weights == "once":
        regather = [Cost()] * len(units)
    else:
        raise ValueError(f"Setting.weights={s.weights!r} is invalid; allowed: gather, hpz, once")
    reduce = [hsdp_reduce(c, u.numel) if s.hsdp else grad_reduce(c, u.numel, s) for u in units]

    # FSDP2's schedule, shared with the automatic policy: the root (tied head) first in backward, reducing last.
    schedule = schedule_step(fwd, [2 * f for f in fwd], [g.seconds for g in gather], [g.seconds for g in regather],
                             [r.seconds for r in reduce], [0, *range(len(units) - 1, 0, -1)], (0,))
    step = schedule + OPTIMIZER_BYTES_PER_PARAM * params / ranks / (c.hbm_gbs * GB)
    egress = sum(x.node_egress for x in (*gather, *regather, *reduce))
    return Prediction(step, 3 * sum(fwd), egress / GB)


# ---------------------------------------------------------------------------------------------- calibration
@dataclass(frozen=True)
class NetworkFit:
    """One network's collective parameters, fitted on a ``bench_collectives.py`` record.

    Attributes:
        busbw_gbs: ring bus bandwidth (GB/s), from the bf16 rows.
        latency_s: fixed time per NCCL call (s), from the bf16 rows.
        codec_call_s: fixed extra time per quantized call (s), from the quantized all-gather rows.
        a2a_efficiency: all-to-all bandwidth / ring bandwidth, from the quantized reduce-scatter rows.
    """

    busbw_gbs: float
    latency_s: float
    codec_call_s: float
    a2a_efficiency: float


def _quantized_touched(row: dict, world: int) -> float:
    """Codec kernel bytes of a ``bench_collectives`` quantized row (bf16 messages, per rank)."""
    wire = row["wire_bytes_per_rank"] / (world - 1)
    numel = row["bf16_bytes"] / 2
    if row["op"] == "all_gather":
        return 2 * numel / world + wire + world * wire + 2 * numel
    return 2 * numel + 2 * world * wire + 4 * numel / world


def fit_network(rows: Sequence[dict], world: int, hbm_gbs: float = HBM_GBS) -> NetworkFit:
    """Fit :class:`NetworkFit` on the rows of one ``bench_collectives.py`` record (one network); its latency and
    bandwidth are the automatic policy's link fit (:func:`composer_qsdp.auto.choice.fit_link`) of the bf16 rows."""
    plain = [r for r in rows if r["precision"] == "bf16" and r["op"] in ("all_gather", "reduce_scatter")]
    link = fit_link([(r["wire_bytes_per_rank"], r["ms"] / 1e3) for r in plain])
    latency, busbw = link.latency_s, link.bytes_per_s / GB

    def rest(row: dict) -> float:  # seconds not explained by the ring's latency and the codec kernels
        return row["ms"] / 1e3 - latency - _quantized_touched(row, world) / (hbm_gbs * GB)

    gathers = [r for r in rows if r["op"] == "all_gather" and r["precision"].endswith("-bit")]
    codec_call = sum(rest(r) - r["wire_bytes_per_rank"] / (busbw * GB) for r in gathers) / len(gathers)
    reduces = [r for r in rows if r["op"] == "reduce_scatter" and r["precision"].endswith("-bit")]
    xs = [r["wire_bytes_per_rank"] / (busbw * GB) for r in reduces]
    ys = [rest(r) - codec_call for r in reduces]
    inverse = sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
    return NetworkFit(busbw, latency, codec_call, 1 / inverse)


def collective_row_prediction(row: dict, world: int, fit: NetworkFit, hbm_gbs: float = HBM_GBS) -> float:
    """Predicted seconds of one ``bench_collectives.py`` row on one node of ``world`` GPUs."""
    c = Cluster(1, world, fit.busbw_gbs, fit.busbw_gbs, fit.a2a_efficiency, fit.a2a_efficiency, fit.latency_s,
                fit.codec_call_s, hbm_gbs)
    per_rank = row["wire_bytes_per_rank"]
    if row["precision"] == "bf16":
        return c.latency_s + per_rank / (c.intra_gbs * GB)
    codec = _codec_cost(c, _quantized_touched(row, world)).seconds
    if row["op"] == "all_gather":
        return c.latency_s + per_rank / (c.intra_gbs * GB) + codec
    return all_to_all(c, per_rank / (world - 1), world - 1, 0).seconds + codec


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
                  "git": git_revision(), "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
                  "records": ", ".join(sorted(set(records)))}
        lines = [f"### cost_model {args.command} (predictions, computed on a CPU)", ""]
        lines += [f"- {k}: `{v}`" for k, v in header.items()]
        Path(args.out_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.out_dir) / f"cost_model-{args.command}.md").write_text("\n".join(lines) + "\n\n" + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
