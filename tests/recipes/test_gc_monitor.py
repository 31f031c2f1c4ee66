"""GCMonitor counts and times the garbage collections between batch ends, and stops observing at the fit's end."""

import gc

import pytest

from composer_qsdp.recipes.gc_monitor import GCMonitor


class _Logger:
    def __init__(self) -> None:
        self.logged: list[dict[str, float]] = []

    def log_metrics(self, metrics: dict[str, float]) -> None:
        self.logged.append(metrics)


@pytest.fixture
def no_automatic_gc():
    """Only the test's own collections run (an automatic one would be counted too)."""
    enabled = gc.isenabled()
    gc.disable()
    yield
    if enabled:
        gc.enable()


def test_each_batch_logs_the_collections_since_the_previous_batch_end(no_automatic_gc):
    monitor, logger = GCMonitor(), _Logger()
    monitor.fit_start(None, logger)
    try:
        gc.collect(2)
        gc.collect(0)
        gc.collect(2)
        monitor.batch_end(None, logger)
        monitor.batch_end(None, logger)  # nothing collected in between
    finally:
        monitor.fit_end(None, logger)
    first, second = logger.logged
    assert first["gc/gen2_collections"] == 2
    assert 0 < first["gc/gen2_ms"] <= first["gc/ms"]
    assert second == {"gc/gen2_collections": 0, "gc/gen2_ms": 0.0, "gc/ms": 0.0}


def test_nothing_is_observed_outside_training(no_automatic_gc):
    monitor, logger = GCMonitor(), _Logger()
    monitor.fit_start(None, logger)
    monitor.eval_start(None, logger)
    gc.collect(2)  # evaluation
    monitor.eval_end(None, logger)
    monitor.batch_end(None, logger)
    monitor.fit_end(None, logger)
    gc.collect(2)  # after the fit
    assert logger.logged == [{"gc/gen2_collections": 0, "gc/gen2_ms": 0.0, "gc/ms": 0.0}]
    assert monitor._observe not in gc.callbacks
