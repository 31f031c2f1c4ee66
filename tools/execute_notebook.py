"""Run a notebook top to bottom in a fresh kernel and store the executed copy, outputs included, at ``--out``.

    python tools/execute_notebook.py notebooks/qsdp_demo.ipynb --out runs/notebook/qsdp_demo.ipynb

``--out`` is required: a run never overwrites the notebook it executes, so a tracked notebook changes only when
its executed copy is copied over it on purpose (``make notebook`` writes ``runs/notebook/``; copying that file to
``notebooks/`` refreshes the committed outputs). Cells run with the notebook's directory as the working directory,
in the kernel of this interpreter. Cell timings are not recorded, so re-running changes only what the cells print
and draw. A failing cell stops the run with its traceback and writes nothing.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import nbformat
from nbclient import NotebookClient

#: Seconds one cell may run (each training cell of the demo takes minutes on 2 cores).
CELL_TIMEOUT_S = 1800


def execute(path: Path, out: Path) -> None:
    """Execute the notebook at ``path`` and write it, outputs included, to ``out`` (its folder created if missing).

    Raises:
        ValueError: ``out`` is ``path`` itself.
    """
    if out.resolve() == path.resolve():
        raise ValueError(f"--out {out} is the notebook being executed; write the executed copy elsewhere")
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": str(path.resolve().parent)}}).execute()
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, out)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--out", type=Path, required=True,
                        help="where to write the executed notebook (never the notebook itself)")
    args = parser.parse_args(argv)
    try:
        execute(args.notebook, args.out)
    except ValueError as err:
        parser.error(str(err))
    return 0


if __name__ == "__main__":
    sys.exit(main())
