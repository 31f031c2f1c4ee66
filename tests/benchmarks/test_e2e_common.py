"""``e2e_common``: ``kill`` (every launch gets SIGTERM at once, its ranks directly so that their saves outlast the
launcher's own grace, and a launch that ignores it is SIGKILLed after one shared grace period) and
``write_outputs`` (the records go into the folder named, whole)."""

from __future__ import annotations

import json
import os
import signal
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


# A rank: on SIGTERM it "saves" for 1.5 s (writes argv[1] then), as a recipe run saves its checkpoint, and exits.
SAVING_RANK = """
import signal, sys, time
def on_term(signum, frame):
    time.sleep(1.5)
    open(sys.argv[1], "w").close()
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
open(sys.argv[1] + ".ready", "w").close()
while True:
    time.sleep(0.05)
"""
# A launcher as Composer's behaves: it exits when its rank does; SIGTERMed itself, it SIGKILLs the rank 0.5 s later
# (Composer waits 30 s).
LAUNCHER = """
import signal, subprocess, sys, time
rank = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]])
def on_term(signum, frame):
    rank.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    rank.kill()
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
sys.exit(rank.wait())
"""


@pytest.mark.parametrize("signalled", ["ranks", "launcher"])
def test_kill_lets_the_ranks_finish_a_save_that_outlasts_the_launchers_own_grace(tmp_path, signalled):
    saved = tmp_path / "saved"
    launch = e2e_common.start([sys.executable, "-c", LAUNCHER, SAVING_RANK, str(saved)], tmp_path / "log.txt",
                              dict(os.environ))
    while not saved.with_name("saved.ready").exists():
        time.sleep(0.05)
    if signalled == "launcher":  # the control: what signalling the launcher's group (the old kill) does
        e2e_common._signal_group(launch, signal.SIGTERM)
        launch.wait(30)
        assert not saved.exists()  # the launcher's SIGKILL cut the save short
        return
    start = time.monotonic()
    e2e_common.kill(launch, grace_s=30)
    assert saved.exists() and launch.returncode == 143  # the launcher exited by itself, after its rank
    assert time.monotonic() - start < 15  # it waited for the rank, not the whole grace


def test_write_outputs_writes_whole_files_into_the_folder_named(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("OUT", str(tmp_path / "env"))  # an environment variable names no output folder
    written = e2e_common.write_outputs("rec", tmp_path / "dir", {".md": "| a |", ".png": b"\x89PNG"})
    assert written == [tmp_path / "dir" / "rec.md", tmp_path / "dir" / "rec.png"]
    assert sorted(p.name for p in (tmp_path / "dir").iterdir()) == ["rec.md", "rec.png"]  # no temporary left
    assert (tmp_path / "dir" / "rec.png").read_bytes() == b"\x89PNG" and not (tmp_path / "env").exists()


# A driver: starts a launch (the JSON command of argv[2]) through e2e_common.start, then waits for ever.
DRIVER = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import e2e_common
e2e_common.start(json.loads(sys.argv[2]), Path(sys.argv[3]), {})
time.sleep(60)
"""
# A launched process: writes its pid (and its rank's variables) to argv[1] + RANK, then sleeps.
SLEEPER = """
import json, os, sys, time
keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "TORCH_NCCL_ASYNC_ERROR_HANDLING")
with open(sys.argv[1] + os.environ.get("RANK", "0"), "w") as f:
    json.dump({"pid": os.getpid(), **{k: os.environ.get(k) for k in keys}}, f)
time.sleep(60)
"""


def _start_driver(tmp_path: Path, command: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", DRIVER, str(Path(e2e_common.__file__).parent),
                             json.dumps(command), str(tmp_path / "launch.log")])


def _wait_for(paths: list[Path], timeout_s: float) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while not all(p.is_file() and p.read_text() for p in paths) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [json.loads(p.read_text()) for p in paths]


def _end_driver_and_wait(driver: subprocess.Popen, pids: list[int]) -> None:
    driver.kill()
    driver.wait()
    deadline = time.monotonic() + 20
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
def test_a_launch_ends_when_its_driver_is_killed_outright(tmp_path):
    """A driver SIGKILLed (a command's time limit on a GPU host) runs no cleanup; its launch, in a session of its
    own, still gets SIGTERM and ends instead of training on and holding the GPU."""
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    driver = _start_driver(tmp_path, [sys.executable, str(script), str(tmp_path / "rank")])
    [child] = _wait_for([tmp_path / "rank0"], 30)
    assert _alive(child["pid"])
    _end_driver_and_wait(driver, [child["pid"]])
    assert not _alive(child["pid"])


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
def test_torchrun_ranks_get_composers_variables_and_end_with_their_driver(tmp_path):
    """The benchmark's launcher: every rank sees the variables Composer's launcher would set, and when the driver
    is killed outright torchrun ends its ranks too."""
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    driver = _start_driver(tmp_path, [*e2e_common.torchrun(2), str(script), str(tmp_path / "rank")])
    ranks = _wait_for([tmp_path / "rank0", tmp_path / "rank1"], 60)
    assert ranks[0]["MASTER_ADDR"] and ranks[1]["MASTER_ADDR"] == ranks[0]["MASTER_ADDR"]
    assert [{k: v for k, v in r.items() if k not in ("pid", "MASTER_ADDR")} for r in ranks] == [
        {"RANK": str(i), "WORLD_SIZE": "2", "LOCAL_RANK": str(i), "LOCAL_WORLD_SIZE": "2",
         "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"} for i in range(2)]
    _end_driver_and_wait(driver, [r["pid"] for r in ranks])
    assert not any(_alive(r["pid"]) for r in ranks)


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, dead but not yet reaped by init, counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
