"""Concurrent jobs on one machine: the streaming datasets of jobs started together each register their own
shared-memory prefix, without ``FileExistsError: '/000000_locals'`` (mosaicml-streaming issues #884, #901).

Each job here is a process that builds the train and val dataloaders of the same shards at the same moment as
the others, keeps them open until every job has built its own (so the prefixes are held together), and reports
the prefixes it got. The multi-rank case is covered by the launcher runs of tests/test_train.py; this one races
the prefix registration itself, which is where the jobs collided.
"""

from __future__ import annotations

import multiprocessing as mp
import traceback

import pytest

from composer_qsdp.recipes.data import build_token_dataloader, write_token_shards

JOBS = 4
SEQ_LEN = 16


def _job(shards: str, ready, go, built, release, results) -> None:
    try:
        ready.release()
        go.wait(600)  # every job builds at the same moment, once all have imported streaming
        loaders = [build_token_dataloader(shards, split, 2, SEQ_LEN, shuffle=False) for split in ("train", "val")]
        prefixes = [loader.dataset._shm_prefix_int for loader in loaders]
        built.release()
        release.wait(60)
        results.put(("ok", prefixes))
        del loaders
    except BaseException:  # noqa: BLE001 - the parent reports it
        built.release()
        results.put(("error", traceback.format_exc()))


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("jobs") / "shards"
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
    texts = [" ".join(words[(i + j) % len(words)] for j in range(200)) for i in range(40)]
    write_token_shards((("val" if i % 5 == 0 else "train", text) for i, text in enumerate(texts)), out, SEQ_LEN)
    return str(out)


@pytest.mark.slow  # two concurrent 2-process jobs, about 30 s
def test_jobs_started_together_get_distinct_shared_memory(shards):
    ctx = mp.get_context("spawn")
    ready, go, built, release, results = ctx.Semaphore(0), ctx.Event(), ctx.Semaphore(0), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_job, args=(shards, ready, go, built, release, results)) for _ in range(JOBS)]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            assert ready.acquire(timeout=300), "a job did not start within 300 s"
        go.set()
        for _ in procs:
            assert built.acquire(timeout=300), "a job did not build its dataloaders within 300 s"
        release.set()
        outcomes = [results.get(timeout=60) for _ in procs]
    finally:
        go.set()
        release.set()
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    errors = [payload for status, payload in outcomes if status == "error"]
    assert not errors, f"{len(errors)} of {JOBS} jobs failed; first:\n{errors[0]}"
    prefixes = [prefix for _, payload in outcomes for prefix in payload]
    assert len(set(prefixes)) == 2 * JOBS, f"datasets shared a shared-memory prefix: {sorted(prefixes)}"
