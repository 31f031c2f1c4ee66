"""The Walsh-Hadamard Triton kernel equals the torch reference on the same device bit for bit (interpreter on CPU,
compiled on CUDA) and the explicit float64 Sylvester matrix to fp32 tolerance."""

import pytest
import torch

from hopper import assert_no_spills_and_exact
from kernel_device import DEVICE

from composer_qsdp.kernels import backend, use_triton
from composer_qsdp.kernels import hadamard as kernels
from composer_qsdp.quant import hadamard_rows, hadamard_rows_, make_codec

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
pytestmark = pytest.mark.requires_triton_kernels


def _sylvester(order: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < order:
        h = torch.kron(torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64), h)
    return h / order**0.5


def _reference(x: torch.Tensor, bucket: int, out_cols: int, dtype: torch.dtype) -> torch.Tensor:
    with backend("torch"):
        return hadamard_rows(x, bucket, out_cols, dtype)


@pytest.mark.parametrize(
    "rows,n,bucket,in_dtype",
    [(3, 2 * 1024 + 5, 1024, torch.float32), (2, 100, 32, torch.bfloat16), (4, 7, 2, torch.float16),
     (1, 3, 1, torch.float32), (2, 4096, 4096, torch.float32), (1, 10000, 8192, torch.bfloat16)],
)  # fmt: skip
def test_kernel_matches_reference_and_the_sylvester_matrix(rows, n, bucket, in_dtype):
    gen = torch.Generator().manual_seed(n)
    x = (torch.randn(rows, n, generator=gen) * 3).to(DEVICE, in_dtype)
    padded = -(-n // bucket) * bucket
    rotated = kernels.hadamard_rows(x, bucket, padded, torch.float32)
    assert torch.equal(rotated, _reference(x, bucket, padded, torch.float32))
    if bucket <= 4096:  # the explicit matrix of the largest bucket would take 2 GiB
        sylvester = _sylvester(bucket).to(DEVICE)
        exact = torch.nn.functional.pad(x.double(), (0, padded - n)).view(rows, -1, bucket) @ sylvester
        torch.testing.assert_close(rotated.double(), exact.view(rows, padded), rtol=0, atol=2e-6 * x.abs().max().item())
    for dtype in DTYPES:  # the inverse: drop the padding, cast (bf16 rounds to nearest even, as on a GPU)
        back = kernels.hadamard_rows(rotated, bucket, n, dtype)
        assert torch.equal(back, _reference(rotated, bucket, n, dtype))


@pytest.mark.parametrize("buckets_per_program,num_warps", [(1, 4), (8, 2)])
def test_launch_configuration_does_not_change_results(buckets_per_program, num_warps):
    x = torch.randn(2, 1000).to(DEVICE)
    launch = {"buckets_per_program": buckets_per_program, "num_warps": num_warps}
    got = kernels.hadamard_rows(x, 64, 1024, torch.float32, **launch)
    assert torch.equal(got, _reference(x, 64, 1024, torch.float32))


@pytest.mark.parametrize("bucket,buckets_per_program", [(32, None), (1024, None), (64, 8)])
def test_kernel_rotates_in_place_bit_for_bit(bucket, buckets_per_program):
    """Written over its input, every program's buckets are loaded whole before they are stored."""
    x = (torch.randn(3, 8 * 1024, generator=torch.Generator().manual_seed(bucket)) * 3).to(DEVICE)
    expected = _reference(x, bucket, x.shape[1], torch.float32)
    assert kernels.hadamard_rows(x, bucket, x.shape[1], torch.float32, buckets_per_program, out=x) is x
    assert torch.equal(x, expected)
    with backend("triton"):
        assert torch.equal(hadamard_rows_(x, bucket), _reference(expected, bucket, x.shape[1], torch.float32))


def test_codec_dispatch_to_triton_matches_torch():
    codec = make_codec("symmetric", bits=4, bucket_size=64, hadamard=True)
    x = torch.randn(3, 300).to(DEVICE)
    with backend("torch"):
        wire = codec.encode_rows(x)
        decoded, total = codec.decode_rows(wire, 300, torch.bfloat16), codec.decode_sum(wire, 300)
    with backend("triton"):
        assert use_triton(x)
        assert torch.equal(codec.encode_rows(x), wire)
        assert torch.equal(codec.decode_rows(wire, 300, torch.bfloat16), decoded)
        assert torch.equal(codec.decode_sum(wire, 300), total)


def test_unsupported_bucket_sizes():
    assert not kernels.supports(100) and not kernels.supports(2 * kernels.MAX_BUCKET) and kernels.supports(1)
    with pytest.raises(ValueError, match="bucket_size=16384"):
        kernels.hadamard_rows(torch.randn(1, 10).to(DEVICE), 16384, 10, torch.float32)
    with pytest.raises(ValueError, match="buckets_per_program=3"):
        kernels.hadamard_rows(torch.randn(1, 10).to(DEVICE), 8, 10, torch.float32, buckets_per_program=3)
    x = torch.randn(1, 20000).to(DEVICE)  # larger than the kernel's buckets: the torch reference runs instead
    with backend("triton"):
        assert torch.equal(hadamard_rows(x, 16384, 20000, torch.float32), _reference(x, 16384, 20000, torch.float32))


# The min-max kernels warn under the interpreter, whose numpy evaluates IEEE special cases that a GPU computes
# silently (as in test_minmax_kernels.py).
@pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")
@pytest.mark.parametrize("name", ["minmax", "symmetric"])
def test_rotated_launches_make_no_tensor_on_the_default_device(name):
    """Every launch that rotates reads the rotation's fp32 scale: a tensor made for it on the default device, which a
    caller may have made CUDA, would be copied there and read back, two host syncs per launch. On the meta device
    any such tensor fails, so the codec's rotated encode, decode and sum must run there as anywhere."""
    codec = make_codec(name, bits=4, bucket_size=64, hadamard=True)
    x = torch.randn(3, 300, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    with backend("triton"):
        wire = codec.encode_rows(x, seed=5)
        expected = codec.decode_rows(wire, 300, torch.bfloat16), codec.decode_sum(wire, 300)
    kernels.rotation_scale.cache_clear()  # computed again below, under the meta device
    with torch.device("meta"), backend("triton"):
        got = codec.encode_rows(x, seed=5), codec.decode_rows(wire, 300, torch.bfloat16), codec.decode_sum(wire, 300)
    assert all(torch.equal(a, b) for a, b in zip(got, (wire, *expected)))


def test_kernel_compiles_for_hopper_without_spills():
    variants = []
    for bucket, in_type, out_type in [(32, "*fp32", "*fp32"), (128, "*bf16", "*fp32"), (1024, "*fp32", "*bf16"),
                                      (8192, "*fp16", "*fp32")]:  # fmt: skip
        g, warps = kernels._launch_shape(torch.device("cuda"), bucket, 1 << 20, None, None)
        variants.append({"name": f"hadamard {bucket} {in_type} -> {out_type}", "module": kernels.__name__,
                         "kernel": "_hadamard_kernel", "num_warps": warps,
                         "types": {"x_ptr": in_type, "y_ptr": out_type, "scale": "fp32"},
                         "constants": {"B": bucket, "LOG_B": bucket.bit_length() - 1, "G": g,
                                       "EMULATE_BF16_RNE": False}})  # fmt: skip
    assert_no_spills_and_exact(variants)


# ------------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("bucket", [2, 32, 128, 1024, 8192])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_kernel_matches_reference(bucket, dtype):
    x = (torch.randn(3, (1 << 20) + 77) * 5).to(dtype)
    padded = -(-x.shape[1] // bucket) * bucket
    rotated = hadamard_rows(x.cuda(), bucket, padded, torch.float32)
    expected = _reference(x, bucket, padded, torch.float32)
    torch.testing.assert_close(rotated.cpu(), expected, rtol=0, atol=1e-6 * expected.abs().max().item())
    back = hadamard_rows(rotated, bucket, x.shape[1], dtype)
    torch.testing.assert_close(back.cpu(), _reference(rotated.cpu(), bucket, x.shape[1], dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("bucket", [32, 128, 8192])
def test_cuda_kernel_rotates_in_place(bucket):
    x = torch.randn(4, 1 << 20) * 5
    expected = _reference(x, bucket, x.shape[1], torch.float32)
    cuda = x.cuda()
    assert hadamard_rows_(cuda, bucket) is cuda
    torch.testing.assert_close(cuda.cpu(), expected, rtol=0, atol=1e-6 * expected.abs().max().item())
    torch.testing.assert_close(cuda, hadamard_rows(x.cuda(), bucket, x.shape[1], torch.float32), rtol=0, atol=0)


@pytest.mark.gpu
def test_cuda_hadamard_codec_round_trip_matches_cpu():
    codec = make_codec("symmetric", bits=4, bucket_size=128, hadamard=True)
    x = torch.randn(4, 500_000)
    wire = codec.encode_rows(x.cuda())
    assert torch.equal(wire.cpu()[:, : codec.inner.wire_format(500_096).meta_offset],
                       codec.encode_rows(x)[:, : codec.inner.wire_format(500_096).meta_offset])  # fmt: skip
    torch.testing.assert_close(codec.decode_sum(wire, 500_000).cpu(), codec.decode_sum(wire.cpu(), 500_000))
