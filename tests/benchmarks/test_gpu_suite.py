"""``benchmarks/gpu_suite.sh`` on CPU: a GPU test stage (whose tests all skip here) leaves its log, junit xml,
slowest durations and a summary in the results folder named on the command line; a second call into the same
folder adds to it; a stage past its timeout is reported as such; a misspelt stage or a missing results folder is
refused before anything runs. The environment script (``--env``) makes ``python3`` this interpreter."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_suite.sh"


def _suite(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    if not bin_dir.exists():
        bin_dir.mkdir()
        # A wrapper, not a link: a link to a virtual environment's interpreter starts it outside the environment.
        (bin_dir / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
        (bin_dir / "python3").chmod(0o755)
        (tmp_path / "env.sh").write_text(f'export PATH={bin_dir}:$PATH PYTHONPATH={ROOT}\n'
                                         'echo "0, Test GPU, 1 MiB, 0"\n')
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env={**os.environ, "GIT_REV": "abc1234", **env},
                          capture_output=True, text=True, timeout=400)


def _summary_line(summary: str, stage: str) -> list[str]:
    return next(line.split(maxsplit=3) for line in summary.splitlines() if line.startswith(stage + " "))


def test_a_misspelt_stage_is_refused_before_anything_runs(tmp_path):
    proc = _suite(tmp_path, "--results", str(tmp_path / "results"), "tests-kernel")
    assert proc.returncode == 2
    assert "unknown stage 'tests-kernel'; allowed: tests tests-kernels tests-comm" in proc.stdout
    assert not (tmp_path / "results").exists()


def test_the_results_folder_is_required(tmp_path):
    proc = _suite(tmp_path, "tests-kernels")
    assert proc.returncode == 2
    assert "name the results folder: --results DIR" in proc.stdout


@pytest.mark.slow
def test_stages_leave_logs_junit_durations_and_a_summary_in_the_results_folder(tmp_path):
    results = tmp_path / "results"
    proc = _suite(tmp_path, "--results", str(results), "--env", str(tmp_path / "env.sh"), "tests-kernels")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    names = {p.name for p in results.iterdir()}
    assert {"environment.log", "stages.tsv", "summary.txt", "tests-kernels.log", "tests-kernels.xml"} <= names
    assert "slowest 40 durations" in (results / "tests-kernels.log").read_text()
    suite = ET.fromstring((results / "tests-kernels.xml").read_text()).find("testsuite")
    skipped = int(suite.get("skipped"))
    assert skipped > 0 and int(suite.get("tests")) == skipped and int(suite.get("failures")) == 0
    summary = (results / "summary.txt").read_text()
    assert "git abc1234" in summary and "0, Test GPU" in summary
    name, rc, seconds, result = _summary_line(summary, "tests-kernels")
    assert rc == "0" and int(seconds) >= 0 and result.startswith(f"{skipped} skipped")

    # A second call into the same folder: the summary holds both calls' stages; this one times out.
    proc = _suite(tmp_path, "--results", str(results), "--env", str(tmp_path / "env.sh"), "tests-comm",
                  TESTS_COMM_TIMEOUT_S="1")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert {"tests-kernels.xml", "tests-comm.log"} <= {p.name for p in results.iterdir()}
    summary = (results / "summary.txt").read_text()
    assert _summary_line(summary, "tests-kernels")[1] == "0"
    name, rc, seconds, result = _summary_line(summary, "tests-comm")
    assert rc == "124" and result.startswith("TIMED OUT (TESTS_COMM_TIMEOUT_S")


def _suite_list(script: str, pattern: str) -> list[str]:
    """The words of one parenthesized list of gpu_suite.sh, found by ``pattern`` (its line's start, up to ``(``)."""
    return re.search(rf"^\s*{pattern}\(([^)]*)\)", script, re.M).group(1).split()


def test_every_kernel_test_that_runs_on_the_device_is_in_the_compiled_stage():
    """A kernel test module that puts its tensors on ``kernel_device.DEVICE`` runs compiled on a GPU host only through
    the ``tests-kernels-compiled`` stage (``-m gpu`` deselects it): every such module lies under that stage's paths,
    and ``tests`` runs the stage."""
    script = SCRIPT.read_text()
    paths = [ROOT / p for p in _suite_list(script, r"TESTS_KERNELS_COMPILED=")]
    uses_device = re.compile(r"^from kernel_device import", re.M)
    users = [f for f in (ROOT / "tests").rglob("test_*.py") if uses_device.search(f.read_text())]
    assert len(users) >= 5
    outside = [str(f.relative_to(ROOT)) for f in users if not any(f.is_relative_to(p) for p in paths)]
    assert not outside, f"kernel tests outside TESTS_KERNELS_COMPILED {paths}: {outside}"
    assert "tests-kernels-compiled" in _suite_list(script, r"tests\) expanded\+=")
