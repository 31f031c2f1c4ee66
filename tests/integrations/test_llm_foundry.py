"""Real llm-foundry training with QSDP: llm-foundry's own entrypoint (``composer -n 2 -m llmfoundry.cli.cli train``),
its MPT model, its ``text`` dataloader over MDS token shards written by this package, and a tokenizer directory
written offline, from the llm-foundry yaml ``yamls/llm-foundry/mpt-tiny-qsdp.yaml`` whose ``algorithms: {qsdp:
...}`` llm-foundry resolves through this package's entry point. 2 CPU processes, FSDP2 over gloo.

Runs where llm-foundry is installed (CI's ``foundry`` stack, ``.ci/run foundry``); a few minutes on 2 cores.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest

import e2e_common  # benchmarks/ (tests/conftest.py): Composer's launcher command

from composer_qsdp.recipes.data import python_source_documents, write_gpt2_tokenizer, write_token_shards

pytest.importorskip("llmfoundry")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
YAML = ROOT / "yamls" / "llm-foundry" / "mpt-tiny-qsdp.yaml"
BATCHES = 12  # the yaml's max_duration


def test_llm_foundry_yaml_trains_with_qsdp(tmp_path):
    shards = tmp_path / "shards"
    # This package's own sources: text that every install has, the same on every machine.
    write_token_shards(python_source_documents(0.1, [ROOT / "composer_qsdp"]), shards, 64)
    tokenizer = write_gpt2_tokenizer(tmp_path / "tokenizer")
    metrics_path = tmp_path / "metrics.json"
    command = [*e2e_common.launcher(2), "-m", "llmfoundry.cli.cli", "train", str(YAML),
               f"variables.data_local={shards}", f"variables.tokenizer={tokenizer}",
               f"variables.metrics_file={metrics_path}"]
    # Composer's FSDP1 wraps on CUDA devices only; FSDP2 runs on CPU.
    env = {**os.environ, "FSDP_VERSION": "2", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, f"llm-foundry failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"

    result = json.loads(metrics_path.read_text())
    metrics = result["metrics"]
    losses = [value for _, value in metrics["loss/train/total"]]
    assert len(losses) == BATCHES and all(math.isfinite(loss) for loss in losses), losses
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 1.0, losses  # from ~ln(50257) = 10.8 down

    # QSDP ran inside llm-foundry's Trainer: its counters, per side, and its per-batch metrics agree with them.
    traffic = result["communication"]["QSDP"]
    for side in ("weights", "grads"):
        counted = traffic[side]
        assert counted["calls"] > 0 and 0 < counted["sent"] < counted["bf16"] < counted["native"], (side, counted)
        assert 1.9 < counted["bf16"] / counted["sent"] < 2.0, (side, counted)  # 8-bit codes + bucket metadata
        assert sum(value for _, value in metrics[f"qsdp/{side}/bytes_sent"]) == counted["sent"]
    # MPT's fsdp_wrap_fn makes each block an FSDP unit: one reduce-scatter per unit per batch, and the 2 blocks
    # plus the root at least.
    assert traffic["grads"]["calls"] % BATCHES == 0 and traffic["grads"]["calls"] // BATCHES >= 3, traffic
