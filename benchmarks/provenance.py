"""Where a benchmark record comes from: the git revision of the code it measured, and the command.

Not a benchmark itself; the benchmarks import it from this directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


#: Outputs, not code: a run writing its record there (untracked until committed) leaves the code it ran clean.
RECORDS = "benchmarks/results"


def git_revision(watched: Sequence[str] = ("composer_qsdp", "benchmarks")) -> str:
    """Short commit of this checkout, with ``+dirty`` when a path under ``watched`` (relative to the repository
    root: the code the measurement depends on), outside :data:`RECORDS`, has uncommitted changes; ``$GIT_REV``
    wins (checkouts copied without ``.git``), and ``unknown (set GIT_REV)`` when there is neither."""
    if os.environ.get("GIT_REV"):
        return os.environ["GIT_REV"]
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                             cwd=ROOT).stdout.strip()
        # Pathspecs are relative to cwd, so git runs in the repository root.
        dirty = subprocess.run(["git", "status", "--porcelain", "--", *watched, f":(exclude){RECORDS}"],
                               capture_output=True, text=True, check=True, cwd=ROOT).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (set GIT_REV)"


def command_line() -> str:
    """This process's command line as a record states it (the interpreter's name, then its arguments)."""
    return " ".join([os.path.basename(sys.executable), *sys.argv])
