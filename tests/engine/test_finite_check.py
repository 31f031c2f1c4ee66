"""The non-finite weight monitor: flags NaN and Inf, never large finite weights, and names the units."""

from __future__ import annotations

import pytest
import torch

from composer_qsdp.engine import NonFiniteWeightError
from composer_qsdp.engine.finite_check import WeightFiniteMonitor


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_large_finite_weights_are_finite_and_nan_inf_are_not(dtype):
    monitor = WeightFiniteMonitor(["a", "b", "c"])
    big = torch.finfo(dtype).max / 2
    monitor.record(0, torch.full((1000,), big, dtype=dtype))  # their fp32 sum overflows; each is finite
    monitor.poll()
    for index, bad in ((1, float("nan")), (2, float("-inf"))):
        weights = torch.zeros(10, dtype=dtype)
        weights[3] = bad
        monitor.record(index, weights)
    with pytest.raises(NonFiniteWeightError, match=r"unit\(s\) \['b', 'c'\]"):
        monitor.poll()
