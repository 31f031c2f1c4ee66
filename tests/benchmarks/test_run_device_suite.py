"""``benchmarks/run_device_suite.sh`` on CPU: a GPU test stage (whose tests all skip here) leaves its log, junit
xml and slowest durations in one archive plus a summary in ``$OUT``, and nothing else; a second call in the same
work folder adds to that archive; a stage past its timeout is reported as such; a misspelt stage is refused
before anything runs. The environment script is replaced by one that makes ``python3`` this interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "run_device_suite.sh"


def _suite(tmp_path: Path, *stages: str, **env: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    if not bin_dir.exists():
        bin_dir.mkdir()
        # A wrapper, not a link: a link to a virtual environment's interpreter starts it outside the environment.
        (bin_dir / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
        (bin_dir / "python3").chmod(0o755)
        (tmp_path / "env.sh").write_text(f'export PATH={bin_dir}:$PATH PYTHONPATH={ROOT}\n'
                                         'echo "0, Test GPU, 1 MiB, 0"\n')
    full_env = {**os.environ, "GIT_REV": "abc1234", "OUT": str(tmp_path / "out"), "SUITE_WORK": str(tmp_path / "work"),
                "SUITE_ENV": str(tmp_path / "env.sh"), **env}
    return subprocess.run(["bash", str(SCRIPT), *stages], cwd=ROOT, env=full_env, capture_output=True, text=True,
                          timeout=400)


def _archive(out: Path) -> dict[str, str]:
    """Name (inside the work folder) -> text of every file in ``out``'s archive."""
    with tarfile.open(out / "device_suite.tar.xz") as tar:
        return {Path(m.name).relative_to("work").as_posix(): tar.extractfile(m).read().decode()
                for m in tar.getmembers() if m.isfile()}


def _summary_line(summary: str, stage: str) -> list[str]:
    return next(line.split(maxsplit=3) for line in summary.splitlines() if line.startswith(stage + " "))


def test_a_misspelt_stage_is_refused_before_anything_runs(tmp_path):
    proc = _suite(tmp_path, "tests-kernel")
    assert proc.returncode == 2
    assert "unknown stage 'tests-kernel'; allowed: tests tests-kernels tests-comm" in proc.stdout
    assert not (tmp_path / "work" / "environment.log").exists()


@pytest.mark.slow
def test_stages_pack_logs_junit_and_durations_into_one_archive(tmp_path):
    out = tmp_path / "out"
    proc = _suite(tmp_path, "tests-kernels")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["device_suite.tar.xz", "device_suite_summary.txt"]
    files = _archive(out)
    assert {"environment.log", "stages.tsv", "summary.txt", "tests-kernels.log", "tests-kernels.xml"} <= set(files)
    assert "slowest 40 durations" in files["tests-kernels.log"]
    suite = ET.fromstring(files["tests-kernels.xml"]).find("testsuite")
    skipped = int(suite.get("skipped"))
    assert skipped > 0 and int(suite.get("tests")) == skipped and int(suite.get("failures")) == 0
    summary = (out / "device_suite_summary.txt").read_text()
    assert summary == files["summary.txt"] and "git abc1234" in summary and "0, Test GPU" in summary
    name, rc, seconds, result = _summary_line(summary, "tests-kernels")
    assert rc == "0" and int(seconds) >= 0 and result.startswith(f"{skipped} skipped")

    # A second device call on the same warm machine: its archive holds both calls' stages; this one times out.
    proc = _suite(tmp_path, "tests-comm", TESTS_COMM_TIMEOUT_S="1")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = _archive(out)
    assert {"tests-kernels.log", "tests-kernels.xml", "tests-comm.log"} <= set(files)
    summary = (out / "device_suite_summary.txt").read_text()
    assert _summary_line(summary, "tests-kernels")[1] == "0"
    name, rc, seconds, result = _summary_line(summary, "tests-comm")
    assert rc == "124" and result.startswith("TIMED OUT (TESTS_COMM_TIMEOUT_S")
