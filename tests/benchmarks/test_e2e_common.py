"""``e2e_common``: ``kill`` (every launch gets SIGTERM at once, and a launch that ignores it is SIGKILLed after one
shared grace period) and ``write_outputs`` (the records go into the folder named, whole)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import e2e_common
import pytest

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


# A driver: starts a launch (which writes its pid and sleeps) through e2e_common.start, then waits for ever.
DRIVER = """
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import e2e_common
import pytest
child = [sys.executable, "-c", "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)",
         sys.argv[2]]
e2e_common.start(child, Path(sys.argv[3]), {})
time.sleep(60)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
def test_a_launch_ends_when_its_driver_is_killed_outright(tmp_path):
    """A driver SIGKILLed (a command's time limit on a GPU host) runs no cleanup; its launch, in a session of its
    own, still gets SIGTERM and ends instead of training on and holding the GPU."""
    pid_file = tmp_path / "child.pid"
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(Path(e2e_common.__file__).parent), str(pid_file),
                               str(tmp_path / "launch.log")])
    deadline = time.monotonic() + 30
    while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pid_file.read_text())
    assert _alive(child)
    driver.kill()
    driver.wait()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, dead but not yet reaped by init, counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
