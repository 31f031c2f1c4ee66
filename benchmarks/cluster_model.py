"""The arithmetic of the cluster cost model that ``cost_model.py`` runs (its docstring describes the method): the
FSDP units of our GPT (:func:`model_units`), a cluster (:class:`Cluster`), how a step's weights and gradients move
(:class:`Setting`, the settings of the tables :data:`SETTINGS`), the time and cross-node bytes of each collective
(:func:`ring`, :func:`all_to_all`, :func:`weight_gather`, :func:`grad_reduce`, :func:`hsdp_reduce`), the step time
under FSDP2's schedule (:func:`predict`), and the link parameters fitted on a ``bench_collectives.py`` record
(:func:`fit_network`, :func:`collective_row_prediction`).

Pure functions of their arguments: nothing here reads a record or a device.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from composer_qsdp.recipes.models import GPTConfig, gpt_config
from composer_qsdp.recipes.models.gpt import GPT
from composer_qsdp.auto.choice import fit_link, schedule_step
from composer_qsdp.quant import Codec, make_codec


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
