"""The demo notebook: committed executed, top to bottom, with its plots; and (slow) it runs again on a CPU (two
2-process trainings) with the same communication figures as the committed run."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the demo extra (pip install -e '.[demo]') reads the notebook")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "qsdp_demo.ipynb"


def code_cells(notebook: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def printed(notebook: nbformat.NotebookNode) -> str:
    return "".join(out.get("text", "") for cell in code_cells(notebook) for out in cell.outputs
                   if out.get("name") == "stdout")


def traffic_lines(notebook: nbformat.NotebookNode) -> list[str]:
    """The bytes QSDP sent and bf16/fp32 would have sent: deterministic for a given recipe and data."""
    return re.findall(r"^ *(?:weights|grads|total): sent .*$", printed(notebook), re.MULTILINE)


def check_executed(notebook: nbformat.NotebookNode) -> None:
    """Every code cell ran once, in order, in one kernel, without an error, and the demo's results are there."""
    nbformat.validate(notebook)
    cells = code_cells(notebook)
    assert [cell.execution_count for cell in cells] == list(range(1, len(cells) + 1))
    assert not [out for cell in cells for out in cell.outputs if out.output_type == "error"]
    images = sum("image/png" in out.get("data", {}) for cell in cells for out in cell.outputs)
    assert images == 3  # loss curves, communication bars, codec errors
    text = printed(notebook)
    assert re.search(r"QSDP W8G8: loss 10\.\d\d -> [78]\.\d\d", text), text
    assert len(traffic_lines(notebook)) == 3 and "bf16 would send" in text
    assert "mean of 256 stochastic 4-bit round trips" in text


def test_notebook_is_committed_executed_with_its_plots():
    check_executed(nbformat.read(NOTEBOOK, as_version=4))


@pytest.mark.slow
def test_notebook_runs_top_to_bottom(tmp_path):
    out = tmp_path / "executed.ipynb"
    # The tool `make notebook` uses; a failing cell's traceback ends up in stderr.
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "execute_notebook.py"), str(NOTEBOOK),
                             "--out", str(out)], capture_output=True, text=True, timeout=3600)
    assert result.returncode == 0, result.stderr[-5000:]
    executed = nbformat.read(out, as_version=4)
    check_executed(executed)
    assert traffic_lines(executed) == traffic_lines(nbformat.read(NOTEBOOK, as_version=4))


def test_make_notebook_writes_outside_the_tracked_notebook():
    """``make notebook`` leaves notebooks/qsdp_demo.ipynb as it is: the executed copy goes to runs/ by default, or to
    NOTEBOOK_OUT (dry run: the commands only)."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("no make on this machine")

    def command(*args: str) -> str:
        result = subprocess.run([make, "-n", "notebook", "PYTHON=python", *args], cwd=ROOT, capture_output=True,
                                text=True, timeout=60, check=True)
        return next(line for line in result.stdout.splitlines() if "execute_notebook.py" in line)

    assert command() == "python tools/execute_notebook.py notebooks/qsdp_demo.ipynb --out runs/notebook/qsdp_demo.ipynb"
    assert command("NOTEBOOK_OUT=elsewhere.ipynb").endswith("--out elsewhere.ipynb")


@pytest.mark.parametrize("out", [None, str(NOTEBOOK), str(NOTEBOOK.relative_to(ROOT))],
                         ids=["none", "same", "relative"])
def test_the_executor_never_overwrites_the_notebook_it_runs(out):
    before = NOTEBOOK.read_bytes()
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "execute_notebook.py"), str(NOTEBOOK),
                             *(["--out", out] if out else [])], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert ("--out" in result.stderr) and NOTEBOOK.read_bytes() == before
