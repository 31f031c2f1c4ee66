"""Seed statistics of convergence arms: is an arm's final loss inside plain FSDP2's seed range, and how sure is it.

A convergence arm run with several recipe seeds (``convergence.py --seeds``) gives one final validation loss per
seed, and a seed run again (another session: GPU kernels are not bitwise deterministic, and training amplifies the
difference) gives another. :func:`compare` sets an arm's runs against its baseline's, every run one sample: the
means, the sample standard deviations, the baseline's range, the gap of the means in percent with Welch's t-test
(unequal variances, Welch-Satterthwaite degrees of freedom) and its 95% confidence interval, and the paired gap:
each seed's gap (the mean of its arm runs against the mean of its baseline runs: the same initial weights and data
order), averaged over the seeds both sides ran, with the paired t-test's 95% interval and p over those seeds. The seed
is a large share of the spread (at GPT-125M on ``pysource``, plain FSDP2's five seeds span 2.1% at step 2,000, while
its three seeds run twice ended 0.08-0.48% apart: ``results/2026-11-30_h200x2_5251474``), so the paired interval is
the narrower one when the seeds agree.

The verdict follows the project's definition of lossless: the arm's mean ends inside the baseline's range (min..max),
with at least :data:`MIN_SEEDS` distinct complete seeds on each side; ``below`` (a lower loss than every baseline
run) is not a loss either. Student's t distribution is computed here (regularized incomplete beta function by its
continued fraction), so the driver needs no SciPy on a GPU host.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Union

__all__ = ["MIN_SEEDS", "PooledGap", "Run", "SeedComparison", "compare", "paired_gaps", "paired_trend",
           "parse_run_label", "pool_paired", "run_label", "student_t_cdf", "student_t_quantile"]

#: One run of an arm: its seed, or (seed, run index) where a seed ran more than once.
Run = Union[int, tuple[int, int]]

#: Distinct seeds per side before a verdict counts as evidence (the round-5 protocol).
MIN_SEEDS = 3


def _seed(run: Run) -> int:
    return run if isinstance(run, int) else run[0]


def _order(run: Run) -> tuple[int, int]:
    return (run, 0) if isinstance(run, int) else run


def run_label(run: Run) -> str:
    """``"17"`` for seed 17, ``"17@run2"`` for its run in the second of several combined records."""
    return str(run) if isinstance(run, int) else f"{run[0]}@run{run[1]}"


def parse_run_label(label: str) -> Run:
    """The :data:`Run` that :func:`run_label` wrote as ``label`` (a comparison's ``arm_losses`` keys in JSON)."""
    seed, _, run = label.partition("@run")
    return (int(seed), int(run)) if run else int(seed)


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz's method)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) for x in [0, 1]."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def student_t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t distribution with ``df`` > 0 degrees of freedom (not necessarily an integer)."""
    if df <= 0:
        raise ValueError(f"df={df!r} is invalid; it must be > 0")
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def student_t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on :func:`student_t_cdf`)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p={p!r} is invalid; it must be in (0, 1)")
    lo, hi = -1.0, 1.0
    while student_t_cdf(lo, df) > p:
        lo *= 2.0
    while student_t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if student_t_cdf(mid, df) < p else (lo, mid)
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class SeedComparison:
    """An arm's seeds against its baseline's seeds at one step (losses in nats/token, gaps in percent of the
    baseline's mean).

    Attributes:
        step: the step compared: ``complete_step`` where at least :data:`MIN_SEEDS` distinct seeds of each side
            finished, else the last evaluation every run of both sides reached.
        arm_losses / baseline_losses: final validation loss by :data:`Run`.
        arm_mean / arm_std / baseline_mean / baseline_std: means and sample standard deviations over runs (std None
            with one run).
        baseline_range: the baseline's lowest and highest run.
        gap_pct: (arm mean - baseline mean) / baseline mean.
        paired_gap_pct: the mean, over the seeds both sides ran, of each seed's gap: the mean of the arm's runs of
            that seed against the mean of the baseline's (None without a common seed).
        paired_ci95_pct / paired_p_value: the paired t-test of ``paired_gap_pct`` over those seeds (n - 1 degrees of
            freedom; two-sided): its 95% confidence interval and p (None with fewer than 2 common seeds).
        welch_t / welch_df / p_value: Welch's t-test of equal means (two-sided); None with fewer than 2 runs a side.
        ci95_pct: the 95% confidence interval of ``gap_pct`` from Welch's t (None likewise).
        verdict: ``inside`` / ``below`` / ``above`` the baseline's range, prefixed ``incomplete:`` while either side
            has fewer than :data:`MIN_SEEDS` distinct seeds or a run stopped before ``complete_step``.
        left_out: the runs (either side) that stopped before ``complete_step`` and were left out because enough
            seeds finished.
    """

    step: int
    arm_losses: dict[Run, float]
    baseline_losses: dict[Run, float]
    arm_mean: float
    arm_std: float | None
    baseline_mean: float
    baseline_std: float | None
    baseline_range: tuple[float, float]
    gap_pct: float
    paired_gap_pct: float | None
    paired_ci95_pct: tuple[float, float] | None
    paired_p_value: float | None
    welch_t: float | None
    welch_df: float | None
    p_value: float | None
    ci95_pct: tuple[float, float] | None
    verdict: str
    left_out: tuple[Run, ...] = ()

    def to_json(self) -> dict[str, Any]:
        record = asdict(self)
        for key in ("arm_losses", "baseline_losses"):
            record[key] = {run_label(run): loss for run, loss in getattr(self, key).items()}
        record["arm_seeds"], record["baseline_seeds"] = self.seeds(self.arm_losses), self.seeds(self.baseline_losses)
        record["left_out"] = [run_label(run) for run in self.left_out]
        return record

    @staticmethod
    def seeds(losses: dict[Run, float]) -> int:
        """How many distinct seeds ``losses`` (``arm_losses`` or ``baseline_losses``) holds runs of."""
        return len({_seed(run) for run in losses})


def _std(values: list[float]) -> float | None:
    return statistics.stdev(values) if len(values) > 1 else None


def compare(arm_curves: dict[Run, dict[int, float]], baseline_curves: dict[Run, dict[int, float]],
            complete_step: int) -> SeedComparison | None:
    """Compare an arm's runs with its baseline's at ``complete_step`` over the runs that finished, where at least
    :data:`MIN_SEEDS` distinct seeds of each side did (a run stopped early would otherwise hold every verdict back to
    its last evaluation); else at the last step all of them reached.

    Args:
        arm_curves: :data:`Run` (a seed, or (seed, run index) for a seed run several times) -> {step: validation
            loss} of the arm.
        baseline_curves: the same for its baseline.
        complete_step: the step a finished run ends at (``--steps``); a verdict before it is ``incomplete``.

    Runs without an evaluation yet are left out.

    Returns:
        None where either side has no evaluated seed or the two sides share no evaluated step.
    """
    arm_curves = {seed: c for seed, c in arm_curves.items() if c}
    baseline_curves = {seed: c for seed, c in baseline_curves.items() if c}
    if not arm_curves or not baseline_curves:
        return None
    finished = [{run: c for run, c in side.items() if complete_step in c} for side in (arm_curves, baseline_curves)]
    left_out: tuple[Run, ...] = ()
    if all(SeedComparison.seeds(side) >= MIN_SEEDS for side in finished):
        left_out = tuple(run for side in (arm_curves, baseline_curves) for run in side
                         if complete_step not in side[run])
        arm_curves, baseline_curves = finished
    curves = [*arm_curves.values(), *baseline_curves.values()]
    step = min(max(c) for c in curves)
    if not all(step in c for c in curves):
        return None
    arm = {run: c[step] for run, c in sorted(arm_curves.items(), key=lambda item: _order(item[0]))}
    base = {run: c[step] for run, c in sorted(baseline_curves.items(), key=lambda item: _order(item[0]))}
    a, b = list(arm.values()), list(base.values())
    arm_mean, base_mean = statistics.fmean(a), statistics.fmean(b)
    paired = list(paired_gaps(arm, base).values())
    paired_ci, paired_p = _one_sample_t(paired)
    t = df = p = ci = None
    if len(a) > 1 and len(b) > 1:
        va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
        se = math.sqrt(va + vb)
        if se > 0:
            t = (arm_mean - base_mean) / se
            df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
            p = 2.0 * (1.0 - student_t_cdf(abs(t), df))
            half = student_t_quantile(0.975, df) * se
            ci = (100.0 * (arm_mean - base_mean - half) / base_mean, 100.0 * (arm_mean - base_mean + half) / base_mean)
    lo, hi = min(b), max(b)
    verdict = "inside" if lo <= arm_mean <= hi else "below" if arm_mean < lo else "above"
    if min(SeedComparison.seeds(arm), SeedComparison.seeds(base)) < MIN_SEEDS or step < complete_step:
        verdict = f"incomplete: {verdict}"
    return SeedComparison(step, arm, base, arm_mean, _std(a), base_mean, _std(b), (lo, hi),
                          100.0 * (arm_mean - base_mean) / base_mean,
                          statistics.fmean(paired) if paired else None, paired_ci, paired_p, t, df, p, ci, verdict,
                          left_out)


def paired_gaps(arm_losses: Mapping[Run, float], baseline_losses: Mapping[Run, float]) -> dict[int, float]:
    """Each seed both sides ran -> its gap in percent: the mean of the arm's runs of that seed against the mean of the
    baseline's runs of it (the same initial weights and data order)."""
    arm, base = _seed_means(arm_losses), _seed_means(baseline_losses)
    return {seed: 100.0 * (loss - base[seed]) / base[seed] for seed, loss in arm.items() if seed in base}


@dataclass(frozen=True)
class PooledGap:
    """An arm's paired gap averaged over cells (a corpus and a model size each), every cell weighing the same (gaps
    in percent of the baseline's loss).

    Attributes:
        cells: cell -> its seeds' paired gaps (:func:`paired_gaps`).
        mean_pct: the mean over the cells of each cell's mean paired gap.
        se_pct: its standard error, ``sqrt(sum_c s_c**2 / k_c) / C`` from each cell's own sample variance ``s_c**2``
            of its ``k_c`` seeds' gaps (``C`` cells).
        df: Welch-Satterthwaite's degrees of freedom of that error.
        ci95_pct / p_value: Student's t 95% interval of ``mean_pct`` and the two-sided p of a zero mean (None where
            no cell's gaps spread).
        above_cells: the cells whose own mean paired gap is above zero.
    """

    cells: dict[str, dict[int, float]]
    mean_pct: float
    se_pct: float
    df: float | None
    ci95_pct: tuple[float, float] | None
    p_value: float | None
    above_cells: tuple[str, ...]


def pool_paired(cells: Mapping[str, Mapping[int, float]]) -> PooledGap:
    """Pool an arm's paired seed gaps over independent cells, each cell weighing the same (:class:`PooledGap`).

    A cell's seeds are paired against the baseline's runs of the same seeds, so its mean gap has the variance of
    its seeds' gaps over their number; the cells are separate runs on other data or model sizes, so these add. The
    mean estimates what the arm costs on average over the cells, much more tightly than one cell's three seeds do;
    a cost on one cell can hide behind gains on others, which ``above_cells`` and the cells' own verdicts show. With
    one cell it is that cell's paired t-test (:func:`compare`).

    Args:
        cells: cell name -> {seed: paired gap in percent}, at least 2 seeds each.

    Raises:
        ValueError: no cell, or a cell with fewer than 2 seeds (no variance to weigh it by); names the cell.
    """
    if not cells:
        raise ValueError("no cell to pool: give at least one cell's paired gaps")
    thin = {name: len(gaps) for name, gaps in cells.items() if len(gaps) < 2}
    if thin:
        raise ValueError(f"cells {thin} hold fewer than 2 seeds (seeds per cell shown); each cell needs at least 2")
    means = {name: statistics.fmean(gaps.values()) for name, gaps in cells.items()}
    variances = {name: statistics.variance(gaps.values()) / len(gaps) for name, gaps in cells.items()}
    count = len(cells)
    mean = statistics.fmean(means.values())
    total = sum(variances.values())
    se = math.sqrt(total) / count
    df = ci = p = None
    if total > 0:
        df = total**2 / sum(v**2 / (len(cells[name]) - 1) for name, v in variances.items())
        half = student_t_quantile(0.975, df) * se
        ci, p = (mean - half, mean + half), 2.0 * (1.0 - student_t_cdf(abs(mean / se), df))
    return PooledGap({name: dict(gaps) for name, gaps in cells.items()}, mean, se, df, ci, p,
                     tuple(name for name, m in means.items() if m > 0))


def _one_sample_t(values: list[float]) -> tuple[tuple[float, float] | None, float | None]:
    """The 95% confidence interval of the mean of ``values`` and the two-sided p of a zero mean, by Student's t with
    n - 1 degrees of freedom; (None, None) with fewer than 2 values or none spread."""
    if len(values) < 2 or (spread := statistics.stdev(values)) == 0:
        return None, None
    se = spread / math.sqrt(len(values))
    mean = statistics.fmean(values)
    half = student_t_quantile(0.975, len(values) - 1) * se
    return (mean - half, mean + half), 2.0 * (1.0 - student_t_cdf(abs(mean / se), len(values) - 1))


def paired_trend(arm_curves: dict[Run, dict[int, float]], baseline_curves: dict[Run, dict[int, float]],
                 from_step: int) -> dict[str, Any] | None:
    """How the paired gap moves from ``from_step`` on: per seed both sides ran, the least-squares slope of its gap
    (the mean of its arm runs against the mean of its baseline runs, in percent of the latter) over the steps from
    ``from_step`` that all those runs reached, in percent per 100 steps; then the mean slope over the seeds with its
    95% interval and p (:func:`compare`'s paired test). Of a seed's runs on one side only those that got furthest
    count (a run stopped early would cut the others' steps, and averaging runs in and out along the steps would add
    their offsets to the slope). A gap inside the baseline's range at the last step but rising says what the verdict
    cannot: where a longer run is heading.

    Returns:
        ``{"from_step", "to_step", "seeds", "slope_per_100_pct", "ci95", "p_value", "slopes"}`` (``slopes`` by
        seed), or None where no seed has three such steps.
    """
    slopes: dict[int, float] = {}
    last = from_step
    for seed in sorted({_seed(r) for r in arm_curves} & {_seed(r) for r in baseline_curves}):
        sides = [_furthest([c for run, c in side.items() if _seed(run) == seed and c])
                 for side in (arm_curves, baseline_curves)]
        shared = set.intersection(*(set(c) for side in sides for c in side))
        steps = sorted(step for step in shared if step >= from_step)
        if len(steps) < 3:
            continue
        arm, base = ([statistics.fmean(c[step] for c in side) for step in steps] for side in sides)
        gaps = [100.0 * (a - b) / b for a, b in zip(arm, base)]
        slopes[seed] = 100.0 * statistics.linear_regression(steps, gaps).slope
        last = max(last, steps[-1])
    if not slopes:
        return None
    ci, p = _one_sample_t(list(slopes.values()))
    return {"from_step": from_step, "to_step": last, "seeds": len(slopes),
            "slope_per_100_pct": statistics.fmean(slopes.values()), "ci95": ci, "p_value": p,
            "slopes": {str(seed): slope for seed, slope in slopes.items()}}


def _furthest(curves: list[dict[int, float]]) -> list[dict[int, float]]:
    """The curves among ``curves`` that reach the furthest step of any."""
    end = max(max(c) for c in curves)
    return [c for c in curves if max(c) == end]


def _seed_means(losses: Mapping[Run, float]) -> dict[int, float]:
    """Seed -> the mean loss of its runs in ``losses``."""
    by_seed: dict[int, list[float]] = {}
    for run, loss in losses.items():
        by_seed.setdefault(_seed(run), []).append(loss)
    return {seed: statistics.fmean(values) for seed, values in by_seed.items()}
