"""``benchmarks/weight_error.py`` on the tiny GPT's real FSDP2 units (2 gloo ranks): it runs every bucketing variant
in one process group, and its figures show the property its Hadamard reading rests on."""

from __future__ import annotations

import json
import statistics

import pytest
import weight_error


def _blocks(rows: dict, variant: str) -> float:
    """Mean relative error over the blocks' units of one bucketing variant."""
    return statistics.mean(e for unit, e in rows[variant]["errors"].items() if unit.startswith("blocks."))


def test_a_rotation_in_plain_buckets_costs_what_aligned_buckets_do_not(tmp_path):
    """At initialization a block's LayerNorm gains (1) share plain buckets with weights of scale 0.02; rotated, their
    mean becomes one coefficient of about k/sqrt(n) that sets the step of the whole bucket, so plain buckets carry
    several times the error of parameter-aligned ones, where the gains' run is a bucket of its own."""
    assert weight_error.main(["--model", "tiny", "--bits", "8", "--hadamard", "--out-dir", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "weight_error-w8-stochastic-hadamard.json").read_text())
    assert record["args"]["hadamard"] and record["args"]["rounding"] == "stochastic"
    rows = record["rows"]
    assert set(rows) == set(weight_error.VARIANTS)

    assert _blocks(rows, "plain") > 3 * _blocks(rows, "aligned")
    assert 0 < _blocks(rows, "aligned") < 2 ** -7  # an 8-bit step's error on weights of one scale, not a spike's
    assert (tmp_path / "weight_error-w8-stochastic-hadamard.md").read_text().startswith("# 8-bit weight all-gather")


def test_a_rotation_costs_the_gains_once_they_differ_even_in_aligned_buckets(tmp_path):
    """Gains of exactly 1 rotate into a spike and zeros, both on the min-max lattice, so initialization hides the
    rotation's cost; gains spread by training (1 + N(0, 0.01)) leave small coefficients beside the spike, whose step
    the spike sets, and the rotated error lands on the gains even when they have a bucket of their own. Sending the
    norms raw removes it."""
    assert weight_error.main(["--model", "tiny", "--bits", "8", "--hadamard", "--gain-std", "0.01",
                              "--out-dir", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "weight_error-w8-stochastic-hadamard-gains0.01.json").read_text())
    assert record["args"]["gain_std"] == 0.01
    rows = record["rows"]

    assert _blocks(rows, "aligned") > 3 * _blocks(rows, "aligned, norms and biases raw")
    assert 0 < _blocks(rows, "aligned, norms and biases raw") < 2 ** -7


@pytest.mark.parametrize("std", ["-0.01", "nan"])
def test_a_negative_or_nan_gain_spread_is_refused_with_its_value(std, capsys):
    with pytest.raises(SystemExit):
        weight_error.main(["--model", "tiny", "--gain-std", std])
    assert f"--gain-std={float(std)} is invalid; it must be >= 0" in capsys.readouterr().err
