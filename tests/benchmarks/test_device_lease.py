"""``benchmarks/device_lease.sh`` on CPU: ``start`` runs a chain of suite stages in the background with only its GPU
visible and packs the chain's work into ``$OUT``; ``collect`` packs again once the chain is done; a malformed chain
is refused. The environment script is replaced by one that makes ``python3`` this interpreter (as in
test_run_device_suite.py); the GPU-marked tests all skip here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from test_convergence import fake_record

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "device_lease.sh"


def _lease(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    if not bin_dir.exists():
        bin_dir.mkdir()
        (bin_dir / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
        (bin_dir / "python3").chmod(0o755)
        (bin_dir / "nvidia-smi").write_text('#!/bin/sh\necho "0, 0 %, 1 MiB, 80000 MiB"\n')
        (bin_dir / "nvidia-smi").chmod(0o755)
        # The chain's visible GPUs, as the chain's environment saw them.
        (tmp_path / "env.sh").write_text(f'export PATH={bin_dir}:$PATH PYTHONPATH={ROOT}\n'
                                         'echo "visible: ${CUDA_VISIBLE_DEVICES-all}"\n')
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "GIT_REV": "abc1234",
           "OUT": str(tmp_path / "out"), "LEASE_DIR": str(tmp_path / "lease"), "SUITE_ENV": str(tmp_path / "env.sh"),
           "LEASE_SETTLE_S": "1"}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_a_malformed_chain_is_refused(tmp_path):
    proc = _lease(tmp_path, "start", "tests-kernels")
    assert proc.returncode == 2
    assert "bad chain 'tests-kernels': want GPU:stage[,stage...]" in proc.stdout


def test_a_chain_sees_its_gpu_and_its_work_comes_back_packed(tmp_path):
    assert _lease(tmp_path, "start", "1:tests-kernels").returncode == 0
    summary = tmp_path / "lease" / "suite-out-0" / "device_suite_summary.txt"
    deadline = time.monotonic() + 240
    while not (summary.exists() and "tests-kernels" in summary.read_text()) and time.monotonic() < deadline:
        time.sleep(1)
    proc = _lease(tmp_path, "collect")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["lease_status.txt", "suite.tar.xz"]  # no driver: no conv.tar.xz
    status = (out / "lease_status.txt").read_text()
    assert "tests-kernels" in status and "skipped" in status
    with tarfile.open(out / "suite.tar.xz") as tar:
        names = set(tar.getnames())
        assert {"suite-0/tests-kernels.log", "suite-0/tests-kernels.xml", "suite-out-0/device_suite.tar.xz"} <= names
        assert "visible: 1" in tar.extractfile("suite-0/environment.log").read().decode()


def test_each_group_of_driver_arguments_starts_its_own_driver(tmp_path):
    corpus = str(tmp_path / "corpus")  # --plan builds nothing
    plan = ["--plan", "--steps", "600", "--eval-batches", "-1", "--corpus", corpus, "--arms"]
    proc = _lease(tmp_path, "start", "--", *plan, "zero-one-adam", "--", "gpus=2,3", *plan, "zero-one-adam-4r-sync")
    assert proc.returncode == 0
    lease = tmp_path / "lease"
    assert (lease / "conv-0.args").read_text().split() == [*plan, "zero-one-adam"]
    assert (lease / "conv-1.args").read_text().split() == [*plan, "zero-one-adam-4r-sync"]
    assert [(lease / f"conv-{i}.gpus").read_text().strip() for i in (0, 1)] == ["all", "2,3"]
    assert "convergence driver 1 (GPUs: 2,3)" in proc.stdout
    deadline = time.monotonic() + 120
    logs = [lease / "conv-0.log", lease / "conv-1.log"]
    while not all(log.exists() and "fewer bytes" in log.read_text() for log in logs) and time.monotonic() < deadline:
        time.sleep(1)
    assert "zero-one-adam (2 ranks)" in logs[0].read_text() and "4r-sync" not in logs[0].read_text()
    assert "zero-one-adam-4r-sync (4 ranks)" in logs[1].read_text()


def test_a_malformed_gpu_list_is_refused(tmp_path):
    proc = _lease(tmp_path, "start", "--", "gpus=2;3", "--plan")
    assert proc.returncode == 2
    assert "bad 'gpus=2;3': want gpus=ID[,ID...]" in proc.stdout


def test_a_driver_writes_nothing_into_the_calls_out(tmp_path):
    """A finished driver's record stays in the lease folder: written into a later call's $OUT it crowded out the
    packed files (a call returns at most eight)."""
    records = []
    for name, loss in (("a", 4.0), ("b", 4.1)):
        path = tmp_path / name / "convergence-x.json"
        path.parent.mkdir()
        path.write_text(json.dumps(fake_record(name, {"baseline": {20: loss}})))
        records.append(str(path))
    assert _lease(tmp_path, "start", "--", "--combine", *records).returncode == 0
    combined = tmp_path / "lease" / "conv-0" / "convergence-x-combined.md"
    deadline = time.monotonic() + 120
    while not combined.exists() and time.monotonic() < deadline:
        time.sleep(1)
    assert combined.exists()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["lease_status.txt"]


def test_wait_leaves_time_for_its_pack(tmp_path):
    """A ``wait 540`` whose pack took 100 s ran past the device's 600 s and came back empty."""
    lease = tmp_path / "lease"
    lease.mkdir()
    (lease / "pack_s").write_text("565\n")
    proc = _lease(tmp_path, "wait", "30")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "sleeping 5 s: a pack takes 565 s" in proc.stdout
    assert int((lease / "pack_s").read_text()) < 565  # this call's own pack, measured
