"""``benchmarks/pooled_gaps.py``: each cell's comparison read from convergence records (a later record's comparison of
an arm replacing an earlier one's, an aliased name counting as its arm), the per-cell paired gaps against
hand-computed ones, the pool against :func:`seed_stats.pool_paired` of those gaps, and incomplete cells left out
with their verdicts."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

import pooled_gaps
import seed_stats


def comparison(arm: dict[str, float], base: dict[str, float], verdict: str = "inside") -> dict:
    return {"step": 2000, "arm_losses": arm, "baseline_losses": base, "verdict": verdict}


def record(path: Path, groups: dict[str, dict]) -> Path:
    path.write_text(json.dumps({"arm_names": {}, "header": {}, "arms": {},
                                "seed_groups": {arm: {"baseline": "baseline-1r", "seeds": [17, 18, 19],
                                                      "comparison": c} for arm, c in groups.items()}}))
    return path


BASE = {"17": 2.0, "18": 2.1, "19": 1.9}


def test_cells_pool_their_seeds_gaps_and_later_records_and_aliases_win(tmp_path, capsys):
    old = record(tmp_path / "old.json", {"w8g8": comparison({"17": 9.0, "18": 9.0, "19": 9.0}, BASE)})
    new = record(tmp_path / "new.json", {"w8g8": comparison({"17": 2.02, "18": 2.1, "19": 1.919}, BASE)})
    # Seed 17 run twice by the arm: its runs are averaged before the seed is paired.
    three = {"17": 3.0, "18": 3.0, "19": 3.0}
    other = record(tmp_path / "other.json", {
        "w8g8": comparison({"17@run1": 3.0, "17@run2": 3.2, "18": 2.97, "19": 3.03}, three),
        "q-ahead": comparison({"17": 3.3, "18": 3.0, "19": 3.0}, three, "incomplete: above"),
    })
    out = tmp_path / "out"
    pooled_gaps.main(["--arms", "w8g8", "q", "--cell", "a", str(old), str(new), "--cell", "b", str(other),
                      "--alias", "q-ahead=q", "--out-dir", str(out)])
    text = capsys.readouterr().out
    data = json.loads((out / "pooled_gaps.json").read_text())
    assert (out / "pooled_gaps.md").read_text() == text
    w8g8 = data["arms"]["w8g8"]
    a = {17: 1.0, 18: 0.0, 19: 1.0}
    b = {17: 100 * (3.1 / 3.0 - 1), 18: -1.0, 19: 1.0}
    for cell, expected in (("a", a), ("b", b)):
        assert {int(s): g for s, g in w8g8["pooled"]["gaps_pct"][cell].items()} == pytest.approx(expected)
    ref = seed_stats.pool_paired({"a": a, "b": b})
    assert w8g8["pooled"]["mean_pct"] == pytest.approx(statistics.fmean([statistics.fmean(a.values()),
                                                                        statistics.fmean(b.values())]))
    assert w8g8["pooled"]["ci95_pct"] == pytest.approx(ref.ci95_pct)
    assert w8g8["cells"]["a"]["record"] == str(new)
    q = data["arms"]["q"]
    assert q["left_out"] == {"a": "not run", "b": "incomplete: above"} and "pooled" not in q
    assert q["cells"]["b"]["recorded_as"] == "q-ahead"
    assert "| `q` | not run | +3.33% (3 seeds, not pooled: incomplete: above) | no complete cell |" in text


def test_bad_command_lines_name_what_to_write(tmp_path, capsys):
    path = record(tmp_path / "r.json", {"w8g8": comparison(BASE, BASE)})
    for argv, message in ((["--arms", "w8g8", "--cell", "a"], "--cell a names no record"),
                          (["--arms", "w8g8", "--cell", "a", str(path), "--cell", "a", str(path)], "named twice"),
                          (["--arms", "w8g8", "--cell", "a", str(tmp_path / "none.json")], "no record at"),
                          (["--arms", "w8g8", "--cell", "a", str(path), "--alias", "x"], "write RECORDED=ARM")):
        with pytest.raises(SystemExit):
            pooled_gaps.main(argv)
        assert message in capsys.readouterr().err
