"""The seed statistics of the convergence driver against SciPy's t distribution and Welch test, and the verdicts."""

from __future__ import annotations

import math
import statistics

import pytest

from seed_stats import (MIN_SEEDS, compare, paired_trend, parse_run_label, pool_paired, run_label, student_t_cdf,
                        student_t_quantile)


@pytest.mark.parametrize("df", [1.0, 2.0, 3.7, 10.0, 57.5])
@pytest.mark.parametrize("t", [-6.0, -1.3, 0.0, 0.4, 2.776, 12.0])
def test_student_t_matches_scipy(t, df):
    stats = pytest.importorskip("scipy.stats")
    assert student_t_cdf(t, df) == pytest.approx(stats.t.cdf(t, df), abs=1e-12)


@pytest.mark.parametrize("df", [1.5, 4.0, 30.0])
@pytest.mark.parametrize("p", [0.025, 0.5, 0.975])
def test_student_t_quantile_inverts_the_cdf(p, df):
    stats = pytest.importorskip("scipy.stats")
    assert student_t_quantile(p, df) == pytest.approx(stats.t.ppf(p, df), abs=1e-7)


def test_known_quantile_without_scipy():
    # Tables: the two-sided 5% critical value of t with 4 degrees of freedom is 2.776.
    assert student_t_quantile(0.975, 4) == pytest.approx(2.7764451, abs=1e-6)
    assert student_t_cdf(0.0, 7) == 0.5
    with pytest.raises(ValueError, match="df=0"):
        student_t_cdf(1.0, 0)


def _curves(losses: dict[int, float], step: int = 2000) -> dict[int, dict[int, float]]:
    return {seed: {step // 2: loss + 1.0, step: loss} for seed, loss in losses.items()}


def test_welch_test_matches_scipy_and_hand_computation():
    stats = pytest.importorskip("scipy.stats")
    arm, base = {17: 1.7050, 18: 1.7010, 19: 1.6990}, {17: 1.6981, 18: 1.7008, 19: 1.6929}
    r = compare(_curves(arm), _curves(base), complete_step=2000)
    ref = stats.ttest_ind(list(arm.values()), list(base.values()), equal_var=False)
    assert r.welch_t == pytest.approx(ref.statistic, rel=1e-9)
    assert r.p_value == pytest.approx(ref.pvalue, rel=1e-7)
    a, b = statistics.fmean(arm.values()), statistics.fmean(base.values())
    assert r.gap_pct == pytest.approx(100 * (a - b) / b)
    paired = statistics.fmean(100 * (arm[s] - base[s]) / base[s] for s in arm)
    assert r.paired_gap_pct == pytest.approx(paired)
    lo, hi = r.ci95_pct
    assert lo < r.gap_pct < hi
    half = (hi - lo) / 2 * b / 100
    se = math.sqrt(statistics.variance(arm.values()) / 3 + statistics.variance(base.values()) / 3)
    assert half == pytest.approx(stats.t.ppf(0.975, r.welch_df) * se, rel=1e-6)
    assert r.verdict == "above"  # 1.70167 > the baseline's highest seed, 1.7008


def test_paired_test_over_seeds_matches_scipy_and_weighs_each_seed_once():
    stats = pytest.importorskip("scipy.stats")
    # Seed 17 run twice by the arm and by the baseline: each seed's runs are averaged before pairing.
    arm = {(17, 1): 1.7000, (17, 2): 1.7100, 18: 1.7150, 19: 1.6950, 20: 1.6800}
    base = {(17, 1): 1.6981, (17, 2): 1.6995, 18: 1.7089, 19: 1.6897, 21: 1.6743}
    r = compare(_curves(arm), _curves(base), complete_step=2000)
    a = {17: 1.7050, 18: 1.7150, 19: 1.6950}
    b = {17: (1.6981 + 1.6995) / 2, 18: 1.7089, 19: 1.6897}
    gaps = [100 * (a[s] / b[s] - 1) for s in a]
    assert r.paired_gap_pct == pytest.approx(statistics.fmean(gaps))
    ref = stats.ttest_1samp(gaps, 0.0)
    assert r.paired_p_value == pytest.approx(ref.pvalue, rel=1e-7)
    half = stats.t.ppf(0.975, 2) * statistics.stdev(gaps) / math.sqrt(3)
    assert r.paired_ci95_pct == pytest.approx((statistics.fmean(gaps) - half, statistics.fmean(gaps) + half))
    one = compare(_curves({17: 1.70, 20: 1.69}), _curves({17: 1.69, 21: 1.68}), complete_step=2000)
    assert one.paired_gap_pct == pytest.approx(100 * (1.70 / 1.69 - 1))
    assert one.paired_ci95_pct is None and one.paired_p_value is None  # one common seed: no interval


def test_paired_trend_fits_each_seeds_gap_and_tests_the_slopes_over_seeds():
    """Each seed's slope is the least-squares line of its paired gap over the steps from ``from_step`` that all its
    runs reached (numpy's polyfit as the reference), its runs averaged first; the slopes' mean is tested as the
    paired gap is (scipy's one-sample t)."""
    np = pytest.importorskip("numpy")
    stats = pytest.importorskip("scipy.stats")
    steps = [100, 200, 300, 400, 500, 600]
    base = {seed: {s: 3.0 - 0.001 * s + 0.01 * seed for s in steps} for seed in (17, 18, 19)}
    rises = {17: 0.04, 18: 0.06, 19: 0.03}  # % of the baseline per 100 steps
    arm = {seed: {s: base[seed][s] * (1 + (rises[seed] * s / 100 + 0.1 * (s % 300 == 0)) / 100) for s in steps}
           for seed in rises}
    # Seed 17 run three times by the arm: a second complete run is averaged in; a third, stopped at step 400, is left
    # out rather than cutting the seed's steps.
    runs = {(17, 1): arm[17], (17, 2): {s: v * 1.001 for s, v in arm[17].items()},
            (17, 3): {s: v * 1.02 for s, v in arm[17].items() if s <= 400}, 18: arm[18], 19: arm[19]}
    t = paired_trend(runs, base, 300)
    assert (t["from_step"], t["to_step"], t["seeds"]) == (300, 600, 3)
    expected = {}
    kept = [s for s in steps if s >= 300]
    for seed in rises:
        a = [(runs[(17, 1)][s] + runs[(17, 2)][s]) / 2 if seed == 17 else runs[seed][s] for s in kept]
        gaps = [100 * (x / base[seed][s] - 1) for x, s in zip(a, kept)]
        expected[seed] = 100 * np.polyfit(kept, gaps, 1)[0]
    assert t["slopes"] == pytest.approx({str(seed): slope for seed, slope in expected.items()})
    slopes = list(expected.values())
    assert t["slope_per_100_pct"] == pytest.approx(statistics.fmean(slopes))
    assert t["p_value"] == pytest.approx(stats.ttest_1samp(slopes, 0.0).pvalue, rel=1e-7)
    half = stats.t.ppf(0.975, 2) * statistics.stdev(slopes) / math.sqrt(3)
    assert t["ci95"] == pytest.approx((statistics.fmean(slopes) - half, statistics.fmean(slopes) + half))
    # Fewer than three common steps from from_step: no trend for that seed, and None without any.
    assert paired_trend({17: arm[17]}, {17: base[17]}, 500) is None
    assert paired_trend({17: arm[17], 20: arm[18]}, {17: base[17]}, 100)["seeds"] == 1


def test_verdicts_inside_below_and_incomplete():
    base = {17: 1.70, 18: 1.71, 19: 1.72}
    assert compare(_curves({17: 1.705, 18: 1.715, 19: 1.71}), _curves(base), 2000).verdict == "inside"
    assert compare(_curves({17: 1.60, 18: 1.61, 19: 1.62}), _curves(base), 2000).verdict == "below"
    two = compare(_curves({17: 1.705, 18: 1.715}), _curves(base), 2000)
    assert MIN_SEEDS == 3 and two.verdict == "incomplete: inside"
    # A seed that stopped early moves the comparison to the last step every seed reached, and it is not final.
    partial = _curves({17: 1.705, 18: 1.715, 19: 1.71})
    del partial[19][2000]
    early = compare(partial, _curves(base), 2000)
    assert early.step == 1000 and early.verdict.startswith("incomplete")
    assert compare({17: {}}, _curves(base), 2000) is None


def test_runs_stopped_early_are_left_out_once_enough_seeds_finished():
    base = {17: 1.70, 18: 1.71, 19: 1.72}
    finished = _curves({17: 1.705, 18: 1.715, 19: 1.71})
    stopped = {(seed, 2): {1000: loss} for seed, loss in {17: 2.9, 18: 2.8, 19: 2.7}.items()}
    arm = {(seed, 1): curve for seed, curve in finished.items()} | stopped
    r = compare(arm, _curves(base), 2000)
    assert r.step == 2000 and r.verdict == "inside"
    assert sorted(r.arm_losses) == [(17, 1), (18, 1), (19, 1)] and set(r.left_out) == set(stopped)
    assert r.arm_mean == pytest.approx(statistics.fmean([1.705, 1.715, 1.71]))
    assert sorted(r.to_json()["left_out"]) == ["17@run2", "18@run2", "19@run2"]


def test_pooling_one_cell_is_its_paired_t_test():
    arm = {17: 1.7050, 18: 1.7150, 19: 1.6950, 20: 1.6990}
    base = {17: 1.6981, 18: 1.7089, 19: 1.6897, 20: 1.7010}
    r = compare(_curves(arm), _curves(base), complete_step=2000)
    pool = pool_paired({"cell": {s: 100 * (arm[s] / base[s] - 1) for s in arm}})
    assert pool.mean_pct == pytest.approx(r.paired_gap_pct)
    assert pool.df == pytest.approx(3)
    assert pool.ci95_pct == pytest.approx(r.paired_ci95_pct)
    assert pool.p_value == pytest.approx(r.paired_p_value)


def test_pooled_cells_weigh_the_same_with_welch_satterthwaite_degrees_of_freedom():
    stats = pytest.importorskip("scipy.stats")
    cells = {"a": {17: 0.9, 18: -0.2, 19: 1.4}, "b": {17: -0.31, 18: -0.40, 19: -0.22, 20: -0.35, 21: -0.30},
             "c": {17: 0.05, 18: -0.6}}
    pool = pool_paired(cells)
    means = [statistics.fmean(g.values()) for g in cells.values()]
    v = [statistics.variance(g.values()) / len(g) for g in cells.values()]
    k = [len(g) for g in cells.values()]
    se = math.sqrt(sum(v)) / 3
    df = sum(v) ** 2 / sum(vi**2 / (ki - 1) for vi, ki in zip(v, k))
    assert pool.mean_pct == pytest.approx(statistics.fmean(means))
    assert (pool.se_pct, pool.df) == pytest.approx((se, df))
    half = stats.t.ppf(0.975, df) * se
    assert pool.ci95_pct == pytest.approx((pool.mean_pct - half, pool.mean_pct + half))
    assert pool.p_value == pytest.approx(2 * stats.t.sf(abs(pool.mean_pct) / se, df))
    assert pool.above_cells == ("a",)


def test_cells_of_equal_spread_pool_their_degrees_of_freedom():
    # Three cells of three seeds with the same variance: Welch-Satterthwaite gives 3 * (3 - 1) degrees of freedom.
    cells = {name: {17: shift - 1.0, 18: shift, 19: shift + 1.0} for name, shift in (("a", 0.0), ("b", 2.0), ("c", -5))}
    pool = pool_paired(cells)
    assert pool.df == pytest.approx(6)
    assert pool.se_pct == pytest.approx(math.sqrt(3 * 1.0 / 3) / 3)


def test_pooling_refuses_a_cell_without_a_spread_to_weigh_it_by():
    with pytest.raises(ValueError, match=r"cells \{'csource': 1\} hold fewer than 2 seeds"):
        pool_paired({"pysource": {17: 0.1, 18: 0.2}, "csource": {17: 2.27}})
    with pytest.raises(ValueError, match="no cell"):
        pool_paired({})
    flat = pool_paired({"a": {17: 0.5, 18: 0.5}})
    assert flat.ci95_pct is None and flat.p_value is None and flat.mean_pct == pytest.approx(0.5)


@pytest.mark.parametrize("run", [17, (17, 2), (3, 11)])
def test_a_run_label_reads_back_as_its_run(run):
    assert parse_run_label(run_label(run)) == run
