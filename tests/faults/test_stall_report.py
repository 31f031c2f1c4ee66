"""The recipe entrypoint's answer to a collective timeout (fast, in spawned ranks; the real SIGSTOP of a rank is in
test_launcher_faults.py): the ranks that time out report themselves, the silent ones are named as stalled, and the
SIGTERM flags' all-reduce, the first collective a rank stopped at a batch end leaves waiting, times out too."""

from __future__ import annotations

import time

import pytest
from composer.core import Event
from dist_spawn import RankInfo, run_ranks

from composer_qsdp.recipes.failures import CollectiveTimeoutError, collective_timeout, is_timeout
from composer_qsdp.recipes.preemption import SigtermCheckpoint

GLOO_TIMEOUT = RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 1000ms for recv operation")


def _report(info: RankInfo, silent_rank: int | None) -> str | None:
    """Every rank but ``silent_rank`` (a stalled one) answers a collective's timeout; returns its error message."""
    if info.rank == silent_rank:
        time.sleep(3)  # alive, holding its part of the group, reporting nothing
        return None
    start = time.monotonic()
    error = collective_timeout(GLOO_TIMEOUT, timeout_s=1.5)
    assert isinstance(error, CollectiveTimeoutError)
    assert time.monotonic() - start < 5  # bounded by the report grace, min(10 s, dist_timeout)
    return str(error)


def test_the_silent_rank_is_named():
    messages = run_ranks(_report, 3, 1, timeout_s=120)
    for rank in (0, 2):
        assert messages[rank].startswith(f"rank {rank}: a collective waited dist_timeout=1.5 s for the other processes "
                                         "and timed out; rank(s) 1 of 3 did not answer: stalled"), messages[rank]
        assert "raise the recipe key dist_timeout" in messages[rank]


def test_a_timeout_on_every_rank_names_none():
    for message in run_ranks(_report, 2, None, timeout_s=120):
        assert "every rank reports the same timeout" in message, message


def test_timeouts_are_found_through_wrapping_exceptions():
    assert collective_timeout(RuntimeError("Read error: Connection reset by peer"), 10) is None  # a dead peer
    assert not is_timeout(ValueError("timed out"))  # not a collective's error
    wrapped = ValueError("Composer's wrapper")
    wrapped.__cause__ = GLOO_TIMEOUT
    assert is_timeout(wrapped)


def _flags_with_a_silent_peer(info: RankInfo, dist_timeout: float) -> float | None:
    """Both ranks agree on the SIGTERM flags at one batch end; at the next, rank 1 stays silent (alive) while rank 0
    asks again. Returns how long rank 0 waited for the timeout."""
    flags = SigtermCheckpoint(None, dist_timeout)
    flags.run_event(Event.BATCH_END, None, None)  # BATCH_END reads neither the state nor the logger
    if info.rank == 1:
        time.sleep(dist_timeout + 5)
        return None
    start = time.monotonic()
    with pytest.raises(RuntimeError) as raised:
        flags.run_event(Event.BATCH_END, None, None)
    assert is_timeout(raised.value), raised.value
    return time.monotonic() - start


def test_the_sigterm_flags_wait_dist_timeout_for_a_silent_peer():
    """The flags' group is a group of its own, which would wait torch's default 30 minutes, not dist_timeout: a rank
    stopped at a batch end would hold the other there, short of the report that names it."""
    waited, _ = run_ranks(_flags_with_a_silent_peer, 2, 1.5, timeout_s=120)
    assert 1.5 <= waited < 5, waited
