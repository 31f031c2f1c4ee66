"""``benchmarks/gpu_jobs.sh`` on CPU: ``start`` runs a chain of GPU-suite stages in the background with only its
GPU visible, and one convergence driver per group of arguments; ``wait`` returns when they end (status 3 while
one still runs at its timeout); ``collect --archive`` packs the results folder without the drivers' work;
malformed chains and GPU lists are refused. The environment script (``--env``) makes ``python3`` this
interpreter; the GPU-marked tests all skip here."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_jobs.sh"


def _jobs(tmp_path: Path, command: str, *args: str) -> subprocess.CompletedProcess:
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
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "GIT_REV": "abc1234", "GPU_JOBS_POLL_S": "1"}
    options = ["--results", str(tmp_path / "results")]
    if command == "start":
        options += ["--env", str(tmp_path / "env.sh")]
    return subprocess.run(["bash", str(SCRIPT), command, *options, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def test_a_malformed_chain_is_refused(tmp_path):
    proc = _jobs(tmp_path, "start", "tests-kernels")
    assert proc.returncode == 2
    assert "bad chain 'tests-kernels': want GPU:stage[,stage...]" in proc.stdout


def test_a_malformed_gpu_list_is_refused(tmp_path):
    proc = _jobs(tmp_path, "start", "--", "gpus=2;3", "--plan")
    assert proc.returncode == 2
    assert "bad 'gpus=2;3': want gpus=ID[,ID...]" in proc.stdout


@pytest.mark.slow
def test_a_chain_sees_its_gpu_and_its_results_are_packed(tmp_path):
    assert _jobs(tmp_path, "start", "1:tests-kernels").returncode == 0
    proc = _jobs(tmp_path, "wait", "--timeout", "240")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = tmp_path / "results"
    status = (results / "status.txt").read_text()
    assert "suite chain 0 (ended)" in status and "tests-kernels" in status and "skipped" in status
    assert "visible: 1" in (results / "suite-0" / "environment.log").read_text()
    (results / "work" / "conv-0").mkdir(parents=True)
    (results / "work" / "conv-0" / "checkpoint.pt").write_text("large")
    proc = _jobs(tmp_path, "collect", "--archive", str(tmp_path / "packed" / "results.tar.xz"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with tarfile.open(tmp_path / "packed" / "results.tar.xz") as tar:
        names = set(tar.getnames())
    assert {"results/status.txt", "results/suite-0/tests-kernels.log", "results/suite-0/tests-kernels.xml"} <= names
    assert not any(name.startswith("results/work") for name in names)  # checkpoints stay on the host


@pytest.mark.slow
def test_each_group_of_driver_arguments_starts_its_own_driver(tmp_path):
    corpus = str(tmp_path / "corpus")  # --plan builds nothing
    plan = ["--plan", "--steps", "600", "--eval-batches", "-1", "--corpus", corpus, "--arms"]
    proc = _jobs(tmp_path, "start", "--", *plan, "zero-one-adam", "--", "gpus=2,3", *plan, "zero-one-adam-4r-sync")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "started convergence driver 1 (GPUs: 2,3)" in proc.stdout
    jobs = tmp_path / "results" / "jobs"
    assert (jobs / "conv-0.args").read_text().split() == [*plan, "zero-one-adam"]
    assert (jobs / "conv-1.args").read_text().split() == [*plan, "zero-one-adam-4r-sync"]
    assert [(jobs / f"conv-{i}.gpus").read_text().strip() for i in (0, 1)] == ["all", "2,3"]
    # The limit guards against a hang, not a speed: the two drivers and the status take about 70 s on an idle
    # 2-core machine, and CI runs them beside the other stacks' installs.
    proc = _jobs(tmp_path, "wait", "--timeout", "240")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    logs = [(tmp_path / "results" / f"conv-{i}.log").read_text() for i in (0, 1)]
    assert "zero-one-adam (2 ranks)" in logs[0] and "4r-sync" not in logs[0]
    assert "zero-one-adam-4r-sync (4 ranks)" in logs[1]
    again = _jobs(tmp_path, "start", "--", *plan, "zero-one-adam")  # one start per results folder
    assert again.returncode == 2 and "already holds jobs" in again.stdout


def test_wait_gives_up_at_its_timeout_while_a_job_runs(tmp_path):
    jobs = tmp_path / "results" / "jobs"
    jobs.mkdir(parents=True)
    job = subprocess.Popen(["sleep", "60"])
    try:
        (jobs / "suite-0.pid").write_text(f"{job.pid}\n")
        proc = _jobs(tmp_path, "wait", "--timeout", "1")
        assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "1 running" in proc.stdout and "suite chain 0 (running)" in proc.stdout
    finally:
        job.kill()
        job.wait()
