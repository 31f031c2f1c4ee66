"""0/1 Adam in a real Composer DDP run of 2 ranks (tests/algorithms/zoa_composer_run.py), started through
``torchrun`` (``e2e_common.torchrun``: the variables ``composer -n 2`` sets, without the launcher's own import of
Composer) on CPU and through Composer's launcher on GPUs.

The resume test launches twice and is marked slow.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import e2e_common  # benchmarks/ (tests/conftest.py): the launch commands

SCRIPT = Path(__file__).with_name("zoa_composer_run.py")
SYNCS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 14)  # every variance-phase step, then the local-step phase's T_u


def _launch(tmp_path: Path, *args: str, gpu: bool = False, options: dict | None = None) -> dict:
    out = tmp_path / f"result-{args[0]}.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ZOA_OPTIONS": json.dumps(options or {})}
    if gpu:
        env["QSDP_TEST_DEVICE"] = "gpu"
    launch = e2e_common.launcher if gpu else e2e_common.torchrun
    proc = subprocess.run([*launch(2), str(SCRIPT), str(out), *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"launcher failed:\n{proc.stdout[-5000:]}\n{proc.stderr[-5000:]}"
    return json.loads(out.read_text())


def _check_run(result: dict) -> None:
    assert result["world_size"] == 2 and result["model"] == "DistributedDataParallel"
    assert result["optimizer"] == "ZeroOneAdam"  # DecoupledAdamW was replaced at Event.INIT
    # GradientClipping would clip each rank's local gradient: the optimizer clips (the mean) instead.
    assert result["max_grad_norm"] == 1e3 and result["algorithms"] == ["ZeroOneAdamDDP"]
    assert result["schedule"]["var_freeze_step"] == 6 and result["schedule"]["local_step_scaler"] == 2
    assert "ddp_sync_strategy='forced_sync'" in result["forced_sync_error"]
    losses = result["losses"]
    assert sum(losses[-4:]) / 4 < 0.6 * sum(losses[:2]) / 2, losses
    # Local gradients: the replicas agree after every synchronization and differ between two.
    for step, per_rank in enumerate(result["params"], start=1):
        assert (per_rank[0] == per_rank[1]) == (step in SYNCS), step
    traffic = result["traffic"]
    assert traffic["calls"] == len(SYNCS) and traffic["sent"] < traffic["native"] / 3
    metrics = result["metrics"]
    assert sum(metrics["zero_one_adam/bytes_sent"]) == traffic["sent"]
    assert metrics["zero_one_adam/variance_frozen"] == [0.0] * 6 + [1.0] * 8
    assert metrics["zero_one_adam/local_step_interval"][-1] == 4


def test_composer_ddp_run_trains_with_zero_one_adam(tmp_path):
    _check_run(_launch(tmp_path, "full"))


@pytest.mark.slow
@pytest.mark.parametrize("options", [{}, {"variance_codec": "symmetric", "variance_rescale": True}],
                         ids=["default", "variance-options"])
def test_composer_checkpoint_resume_between_syncs_is_exact(tmp_path, options):
    ckpt = str(tmp_path / "ckpt")
    saved = _launch(tmp_path, "save", ckpt, options=options)
    resumed = _launch(tmp_path, "resume", ckpt, options=options)
    assert resumed["batches"] == saved["batches"] == 14
    # The checkpoint after batch 12 lies two local steps after a synchronization: each rank resumes its own weights.
    assert saved["params"][11][0] != saved["params"][11][1]
    assert resumed["losses"] == saved["losses"][12:]
    assert resumed["params"] == saved["params"][12:]
    assert resumed["traffic"] == saved["traffic"] and resumed["schedule"] == saved["schedule"]


def test_composer_layer_freezing_keeps_the_frozen_layer_still_and_alike(tmp_path):
    """Composer's LayerFreezing freezes l1 at the end of epoch 2, in the local-step phase: from batch 33 on l1 stays
    as it is and the same on both ranks, while the other layers train on."""
    result = _launch(tmp_path, "freeze")
    assert result["optimizer"] == "ZeroOneAdam" and result["algorithms"][-1] == "LayerFreezing"
    first = next(i for i, names in enumerate(result["frozen"]) if names)  # batch first + 1 is the first frozen one
    assert (first, result["batches"]) == (32, 48)
    assert result["frozen"][first] == ["module.net.l1.weight", "module.net.l1.bias"]
    n = 32 * 128 + 128  # l1's elements, first in the flat parameters
    kept = result["params"][first][0][:n]
    for per_rank in result["params"][first:]:
        assert per_rank[0][:n] == kept and per_rank[1][:n] == kept
    assert result["params"][-1][0][n:] != result["params"][first][0][n:]
    assert result["losses"][-1] < result["losses"][first]


@pytest.mark.gpu
def test_composer_ddp_run_on_two_gpu_ranks(tmp_path):
    _check_run(_launch(tmp_path, "full", gpu=True))
