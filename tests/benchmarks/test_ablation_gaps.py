"""``benchmarks/ablation_gaps.py``: each arm's gap to the same seed's baseline run, from convergence records, against
hand-computed percentages; over several seeds, the paired mean and its Student-t interval against a float64
computation; a later record's run replaces an earlier one's; a combined record's finished run stands for its seed;
a missing run is named."""

from __future__ import annotations

import json
import statistics
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
    with pytest.raises(SystemExit, match=r"no run \['x@s17'\].*'x@s18'"):
        ablation_gaps.main([str(path), "--seed", "17", "--arms", "x"])
    with pytest.raises(SystemExit, match=r"no run \['baseline-1r@s19'\]"):
        ablation_gaps.main([str(path), "--seed", "19", "--arms", "x"])
    with pytest.raises(SystemExit, match=r"no run \['baseline-1r@s18'\]"):
        ablation_gaps.main([str(path), "--seeds", "17", "18", "--arms", "x"])


def test_windows_of_records_without_training_curves_are_refused_by_name(tmp_path, capsys):
    old = run({200: 4.1})
    del old["train_curve"]
    path = record(tmp_path / "a.json", {"baseline-1r@s17": run({200: 4.0}, {200: 5.0}), "x@s17": old})
    with pytest.raises(SystemExit, match=r"records of \['x@s17'\] do not hold.*leave --windows out"):
        ablation_gaps.main([str(path), "--seed", "17", "--arms", "x", "--windows", "200"])
    ablation_gaps.main([str(path), "--seed", "17", "--arms", "x"])  # the validation gaps need none
    assert rows(capsys.readouterr().out) == {"`x`": ["- / -", "+2.50"]}


def test_records_from_before_the_renaming_give_their_arms_current_names(tmp_path):
    """A record without ``arm_names`` names the paper's W8G4 ``w8g4`` and the LoCo one ``w8g4-loco``: their runs are
    ``w8g4-paper`` and ``w8g4`` now; a record with it is read as written."""
    arms = {"baseline-1r@s17": run({200: 4.0}), "w8g4@s17": run({200: 4.1}), "w8g4-loco@s17": run({200: 4.0})}
    old = record(tmp_path / "old.json", arms)
    assert ablation_gaps.load_arms([old]) == {"baseline-1r@s17": arms["baseline-1r@s17"],
                                              "w8g4-paper@s17": arms["w8g4@s17"], "w8g4@s17": arms["w8g4-loco@s17"]}
    new = tmp_path / "new.json"
    new.write_text(json.dumps({"arm_names": 2, "header": {}, "arms": arms}))
    assert ablation_gaps.load_arms([new]) == arms


def test_several_seeds_give_each_seeds_gap_and_their_paired_mean_interval_and_p(tmp_path, capsys):
    base = {17: 4.0, 18: 2.0, 19: 5.0}
    arm = {17: 4.04, 18: 2.01, 19: 5.10}  # gaps +1%, +0.5%, +2%
    path = record(tmp_path / "a.json", {
        **{f"baseline@s{s}": run({200: base[s], 400: 1.0}, {300: base[s]}) for s in base},
        **{f"x@s{s}": run({200: arm[s]}, {300: 2 * base[s]}) for s in base},
    })
    ablation_gaps.main([str(path), "--seeds", "17", "18", "19", "--baseline", "baseline", "--arms", "x",
                        "--windows", "300"])
    val, train = capsys.readouterr().out.split("Training loss")
    assert "| arm | step | s17 / s18 / s19 | paired mean | 95% | p |" in val
    gaps = [1.0, 0.5, 2.0]
    mean, se = statistics.fmean(gaps), statistics.stdev(gaps) / 3**0.5
    # Student's t with 2 degrees of freedom in closed form: cdf(t) = 1/2 + t / (2 sqrt(2 + t^2))
    half = 0.95 / (2 * 0.975 * 0.025) ** 0.5 * se
    t = mean / se
    t_p = 1 - t / (2 + t * t) ** 0.5
    cells = [line.strip("|").split("|") for line in val.splitlines() if line.startswith("| `x`")]
    assert len(cells) == 1, "step 400: the arm has no evaluation there, so no row"
    step, per_seed, paired, ci, p = (c.strip() for c in cells[0][1:])
    assert (step, per_seed, paired) == ("200", "+1.00 / +0.50 / +2.00", f"{mean:+.2f}%")
    assert ci == f"{mean - half:+.2f} .. {mean + half:+.2f}%"
    assert float(p) == pytest.approx(t_p, abs=1e-3)
    assert "| `x` | 300 | +100.00 / +100.00 / +100.00 | +100.00% | n/a | n/a |" in train


def test_a_combined_records_finished_run_stands_for_its_seed(tmp_path, capsys):
    """``--combine`` labels a seed run in two sessions ``@run1`` / ``@run2``: the finished one is read, the one a
    session's end stopped is not; a seed finished twice stays ambiguous and is named."""
    def of(arm: str, i: int, complete: bool, val: dict[int, float]) -> dict:  # as combine_records labels a run
        return run(val) | {"arm": arm, "run": i, "complete": complete}

    path = record(tmp_path / "c.json", {
        "baseline-1r@s17@run1": of("baseline-1r@s17", 1, True, {200: 4.0, 400: 2.0}),
        "baseline-1r@s17@run2": of("baseline-1r@s17", 2, False, {200: 9.0}),
        "x@s17": of("x@s17", 2, True, {200: 4.2, 400: 2.1}),
        "y@s17@run1": of("y@s17", 1, True, {200: 4.0, 400: 2.0}),
        "y@s17@run2": of("y@s17", 2, True, {200: 4.0, 400: 2.0}),
    })
    ablation_gaps.main([str(path), "--seed", "17", "--arms", "x"])
    assert rows(capsys.readouterr().out) == {"`x`": ["- / -", "+5.00", "+5.00"]}
    with pytest.raises(SystemExit, match=r"no run \['y@s17'\].*'y@s17@run1', 'y@s17@run2'"):
        ablation_gaps.main([str(path), "--seed", "17", "--arms", "y"])
