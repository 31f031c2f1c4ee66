"""The demo notebook: stored without outputs, and it runs top to bottom on a CPU (two 2-process trainings)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "qsdp_demo.ipynb"


def test_notebook_is_committed_without_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code, "the notebook has no code"
    for cell in code:
        assert cell.outputs == [] and cell.execution_count is None, cell.source[:80]


@pytest.mark.slow
def test_notebook_runs_top_to_bottom():
    from nbclient import NotebookClient

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    # Raises CellExecutionError, with the cell and its traceback, if any cell fails.
    NotebookClient(notebook, timeout=900, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    printed = "".join(out.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                      for out in cell.outputs)
    images = sum("image/png" in out.get("data", {}) for cell in notebook.cells if cell.cell_type == "code"
                 for out in cell.outputs)
    assert images == 3  # loss curves, communication bars, codec errors
    assert "QSDP W8G8: loss" in printed and "bf16 would send" in printed
    assert "mean of 256 stochastic 4-bit round trips" in printed
