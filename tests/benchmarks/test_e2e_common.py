"""``e2e_common``: ``kill`` (every launch gets SIGTERM at once, and a launch that ignores it is SIGKILLed after one
shared grace period) and ``write_outputs`` (the records go into the folder named, whole)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import e2e_common

# Records when SIGTERM arrived, then ignores it (a launch that does not stop by itself).
STUBBORN = """
import signal, sys, time
def on_term(signum, frame):
    with open(sys.argv[1], "w") as f:
        f.write(repr(time.time()))
signal.signal(signal.SIGTERM, on_term)
open(sys.argv[1] + ".ready", "w").close()
while True:
    time.sleep(0.05)
"""


def test_kill_terminates_all_groups_at_once_then_sigkills_the_stubborn(tmp_path, monkeypatch):
    grace = 2.0
    monkeypatch.setattr(e2e_common, "KILL_GRACE_S", grace)
    stamps = [tmp_path / f"term-{i}" for i in range(3)]
    procs = [subprocess.Popen([sys.executable, "-c", STUBBORN, str(p)], start_new_session=True) for p in stamps]
    while not all(p.with_name(p.name + ".ready").exists() for p in stamps):
        time.sleep(0.05)
    finished = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    finished.wait()

    e2e_common.kill(*procs, finished)

    assert [p.returncode for p in procs] == [-9, -9, -9]  # ignored SIGTERM, so SIGKILLed
    received = [float(p.read_text()) for p in stamps]
    # One after another, the SIGTERMs would be a grace period apart.
    assert max(received) - min(received) < grace / 2
    e2e_common.kill()  # nothing to stop is fine


def test_write_outputs_writes_whole_files_into_the_folder_named(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("OUT", str(tmp_path / "env"))  # an environment variable names no output folder
    written = e2e_common.write_outputs("rec", tmp_path / "dir", {".md": "| a |", ".png": b"\x89PNG"})
    assert written == [tmp_path / "dir" / "rec.md", tmp_path / "dir" / "rec.png"]
    assert sorted(p.name for p in (tmp_path / "dir").iterdir()) == ["rec.md", "rec.png"]  # no temporary left
    assert (tmp_path / "dir" / "rec.png").read_bytes() == b"\x89PNG" and not (tmp_path / "env").exists()
