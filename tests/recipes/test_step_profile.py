"""The step profile's summary against hand-computed interval arithmetic, and its kernel categories."""

import pytest

from composer_qsdp.recipes.step_profile import StepProfile, attribute_idle, categorize, host_syncs, summarize_kernels


def test_exposed_communication_is_nccl_time_with_no_other_kernel_running():
    kernels = [("ncclDevKernel_AllGather_RING_LL", 0.0, 10.0), ("sm90_xmma_gemm_bf16", 5.0, 15.0),
               ("_quantize_feedback_kernel", 20.0, 22.0), ("ncclDevKernel_ReduceScatter", 21.0, 30.0),
               ("ampere_bf16_s16816gemm", 14.0, 16.0)]
    summary = summarize_kernels(kernels)
    # NCCL runs over [0, 10] and [21, 30] (19); other kernels over [5, 16] and [20, 22]; they overlap on [5, 10]
    # and [21, 22] (6), so 13 of NCCL's 19 are exposed.
    assert summary["communication_busy"] == pytest.approx(19.0)
    assert summary["compute_busy"] == pytest.approx(13.0)
    assert summary["overlapped_communication"] == pytest.approx(6.0)
    assert summary["exposed_communication"] == pytest.approx(13.0)
    assert summary["by_category"] == pytest.approx({"communication": 19.0, "matmul": 12.0, "encode": 2.0})
    assert summary["kernels"] == {"communication": 2, "matmul": 2, "encode": 1}
    assert summary["top"][0] == ["ncclDevKernel_AllGather_RING_LL", "communication", 10.0]


@pytest.mark.parametrize("name,category", [
    ("_decode_kernel", "decode"), ("_hadamard_kernel", "hadamard"), ("_encode_kernel", "encode"),
    ("flash_fwd_kernel", "attention"), ("Memcpy DtoD (Device -> Device)", "copy"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "other"),
])
def test_kernel_names_fall_into_their_category(name, category):
    assert categorize(name) == category


def test_bad_windows_are_refused_naming_the_value():
    with pytest.raises(ValueError, match="start=1 is invalid"):
        StepProfile("out", start=1)
    with pytest.raises(ValueError, match="batches=0 is invalid"):
        StepProfile("out", start=3, batches=0)


def test_idle_gaps_go_to_the_shortest_host_range_covering_them():
    kernels = [(0.0, 10.0), (15.0, 16.0), (50.0, 60.0)]
    ranges = [("Optimizer.step#AdamW.step", 0.0, 100.0), ("FSDP::pre_forward", 30.0, 45.0),
              ("composer::batch_end", 70.0, 100.0)]
    idle = attribute_idle(kernels, ranges, -25.0, 100.0)
    # gaps: [-25, 0] (no range), [10, 15] (short), [16, 50] split at 30 and 45, [60, 100] split at 70
    assert idle["gpu_idle"] == pytest.approx(25 + 5 + 34 + 40)
    assert idle["idle_by_range"] == pytest.approx({"(no range)": 25.0, "(gaps < 20 us)": 5.0,
                                                   "Optimizer.step#AdamW.step": 14 + 5 + 10.0,
                                                   "FSDP::pre_forward": 15.0, "composer::batch_end": 30.0})
    assert next(iter(idle["idle_by_range"])) == "composer::batch_end"  # largest first


def test_a_fully_busy_window_has_no_idle_time():
    idle = attribute_idle([(0.0, 60.0), (40.0, 100.0)], [("FSDP::pre_forward", 0.0, 100.0)], 0.0, 100.0)
    assert idle == {"gpu_idle": 0.0, "idle_by_range": {}}


def test_host_syncs_count_blocking_runtime_calls_only():
    calls = [("cudaStreamSynchronize", 0.0, 4.0), ("cudaMemcpyAsync", 5.0, 6.0), ("cudaMemcpy", 7.0, 10.0),
             ("cudaStreamSynchronize", 11.0, 12.0), ("cudaLaunchKernel", 13.0, 14.0)]
    assert host_syncs(calls) == {"cudaStreamSynchronize": [2, 5.0], "cudaMemcpy": [1, 3.0]}


def test_closing_the_profiler_frees_its_events_at_once():
    """The profiler's events form reference cycles: after close_profiler nothing of them is left for a later
    (automatic) full collection."""
    import gc

    import torch
    from torch.profiler import ProfilerActivity, profile

    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(8)])
    enabled = gc.isenabled()
    gc.disable()
    try:
        gc.collect()
        leftover = {}
        for close in (False, True):
            callback = StepProfile("unused")
            callback._profiler = profile(activities=[ProfilerActivity.CPU])
            with callback._profiler:
                for _ in range(5):
                    model(torch.randn(4, 16)).sum().backward()
            assert len(callback._profiler.events()) > 1000
            if close:
                callback.close_profiler()
            else:
                callback._profiler = None
            leftover[close] = gc.collect()
    finally:
        if enabled:
            gc.enable()
    assert leftover[False] > 10_000 and leftover[True] < 100
