"""A setting that makes a unit's quantized traffic larger than unquantized bf16 (tiny buckets, whose per-bucket
metadata outweighs the codes) is reported when the per-unit plan is made, for QSDP and apply_qsdp alike; the
traffic summary says "more" when more was sent."""

from __future__ import annotations

import warnings

import pytest
import torch.nn as nn

from composer_qsdp.config import from_preset
from composer_qsdp.comm.accounting import TrafficCounter, TrafficReport
from composer_qsdp.engine.plan import Unit, plan_units
from composer_qsdp.schemes import build_scheme

UNITS = [Unit("blocks.0", nn.Linear(64, 64), 64 * 64 + 64), Unit("", nn.Linear(8, 8), 8 * 8 + 8)]


def test_buckets_too_small_to_save_bytes_are_reported():
    # 8-bit codes plus per-bucket metadata of every 3 elements: above bf16's 2 bytes per element on both sides.
    config = from_preset("w8g8", bucket_size=3)
    wire = build_scheme("weights", config.weights, 8).codec.wire_bytes(UNITS[0].numel)
    assert wire > 2 * UNITS[0].numel  # the premise, from the codec's own wire size
    with pytest.warns(UserWarning) as record:
        plan_units(UNITS, config)
    messages = [str(w.message) for w in record if "more bytes than bf16" in str(w.message)]
    assert len(messages) == 2, messages  # one per side, naming every unit it affects
    weights = next(m for m in messages if m.startswith("QSDP weights"))
    assert "'blocks.0'" in weights and "'<root>'" in weights and "bucket_size=3" in weights
    assert f"{wire / UNITS[0].numel:.2f} bytes per element" in weights


def test_the_default_buckets_are_not_reported():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan_units(UNITS, from_preset("w8g8"))
        plan_units(UNITS, from_preset("w4g4"))


def test_the_summary_says_more_when_more_was_sent():
    grown = TrafficCounter(calls=1, sent=360, bf16=200, native=400)
    summary = TrafficReport(grown, TrafficCounter()).summary()
    assert "200 B (1.80x more) | unquantized      400 B (1.11x less)" in summary, summary
