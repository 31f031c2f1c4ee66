"""The step profile's summary against hand-computed interval arithmetic, and its kernel categories."""

import pytest

from composer_qsdp.recipes.step_profile import StepProfile, categorize, summarize_kernels


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
