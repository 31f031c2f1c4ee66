"""QSDP's topology-aware setting in a real Composer run: ``composer -n 4`` on CPU as 2 virtual nodes x 2 ranks,
SDP4Bit's TLq-HS gradients and ZeRO++'s hpZ (``reshard_after_forward=2``), saved at batch 3 and resumed
(tests/algorithms/composer_run.py); the same on 4 GPUs is marked ``gpu``."""

from __future__ import annotations

import pytest
from test_qsdp_composer import _launch

pytestmark = pytest.mark.requires_custom_comm

BATCHES, UNITS = 6, 3
TLQ_HS = {"preset": "tlq-hs", "weight_bucket_size": 256, "ranks_per_node": 2, "error_sample_interval": 2}
HPZ = {"reshard_after_forward": 2}  # the secondary shard in the (virtual) node


def _check(saved: dict, resumed: dict) -> None:
    assert saved["world_size"] == 4 and saved["batches"] == BATCHES
    weights, grads = saved["traffic"]["weights"], saved["traffic"]["grads"]
    assert weights["calls"] == 2 * UNITS * BATCHES and grads["calls"] == UNITS * BATCHES
    # Forward gathers: 8-bit codes of the shard to 1 peer on the node and 2 off it. hpZ's backward gathers: the
    # secondary shard (2 primary shards: the unit split over 2 ranks), decoded fp32, to the node peer only. In
    # fp32 shard bytes S, `native` counts 3 S forward + 2 S backward.
    shard_bytes = weights["native"] // 5
    assert weights["sent"] - weights["inter_node"] == weights["inter_node"] // 2 + 2 * shard_bytes
    # TLq-HS: the inter-node hop carries 4-bit codes of 1 chunk, the intra-node hop 8-bit codes of 2
    assert 0 < 3 * grads["inter_node"] < grads["sent"] - grads["inter_node"]
    metrics = saved["metrics"]  # logged through Composer's Logger at every batch
    for side, counted in (("weights", weights), ("grads", grads)):
        assert len(metrics[f"qsdp/{side}/bytes_inter_node"]) == BATCHES
        assert sum(metrics[f"qsdp/{side}/bytes_inter_node"]) == counted["inter_node"]
    assert all(0 < e < 0.2 for e in metrics["qsdp/grads/rel_error"])  # INT8 and INT4 codes, both hops
    assert max(saved["param_rel_error"].values()) < 2e-2, saved["param_rel_error"]  # vs exact SGD
    assert resumed["losses"] == saved["losses"][3:]
    assert resumed["seeds"] == saved["seeds"] and resumed["traffic"] == saved["traffic"]


@pytest.mark.slow
def test_tlq_hs_with_hpz_on_two_virtual_nodes_trains_logs_hops_and_resumes(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    saved = _launch(tmp_path, "save", ckpt, nproc=4, options=TLQ_HS, fsdp=HPZ)
    _check(saved, _launch(tmp_path, "resume", ckpt, nproc=4, options=TLQ_HS, fsdp=HPZ))


@pytest.mark.gpu
def test_the_same_on_four_gpu_ranks(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    saved = _launch(tmp_path, "save", ckpt, nproc=4, options=TLQ_HS, fsdp=HPZ, gpu=True)
    _check(saved, _launch(tmp_path, "resume", ckpt, nproc=4, options=TLQ_HS, fsdp=HPZ, gpu=True))
