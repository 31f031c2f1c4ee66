"""Sign-codec Triton kernels against the torch reference of SignCodec (interpreter on CPU, compiled on CUDA): the
same codes and padding, scales up to the order of the sum of squares, and decodes bit for bit."""

import pytest
import torch

from kernel_device import DEVICE

from composer_qsdp.kernels import backend
from composer_qsdp.kernels import sign as kernels
from composer_qsdp.quant.sign import SignCodec

# The interpreter evaluates IEEE special cases of non-finite buckets through numpy, which warns.
pytestmark = [pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning"), pytest.mark.requires_triton_kernels]

CASES = [  # rows, n, bucket, dtype
    (2, 4096, 256, torch.float32),
    (3, 1001, 64, torch.float32),  # a partial last bucket, and a partial last byte
    (4, 777, 24, torch.bfloat16),  # a bucket that is not a power of two
    (1, 5, 2048, torch.float16),  # one partial bucket
    (2, 300, 8, torch.float32),  # one byte per bucket
]


def _data(rows: int, n: int, dtype: torch.dtype, device: str, nonfinite: bool) -> torch.Tensor:
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(rows, n, generator=gen) * 10 ** (4 * torch.rand(rows, n, generator=gen) - 2)
    x[:, : min(n, 5)] = 0.0  # zeros map to +1
    if nonfinite:
        x[0, n // 2] = float("nan")
        x[-1, -1] = float("inf")
    return x.to(dtype).to(device)


def _check(rows: int, n: int, bucket: int, dtype: torch.dtype, device: str, nonfinite: bool) -> None:
    codec = SignCodec(bucket_size=bucket)
    fmt = codec.wire_format(n)
    x = _data(rows, n, dtype, device, nonfinite)
    with backend("torch"):
        expected = codec.encode_rows(x)
        reference = codec.decode_rows(expected, n)
        total = codec.decode_sum(expected, n)
    with backend("triton"):  # the codec dispatches to the kernels
        assert torch.equal(codec.decode_rows(expected, n).nan_to_num(), reference.nan_to_num())
        # Rounded to the input dtype inside the kernel: the same values as the reference's fp32 cast.
        assert torch.equal(codec.decode_rows(expected, n, dtype).nan_to_num(), reference.to(dtype).nan_to_num())
    wire = kernels.encode_rows(x, bucket, fmt.wire_bytes, fmt.code_bytes, fmt.meta_offset)
    assert torch.equal(wire[:, : fmt.meta_offset], expected[:, : fmt.meta_offset])  # codes and padding
    scales = [w[:, fmt.meta_offset :].contiguous().view(torch.float32) for w in (wire, expected)]
    torch.testing.assert_close(scales[0], scales[1], rtol=4e-7, atol=0, equal_nan=True)
    decoded = kernels.decode_rows(expected, bucket, n, fmt.meta_offset)
    assert torch.equal(decoded.isnan(), reference.isnan())
    assert torch.equal(decoded.nan_to_num(), reference.nan_to_num())
    summed = kernels.decode_sum(expected, bucket, n, fmt.meta_offset)
    assert torch.equal(summed.isnan(), total.isnan()) and torch.equal(summed.nan_to_num(), total.nan_to_num())


@pytest.mark.parametrize("nonfinite", [False, True])
@pytest.mark.parametrize("rows,n,bucket,dtype", CASES)
def test_kernels_match_reference(rows, n, bucket, dtype, nonfinite):
    _check(rows, n, bucket, dtype, DEVICE, nonfinite)


@pytest.mark.gpu
@pytest.mark.parametrize("rows,n,bucket,dtype", CASES + [(2, 3_000_001, 256, torch.float32)])
def test_kernels_match_reference_on_cuda(rows, n, bucket, dtype):
    _check(rows, n, bucket, dtype, "cuda", nonfinite=True)


def test_coverage():
    assert kernels.supports(8) and kernels.supports(256) and kernels.supports(8192)
    assert not kernels.supports(4) and not kernels.supports(100) and not kernels.supports(16384)
