"""One rank's ordinary exception and one rank's recipe error in real recipe runs (``composer -n 2`` on CPU/gloo
through tests/faults/fault_train.py): the job ends within seconds of the exception with that rank's traceback
first, and a recipe error gives the same exit status whichever rank the launcher sees end first.

One launch each (about 15 s and 10 s on 2 CPU cores): part of the default run. The failure path of one launched
process (it ends at once, whatever threads it has) is also checked in a plain subprocess, without a launch.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from test_launcher_faults import _launch, _log, _overrides
from test_train import BASELINE, QSDP_RECIPE, corpus_shards  # noqa: F401 (fixture)

#: Seconds from one rank's exception to the end of the job (launcher included). The other rank notices at once
#: (the failed process's connections close), so this is start-up-free Python exit time plus slack for a loaded
#: machine; far below the dist_timeout of the run.
EXIT_BOUND_S = 15
DIST_TIMEOUT = 60


@pytest.mark.requires_custom_comm
def test_an_exception_on_one_rank_ends_the_job_within_seconds(corpus_shards, tmp_path):
    """Rank 1 raises after batch 2 while rank 0 goes on into batch 3's collectives, each holding a thread-pool task
    that never ends: the job ends within seconds (not after dist_timeout, nor at the launcher's SIGKILL 30 s after
    the first process ends), and the first traceback in the launcher's output is rank 1's."""
    fault_dir = tmp_path / "pids"
    proc = _launch(2, QSDP_RECIPE, _overrides(corpus_shards, tmp_path, f"dist_timeout={DIST_TIMEOUT}"), fault_dir,
                   "raise:1:2", timeout=DIST_TIMEOUT + 200)
    after_raise = time.time() - float((fault_dir / "raised").read_text())
    log = _log(proc)
    assert proc.returncode != 0, log
    assert after_raise < EXIT_BOUND_S, (after_raise, log)
    tracebacks = [m.start() for m in re.finditer("Traceback", log)]
    assert tracebacks, log
    first = log[tracebacks[0]:tracebacks[1] if len(tracebacks) > 1 else None]
    assert "RuntimeError: injected fault: rank 1 raises after batch 2" in first, log


def test_a_recipe_error_exits_with_status_2_whichever_rank_stops_first(tmp_path):
    """Every rank finds the same recipe error; rank 0 takes 4 s longer over the check, so the launcher sees rank 1
    end first and stops rank 0 in the middle of its check: the job's status is still the recipe error's (2)."""
    proc = _launch(2, BASELINE, ["optimizer.lr=0"], tmp_path / "pids", "slow-check:0:4", timeout=300)
    log = _log(proc)
    assert "recipe key 'optimizer.lr' = 0.0 is invalid" in log, log
    assert proc.returncode == 2, log


_FAILING_PROCESS = """
import atexit, concurrent.futures, sys, threading
import composer_qsdp.recipes.train as entry

# A thread-pool task that never ends, as streaming's ready thread waiting for a shard: interpreter exit would join it.
concurrent.futures.ThreadPoolExecutor(1).submit(threading.Event().wait)
atexit.register(lambda: print("atexit callbacks ran", flush=True))
entry.load_recipe, entry.check_machine = (lambda *args, **kwargs: None), (lambda recipe: None)

def train(recipe, clock=None):
    raise {error}

entry.train = train
sys.exit(entry.main(["recipe.yaml"]))
"""


@pytest.mark.parametrize("error,status,report", [
    ("ValueError('a bug in a callback')", 1, "ValueError: a bug in a callback"),
    ("entry.PeerExitedError('rank 1: another process ended')", 1, "PeerExitedError: rank 1: another process ended"),
    ("entry.RecipeError('bad key')", 2, "recipe error: bad key"),
    ("SystemExit(143)", 143, "rank 1: stopped by the launcher (status 143) because another process of the job ended"),
])
def test_a_failed_launched_process_ends_without_joining_its_threads(error, status, report):
    """A launched process (WORLD_SIZE > 1) whose training fails reports the error, runs its atexit callbacks and
    ends with its status at once, though a library thread never ends (SystemExit: Composer's SIGTERM handler)."""
    env = {**os.environ, "WORLD_SIZE": "2", "RANK": "1"}
    proc = subprocess.run([sys.executable, "-c", _FAILING_PROCESS.format(error=error)], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == status, proc.stderr
    assert report in proc.stderr and "atexit callbacks ran" in proc.stdout, proc.stdout + proc.stderr


def test_a_process_whose_peer_ended_exits_after_the_launcher_has_seen_the_peer():
    """A survivor learns of its peer's death at once; it waits for the launcher's SIGTERM (the launcher has found the
    failed process then) before it ends, so that a launcher polling in rank order names the peer, not the survivor."""
    env = {**os.environ, "WORLD_SIZE": "2", "RANK": "0"}
    error = "entry.PeerExitedError('rank 0: another process ended')"
    proc = subprocess.Popen([sys.executable, "-c", _FAILING_PROCESS.format(error=error)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        reported = ""
        while "PeerExitedError" not in reported:
            line = proc.stderr.readline()
            assert line, reported  # the process ended before reporting
            reported += line
        time.sleep(2.0)
        assert proc.poll() is None, "the survivor exited before the launcher's SIGTERM"
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert time.monotonic() - sent < 5, "the launcher's SIGTERM did not end the wait"
    assert proc.returncode == 1, reported + stderr
    assert "atexit callbacks ran" in stdout, stdout + stderr
