"""The cluster cost model's arithmetic (benchmarks/cluster_model.py): collective volumes and times by hand, the
FSDP2 schedule on a two-unit model by hand, the calibration round trip; and its recorded validation, predictions
and command line (benchmarks/cost_model.py)."""

from __future__ import annotations

import dataclasses

import pytest

import cluster_model as cm
import cost_model
from composer_qsdp.quant import make_codec

GB = 1e9
# 2 nodes x 4 GPUs, NVLink 100 GB/s, network 10 GB/s per node, no latencies: times are bytes / bandwidth
CLUSTER = cm.Cluster(nodes=2, gpus_per_node=4, intra_gbs=100.0, inter_gbs=10.0)


def test_ring_moves_w_minus_1_over_w_of_the_volume_over_the_slowest_link():
    across = cm.ring(CLUSTER, 8 * GB, ranks=8, nodes=2)
    assert across.seconds == pytest.approx(7 / 10) and across.node_egress == pytest.approx(7 * GB)
    inside = cm.ring(CLUSTER, 8 * GB, ranks=4, nodes=1)
    assert inside.seconds == pytest.approx(6 / 100) and inside.node_egress == 0
    assert cm.ring(CLUSTER, 8 * GB, ranks=1, nodes=1) == cm.Cost()


def test_two_level_sends_one_chunk_per_node_where_flat_sends_one_per_rank():
    chunk = 1 * GB
    flat = cm.all_to_all(CLUSTER, chunk, node_peers=3, off_node_peers=4)
    assert flat.node_egress == pytest.approx(4 * 4 * chunk)  # 4 GPUs x 4 off-node peers
    assert flat.seconds == pytest.approx(max(3 / 100, 16 / 10))
    hop1 = cm.all_to_all(CLUSTER, 2 * chunk, node_peers=3, off_node_peers=0)  # M = 2 chunks per node peer
    hop2 = cm.all_to_all(CLUSTER, chunk, node_peers=0, off_node_peers=1)
    assert (hop1.node_egress, hop2.node_egress) == (0, pytest.approx(4 * chunk))  # L = 4 times fewer bytes across
    assert hop1.seconds == pytest.approx(6 / 100) and hop2.seconds == pytest.approx(4 / 10)


def test_gradient_paths_use_the_codecs_wire_sizes():
    numel = 8 * 2**20
    shard = numel // 8
    setting = cm.SETTINGS["W8 + TLq-HS"]
    no_codec_cost = dataclasses.replace(CLUSTER, hbm_gbs=1e12)  # codec kernels free: network time only
    two_level = cm.grad_reduce(no_codec_cost, numel, setting)
    w1 = make_codec("symmetric", bits=8, bucket_size=128).wire_bytes(shard)
    w2 = make_codec("symmetric", bits=4, bucket_size=128).wire_bytes(shard)
    assert two_level.node_egress == 4 * 1 * w2
    assert two_level.seconds == pytest.approx(3 * 2 * w1 / 100e9 + 4 * w2 / 10e9, rel=1e-6)
    # one node: the single hop with the intra codec, i.e. the flat quantized reduce-scatter with that codec
    one_node = dataclasses.replace(CLUSTER, nodes=1)
    flat_intra = dataclasses.replace(setting, grads="a2a", grad_codec=setting.intra_codec)
    assert cm.grad_reduce(one_node, numel, setting) == cm.grad_reduce(one_node, numel, flat_intra)
    assert cm.grad_reduce(CLUSTER, numel, cm.SETTINGS["plain FSDP2"]) == cm.ring(CLUSTER, 4 * numel, 8, 2)


def test_schedule_of_a_two_unit_model_by_hand():
    # root and one block of equal FLOPs; each collective 1 s, compute 3 s per unit (1 forward, 2 backward)
    units = [cm.Unit("root", 10, 1.0), cm.Unit("block", 10, 1.0)]
    c = cm.Cluster(1, 2, intra_gbs=10 / GB, inter_gbs=1.0, hbm_gbs=1e30)  # a 10-byte ring step takes 1 s
    bf16 = cm.Setting("bf16 weights, bf16-sized gradient ring", grads="ring")
    one_gpu = 6.0  # forward 2 s, backward 4 s
    # comm: gather(root) 0-1, gather(block) 1-2 (issued when the root starts at 1); compute root 1-2, block 2-3.
    # backward: gather(root) 3-4, root 4-6 with gather(block) 4-5, block 6-8, its reduce 8-10 (fp32: 2 s), the
    # root's reduce 10-12.
    assert cm.predict(units, c, bf16, one_gpu).step_s == pytest.approx(12.0)
    hpz = dataclasses.replace(bf16, weights="hpz")  # 2 ranks on one node: the re-gather is the same ring
    assert cm.predict(units, c, hpz, one_gpu).step_s == pytest.approx(12.0)
    once = dataclasses.replace(bf16, weights="once")  # no backward gathers: backward 3-5 (root), 5-7 (block)
    assert cm.predict(units, c, once, one_gpu).step_s == pytest.approx(11.0)  # reduces 7-9, 9-11
    fast = dataclasses.replace(c, intra_gbs=1e30)
    assert cm.predict(units, fast, bf16, one_gpu).step_s == pytest.approx(6.0)  # compute only


def test_hpz_and_qwd_remove_cross_node_weight_bytes():
    units = cm.model_units(cm.model_shape("125m"), 2048)
    cluster = cm.Cluster(2, 4, 200.0, 25.0)
    plain, hpz, qwd = (cm.predict(units, cluster, cm.SETTINGS[n], 0.01) for n in
                       ("W8 + TLq-HS", "W8 + TLq-HS + hpZ", "SDP4Bit: qWD + TLq-HS"))
    gathers = sum(cm.weight_gather(cluster, u.numel, cm.SETTINGS["W8 + TLq-HS"].weight_codec, 8, 2).node_egress
                  for u in units) / GB
    assert plain.cross_node_gb - hpz.cross_node_gb == pytest.approx(gathers)  # the backward gathers stay inside
    assert hpz.step_s < plain.step_s and qwd.cross_node_gb < hpz.cross_node_gb


def test_model_units_count_every_parameter():
    import torch

    from composer_qsdp.recipes.models.gpt import GPT

    config = cm.model_shape("125m")
    units = cm.model_units(config, 2048)
    with torch.device("meta"):
        assert sum(u.numel for u in units) == sum(p.numel() for p in GPT(config).parameters())
    assert len(units) == 1 + config.n_layers and units[0].name == "root"
    assert units[1].fwd_flops_per_token == pytest.approx(2 * 12 * 768**2 + 4 * 2048 * 768)


def test_calibration_recovers_the_parameters_it_generated():
    truth = cm.NetworkFit(busbw_gbs=40.0, latency_s=2e-4, codec_call_s=5e-4, a2a_efficiency=0.6)
    rows = []
    for mb in (16, 64, 256):
        for op in ("all_gather", "reduce_scatter"):
            for precision, bytes_per_element in (("bf16", 2), ("8-bit", 1), ("4-bit", 0.5)):
                row = {"op": op, "size_mb": mb, "precision": precision, "bf16_bytes": mb * 1e6,
                       "wire_bytes_per_rank": 0.5 * mb * 1e6 / 2 * bytes_per_element}  # 2 ranks
                row["ms"] = cm.collective_row_prediction(row, 2, truth) * 1e3
                rows.append(row)
    fit = cm.fit_network(rows, 2)
    for field in dataclasses.fields(cm.NetworkFit):
        assert getattr(fit, field.name) == pytest.approx(getattr(truth, field.name), rel=1e-6), field.name


def test_recorded_end_to_end_runs_stay_predicted_within_20_percent():
    rows = cost_model.validate_e2e()
    worst = max(abs(r["predicted_s"] - r["measured_s"]) / r["measured_s"] for r in rows)
    assert worst < 0.2, worst


def test_prediction_table_and_cli(tmp_path, capsys):
    rows = cost_model.prediction_table(models=("1.3b",), gbps=(100,))
    by_name = {r["setting"]: r for r in rows}
    assert by_name["plain FSDP2"]["speedup"] == 1.0
    # the flat quantized reduce-scatter is an all-to-all: at 8 GPUs per node 8-bit codes cross the network in
    # larger volume than the fp32 ring's; the two-level scheme sends 1/8 of its chunks
    assert by_name["QSDP W8G8 (flat)"]["cross_node_gb"] > by_name["plain FSDP2"]["cross_node_gb"]
    assert by_name["W8 + TLq-HS"]["cross_node_gb"] < by_name["QSDP W4G4 (flat)"]["cross_node_gb"]
    assert cost_model.main(["predict", "--model", "125m", "--gbps", "200", "--out-dir", str(tmp_path)]) == 0
    written = (tmp_path / "cost_model-predict.md").read_text()
    assert "- git: `" in written and "| 125m | 200 | plain FSDP2 |" in written
    assert "| 125m | 200 | plain FSDP2 |" in capsys.readouterr().out


def test_paper_conditions_table():
    rows = cost_model.paper_table()
    assert [(r["model"], r["gpu"], r["gbps"], r["published"]) for r in rows] == [
        ("1.3b", "A100", 100, 2.39), ("6.7b", "A100", 100, 3.44), ("1.3b", "H800", 3200, 1.53),
        ("6.7b", "H800", 3200, 2.97)]
    # the re-gather and fp32 gradients make plain FSDP2 the slower baseline wherever the network is the limit
    assert all(r["vs_fsdp2"] >= r["vs_megatron"] >= 1.0 for r in rows)
    assert "| 1.3b | 4 x A100 | 100 | 2.39x |" in cost_model.markdown_papers(rows)


def test_bad_cluster_is_a_value_error():
    with pytest.raises(ValueError, match=r"Cluster.nodes=0 is invalid"):
        cm.Cluster(0, 8, 100.0, 10.0)
    with pytest.raises(ValueError, match=r"Cluster.inter_gbs=0 is invalid"):
        cm.Cluster(1, 8, 100.0, 0)
