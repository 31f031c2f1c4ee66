"""0/1 Adam must train as well as AdamW, not only match our reading of the algorithm: a small GPT on a learnable
synthetic language (tests/optim/zero_one_training.py), 2 gloo ranks, 300 steps through all three phases (variance
updates until the freeze, then the frozen variance with local steps whose interval reaches 4 or 8), against AdamW on
the exact, clipped mean gradient (DDP), from the same initial weights and data (a paired comparison).

At peak lr 3e-3, DeepSpeed's schedule with local steps up to an interval of 8 ends 1.8-7.0% above AdamW (seeds 0-2):
it trains, but not losslessly (the first test). At peak lr 1e-2 DeepSpeed's schedule (the variance on doubling
intervals, frozen at the end of the warm-up) ended 4.6-5.2% above AdamW (seeds 0-2, under the GPT's previous order of
initial draws), as GPT-125M's run did (+5.2%); the variance updated at every step until 0.25 of the run with 8-bit
all-reduces and rescaled after the freeze (variance_rescale) ended -0.3%, +0.5% and -0.1% from AdamW. The tolerance,
1%, is the project's target. AdamW's own seeds 0-2 end up to 3.9% apart at lr 1e-2 (other initial weights and data
order), which is why the comparison is paired (the same seed for both): the paired gaps spread far less, 0.4% for
the rescaled run (standard deviation over the three seeds, mean +0.0%) and 0.3% for DeepSpeed's schedule (mean
+4.9%), so 1% separates the two by several standard deviations either way."""

from __future__ import annotations

import math

import pytest
from dist_spawn import run_ranks
from zero_one_training import _worker

from composer_qsdp.optim import ZeroOneSchedule

STEPS = 300
WARMUP = 30
SCHEDULE = {"var_freeze_step": WARMUP, "var_update_scaler": 16, "local_step_scaler": 30, "local_step_clipper": 8}
# DeepSpeed's schedule: the variance on doubling intervals until the warm-up ends, the interval doubling every 5%.
DEEPSPEED = {"var_freeze_step": WARMUP, "var_update_scaler": 16, "local_step_scaler": 15, "local_step_clipper": 8}
# The recipes' schedule with variance_rescale (the convergence driver's zero-one-adam-rescale arm): the variance
# updated at every step until 0.25 of the run, 8-bit; the frozen variance rescaled; the interval doubling every 0.15
# of the run up to 4.
DENSE8_RESCALE = {"var_freeze_step": STEPS // 4, "var_update_scaler": 100000, "variance_codec": "symmetric",
                  "variance_rescale": True, "local_step_scaler": 45, "local_step_clipper": 4}
TOLERANCE = 0.01


@pytest.mark.slow  # two 300-step trainings on 2 ranks: about 60 s on 2 cores
def test_zero_one_adam_trains_through_all_phases_with_the_planned_bytes():
    """Local steps up to an interval of 8 at peak lr 3e-3: every phase runs, the bytes follow the plan, and the model
    trains, but this schedule is not lossless. Paired with AdamW, the final validation loss ends +1.8%, +6.5% and
    +7.0% above it with seeds 0, 1 and 2 (6d8310f; seed 0 was -0.03% under the GPT's previous order of initial
    draws, a lucky draw): the bound here is 10%, which a broken update (diverging, or one that stops learning) misses.
    The recipes' schedule is held to the project's 1% by the next test."""
    arms = {"adamw": ("adamw", {}), "zero_one_adam": ("zero_one_adam", SCHEDULE)}
    results = run_ranks(_worker, 2, arms, STEPS, {"peak_lr": 3e-3, "warmup": WARMUP}, timeout_s=900)
    adamw, zoa = results[0]["adamw"], results[0]["zero_one_adam"]
    assert all(math.isfinite(x) for x in zoa["losses"])
    assert zoa["interval"] == 8  # local steps ran (the final weights are rank 0's, as a Composer checkpoint's)
    assert zoa["ratio"] >= 10  # bytes against DDP's fp32 all-reduce over the run
    # ... as the schedule's plan predicts (sign codec, buckets of 64 elements: 1.5 bits per element).
    plan = ZeroOneSchedule(**SCHEDULE).plan(STEPS)
    assert zoa["ratio"] == pytest.approx(plan.ratio_vs_fp32(1.5), rel=0.02)
    # The validation losses of the final weights (AdamW: 3.973 nats, 0/1 Adam 4.044; the bigram floor is 3.36).
    assert zoa["val"] <= adamw["val"] * 1.10, (zoa["val"], adamw["val"])
    # Not only at the end: the last 50 steps' train loss too.
    tail = slice(STEPS - 50, STEPS)
    assert sum(zoa["losses"][tail]) <= sum(adamw["losses"][tail]) * 1.10


@pytest.mark.slow  # three 300-step trainings on 2 ranks: about 45 s on 2 cores
def test_a_dense_8bit_variance_rescaled_after_the_freeze_reaches_adamw_at_a_high_learning_rate():
    arms = {"adamw": ("adamw", {}), "deepspeed": ("zero_one_adam", DEEPSPEED), "dense8": ("zero_one_adam", DENSE8_RESCALE)}
    results = run_ranks(_worker, 2, arms, STEPS, {"peak_lr": 1e-2, "warmup": WARMUP}, timeout_s=900)
    adamw, deepspeed, dense8 = (results[0][name] for name in arms)
    assert all(math.isfinite(x) for x in dense8["losses"])
    assert dense8["interval"] == 4
    # Bytes: 75 8-bit variance updates (8.5 bits per element at buckets of 64) and the statistics (0.5 bits) at
    # every variance update and synchronization, as the plan predicts; still at least 10x below DDP's fp32.
    schedule = {k: DENSE8_RESCALE[k] for k in SCHEDULE}
    plan = ZeroOneSchedule(**schedule).plan(STEPS)
    assert dense8["ratio"] == pytest.approx(plan.ratio_vs_fp32(1.5, 8.5, 0.5), rel=0.02) and dense8["ratio"] >= 10
    tail = slice(STEPS - 50, STEPS)
    assert dense8["val"] <= adamw["val"] * (1 + TOLERANCE), (dense8["val"], adamw["val"])
    assert sum(dense8["losses"][tail]) <= sum(adamw["losses"][tail]) * (1 + TOLERANCE)
    # The control: DeepSpeed's schedule misses the same bound here, so the test tells the two apart.
    assert deepspeed["val"] > adamw["val"] * (1 + TOLERANCE), (deepspeed["val"], adamw["val"])
