"""QSDP in a real Composer FSDP2 run through the ``composer -n 2`` launcher (tests/algorithms/composer_run.py)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

import e2e_common  # benchmarks/ (tests/conftest.py): Composer's launcher command

SCRIPT = Path(__file__).with_name("composer_run.py")
pytestmark = pytest.mark.requires_custom_comm


def _launch(tmp_path: Path, *args: str, gpu: bool = False) -> dict:
    out = tmp_path / f"result-{'-'.join(a for a in args if '/' not in a) or 'full'}.json"
    env = {**os.environ, "FSDP_VERSION": "2", "OMP_NUM_THREADS": "1"}
    if gpu:
        env["QSDP_TEST_DEVICE"] = "gpu"
    proc = subprocess.run([*e2e_common.launcher(2), str(SCRIPT), str(out), *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"launcher failed:\n{proc.stdout[-5000:]}\n{proc.stderr[-5000:]}"
    return json.loads(out.read_text())


def _check_quantized_training(result: dict) -> None:
    assert result["fsdp_version"] == 2 and result["world_size"] == 2
    weights, grads = result["traffic"]["weights"], result["traffic"]["grads"]
    batches = len(result["losses"])
    assert weights["calls"] == 2 * 3 * batches and grads["calls"] == 3 * batches  # 3 units, fwd+bwd gathers
    for side in (weights, grads):  # fp32 ('FULL') collectives replaced by 8-bit codes + bucket metadata
        assert side["sent"] < side["bf16"] < side["native"]
    metrics = result["metrics"]
    assert len(metrics["qsdp/weights/bytes_sent"]) == batches
    assert sum(metrics["qsdp/weights/bytes_sent"]) == weights["sent"]
    assert all(1.9 < r < 2 for r in metrics["qsdp/compression_vs_bf16"])
    assert all(0 < e < 0.05 for e in metrics["qsdp/weights/rel_error"] + metrics["qsdp/grads/rel_error"])
    losses = result["losses"]
    assert sum(losses[-4:]) / 4 < 0.7 * sum(losses[:2]) / 2, losses
    assert max(result["param_rel_error"].values()) < 2e-2, result["param_rel_error"]


def test_composer_launcher_run_quantizes_fsdp_traffic(tmp_path):
    _check_quantized_training(_launch(tmp_path))


@pytest.mark.slow
def test_composer_checkpoint_resume_gives_the_same_losses(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    saved = _launch(tmp_path, "save", ckpt)
    resumed = _launch(tmp_path, "resume", ckpt)
    assert resumed["losses"] == saved["losses"][3:]
    assert resumed["step"] == saved["step"]  # the seed schedule continues where it stopped
    assert resumed["traffic"] == saved["traffic"]  # cumulative counters are checkpointed too


@pytest.mark.gpu
def test_composer_launcher_run_on_two_gpus(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    _check_quantized_training(_launch(tmp_path, gpu=True))
