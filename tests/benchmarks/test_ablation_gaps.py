"""``benchmarks/ablation_gaps.py``: each arm's gap to the same seed's baseline run, from convergence records, against
hand-computed percentages; a later record's run replaces an earlier one's; a missing run is named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import ablation_gaps


def record(path: Path, arms: dict[str, dict]) -> Path:
    path.write_text(json.dumps({"header": {}, "arms": arms}))
    return path


def run(val: dict[int, float], train: dict[int, float] | None = None, errors: tuple | None = None) -> dict:
    out = {"curve": [[s, v] for s, v in val.items()], "train_curve": [[s, v] for s, v in (train or {}).items()]}
    if errors:
        out["rel_error"] = {"weights": errors[0], "grads": errors[1]}
    return out


def rows(text: str) -> dict[str, list[str]]:
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for line in text.splitlines()
            if line.startswith("| `") for cells in [line.strip("|").split("|")]}


def test_gaps_are_percent_of_the_same_seeds_baseline_and_later_records_win(tmp_path, capsys):
    first = record(tmp_path / "a.json", {
        "baseline-1r@s17": run({200: 4.0, 400: 2.0}, {100: 5.0}),
        "baseline-1r@s18": run({200: 1.0, 400: 1.0}),
        "x@s17": run({200: 9.0, 400: 9.0}),  # replaced by the later record's run
    })
    second = record(tmp_path / "b.json", {
        "x@s17": run({200: 4.1, 400: 1.9}, {100: 5.5}, errors=(0.001, 0.25)),
        "y@s17": run({200: 3.8}, errors=(None, 0.5)),
    })
    ablation_gaps.main([str(first), str(second), "--seed", "17", "--arms", "x", "y", "--windows", "100"])
    val, train = capsys.readouterr().out.split("Training loss")
    assert "| arm | rel. error w / g | 200 | 400 |" in val  # every evaluation of the baseline's run by default
    assert rows(val) == {"`x`": ["0.001 / 0.250", "+2.50", "-5.00"], "`y`": ["- / 0.500", "-5.00", ""]}
    assert rows(train)["`x`"] == ["0.001 / 0.250", "+10.00"]


def test_a_missing_run_is_named_with_what_the_records_hold(tmp_path):
    path = record(tmp_path / "a.json", {"baseline-1r@s17": run({200: 4.0}), "x@s18": run({200: 4.0})})
    with pytest.raises(SystemExit, match=r"no run of seed 17 for \['x'\].*'x@s18'"):
        ablation_gaps.main([str(path), "--seed", "17", "--arms", "x"])
    with pytest.raises(SystemExit, match=r"no run 'baseline-1r@s19'"):
        ablation_gaps.main([str(path), "--seed", "19", "--arms", "x"])
