"""Process faults in real recipe runs (``composer -n N`` on CPU/gloo through tests/faults/fault_train.py): a rank
killed while a checkpoint is written, a stalled rank, resumes on another world size and with QSDP switched off and
on. Every case is bounded in time and compared with an uninterrupted run of the same recipe.

Each launch takes 15-40 s on 2 CPU cores; the module is ``slow``: ``pytest -m slow tests/faults``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import e2e_common  # benchmarks/ (tests/conftest.py): Composer's launcher command
from test_train import BASELINE, QSDP_RECIPE, tiny_overrides, train_losses, corpus_shards  # noqa: F401 (fixture)

pytestmark = [pytest.mark.slow, pytest.mark.requires_custom_comm]

SCRIPT = Path(__file__).with_name("fault_train.py")
BATCHES, SAVE_EVERY, KILL_AT = 8, 3, 6
DIST_TIMEOUT = 10
#: The Composer launcher waits this long for its other processes after one failed, then SIGKILLs them (a stopped
#: process does not handle the SIGTERM it gets first).
LAUNCHER_GRACE_S = 30
#: Each scheme's recipe: (processes, recipe, overrides, the rank that dies while saving: rank 0 alone writes DDP's
#: checkpoint file).
SCHEMES = {
    "w8g8": (2, QSDP_RECIPE, [], 1),
    "qwd": (2, BASELINE, ["algorithms.qsdp.preset=qwd-w4g4"], 1),
    # Two virtual nodes of 2 ranks on one host: INT8 within, INT4 across.
    "tlq-hs": (4, BASELINE, ["algorithms.qsdp.preset=tlq-hs", "algorithms.qsdp.ranks_per_node=2"], 1),
    # The variance freezes after step 4: the resume from batch 3 crosses into the local-step phase.
    "zero-one-adam": (2, BASELINE, ["fsdp=null", "algorithms.zero_one_adam.var_freeze_step=4",
                                    "algorithms.zero_one_adam.local_step_clipper=2"], 0),
}


def _launch(nproc: int, recipe: Path, overrides: list[str], fault_dir: Path, fault: str | None = None,
            timeout: int = 400) -> subprocess.CompletedProcess:
    """Run the recipe through fault_train.py. Whatever happens, every process it started is resumed and killed
    afterwards (their pids are in ``fault_dir``)."""
    fault_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "QSDP_FAULT_DIR": str(fault_dir)}
    env.pop("QSDP_FAULT", None)
    if fault is not None:
        env["QSDP_FAULT"] = fault
    try:
        proc = subprocess.run([*e2e_common.launcher(nproc), str(SCRIPT), str(recipe), *overrides], env=env,
                              capture_output=True, text=True, timeout=timeout)
    finally:
        for pid_file in fault_dir.glob("rank*.pid"):
            pid = int(pid_file.read_text())
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    break
            pid_file.unlink()
    return proc


def _overrides(shards: Path, run_dir: Path, *extra: str) -> list[str]:
    """The tiny recipe's overrides for a fault run, then those of ``QSDP_FAULT_OVERRIDES`` (space-separated
    ``key=value`` words, e.g. ``device=gpu`` to run the same cases with their ranks on GPUs)."""
    return tiny_overrides(shards, run_dir, f"max_duration={BATCHES}ba", f"eval_interval={BATCHES}ba",
                          f"dist_timeout={DIST_TIMEOUT}", *extra, *os.environ.get("QSDP_FAULT_OVERRIDES", "").split())


def _log(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout[-4000:] + proc.stderr[-6000:]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_rank_killed_while_saving_loses_nothing(corpus_shards, tmp_path, scheme):
    """SIGKILL of a rank in the middle of the batch-6 checkpoint: the job ends at once, 'latest' still names the
    complete batch-3 checkpoint, and autoresume from it reproduces the uninterrupted run exactly."""
    nproc, recipe, extra, victim = SCHEMES[scheme]
    ckpt = tmp_path / "ckpt"
    saving = [f"save_interval={SAVE_EVERY}ba", "run_name=faulty", "autoresume=true", *extra]
    full = _launch(nproc, recipe, _overrides(corpus_shards, tmp_path / "full", f"save_folder={tmp_path / 'f'}",
                                             *saving), tmp_path / "pids")
    assert full.returncode == 0, _log(full)

    killed = _launch(nproc, recipe, _overrides(corpus_shards, tmp_path / "killed", f"save_folder={ckpt}", *saving),
                     tmp_path / "pids", f"kill-in-save:{victim}:{KILL_AT}")
    after_kill = time.time() - float((tmp_path / "pids" / "killed").read_text())
    assert killed.returncode != 0 and f"Rank {victim} crashed with exit code -9" in killed.stderr, _log(killed)
    # A dead peer is noticed at once (its sockets close), far below dist_timeout; the launcher then stops the rest.
    assert after_kill < LAUNCHER_GRACE_S + 30, after_kill
    latest = ckpt / "latest-rank0.pt"
    assert os.readlink(latest).startswith(f"ep0-ba{SAVE_EVERY}"), os.readlink(latest)
    partial = sorted(p.name for p in ckpt.iterdir() if f"ba{KILL_AT}" in p.name)
    assert partial, "the fault did not fire while the checkpoint was written"
    if scheme != "zero-one-adam":  # sharded: the rank files are there, the metadata is not
        assert not (ckpt / f"ep0-ba{KILL_AT}" / ".metadata").exists()

    resumed = _launch(nproc, recipe, _overrides(corpus_shards, tmp_path / "resumed", f"save_folder={ckpt}",
                                                *saving), tmp_path / "pids")
    assert resumed.returncode == 0, _log(resumed)
    # The remains of the interrupted save are set aside, not in the way of the resumed run's own save at batch 6.
    assert sorted(p.name for p in ckpt.iterdir() if p.name.endswith(".incomplete")) == [f"{n}.incomplete"
                                                                                       for n in partial]
    assert "set aside so that the run resumes from the last complete checkpoint" in resumed.stderr
    expected = train_losses(tmp_path / "full")
    assert train_losses(tmp_path / "resumed") == {b: expected[b] for b in range(SAVE_EVERY, BATCHES)}
    metrics = {run: json.loads((tmp_path / run / "metrics.json").read_text()) for run in ("full", "resumed")}
    # The algorithms' byte counters continue from the checkpoint as if nothing happened.
    assert metrics["resumed"]["communication"] == metrics["full"]["communication"] != {}
    assert os.readlink(latest).startswith(f"ep0-ba{BATCHES}")


def test_a_stalled_rank_ends_the_run_after_dist_timeout_naming_it(corpus_shards, tmp_path):
    """SIGSTOP of rank 1 after batch 3: rank 0 fails after dist_timeout with an error naming rank 1, and the
    launcher ends the job (SIGKILL of the stopped rank after its grace period)."""
    fault_dir = tmp_path / "pids"
    proc = _launch(2, QSDP_RECIPE, _overrides(corpus_shards, tmp_path), fault_dir, "stop:1:3")
    stopped_at = float((fault_dir / "stopped").read_text())
    after_stop = time.time() - stopped_at
    log = _log(proc)
    assert proc.returncode != 0, log
    assert (f"CollectiveTimeoutError: rank 0: a collective waited dist_timeout={DIST_TIMEOUT} s for the other "
            "processes and timed out; rank(s) 1 of 2 did not answer") in log, log
    assert "raise the recipe key dist_timeout" in log
    # dist_timeout, the reports' grace (10 s at most), the launcher's grace; the rest is slack for a slow machine.
    assert after_stop < DIST_TIMEOUT + 10 + LAUNCHER_GRACE_S + 30, after_stop


@pytest.mark.parametrize("scheme", ["w8g8", "qwd"])
def test_resume_on_another_world_size(corpus_shards, tmp_path, scheme):
    """2 ranks to batch 3, 4 ranks from its checkpoint to batch 6, 2 ranks from that to the end: each resume warns
    that the world size changed and continues from the same samples with the same weights (the first resumed loss
    matches the uninterrupted 2-rank run's to quantization noise)."""
    _, recipe, extra, _ = SCHEMES[scheme]
    ckpt = tmp_path / "ckpt"
    full = _launch(2, recipe, _overrides(corpus_shards, tmp_path / "full", *extra), tmp_path / "pids")
    assert full.returncode == 0, _log(full)
    expected = train_losses(tmp_path / "full")
    legs = [(2, None, SAVE_EVERY), (4, SAVE_EVERY, 2 * SAVE_EVERY), (2, 2 * SAVE_EVERY, BATCHES)]
    for nproc, start, end in legs:
        run = tmp_path / f"w{nproc}-from{start}"
        load = [] if start is None else [f"load_path={ckpt / f'ep0-ba{start}'}"]
        proc = _launch(nproc, recipe, _overrides(corpus_shards, run, *extra, f"max_duration={end}ba",
                                                 f"save_folder={ckpt}", f"save_interval={end}ba", *load),
                       tmp_path / "pids")
        assert proc.returncode == 0, _log(proc)
        losses = train_losses(run)
        assert sorted(losses) == list(range(start or 0, end))
        if start is not None:
            previous = 2 if nproc == 4 else 4
            assert f"world_size: {previous} -> {nproc}" in proc.stderr, _log(proc)
            assert abs(losses[start] - expected[start]) < 2e-2 * expected[start], (losses[start], expected[start])
    assert expected[BATCHES - 1] < expected[0] - 0.3 and losses[BATCHES - 1] < expected[0] - 0.3


def test_qsdp_switched_off_and_on_again(corpus_shards, tmp_path):
    """QSDP, then the same run without it (plain FSDP2), then with it again: each resume continues; switching it on
    again warns that its counters start from zero and counts only the new batches."""
    ckpt = tmp_path / "ckpt"
    legs = [(QSDP_RECIPE, None, SAVE_EVERY), (BASELINE, SAVE_EVERY, 2 * SAVE_EVERY), (QSDP_RECIPE, 2 * SAVE_EVERY,
                                                                                      BATCHES)]
    for recipe, start, end in legs:
        run = tmp_path / f"{recipe.stem}-from{start}"
        load = [] if start is None else [f"load_path={ckpt / f'ep0-ba{start}'}"]
        proc = _launch(2, recipe, _overrides(corpus_shards, run, f"max_duration={end}ba", f"save_folder={ckpt}",
                                             f"save_interval={end}ba", *load), tmp_path / "pids")
        assert proc.returncode == 0, _log(proc)
    first = json.loads((tmp_path / f"{QSDP_RECIPE.stem}-fromNone" / "metrics.json").read_text())["communication"]
    last = json.loads((tmp_path / f"{QSDP_RECIPE.stem}-from{2 * SAVE_EVERY}" / "metrics.json").read_text())
    assert f"QSDP starts at batch {2 * SAVE_EVERY} of a resumed run whose checkpoint holds no QSDP state" in proc.stderr
    # Not mixed: the last leg's counters hold its own 2 batches (plus its evaluation), not the first leg's 3 too.
    grads_per_batch = first["QSDP"]["grads"]["calls"] // SAVE_EVERY
    assert last["communication"]["QSDP"]["grads"]["calls"] == (BATCHES - 2 * SAVE_EVERY) * grads_per_batch
    losses = train_losses(tmp_path / f"{QSDP_RECIPE.stem}-from{2 * SAVE_EVERY}")
    assert sorted(losses) == [2 * SAVE_EVERY, BATCHES - 1]
