"""Symmetric abs-max Triton kernels equal the torch reference bit for bit (interpreter on CPU, compiled on CUDA)."""

import pytest
import torch

from bitwise import assert_same_values, assert_same_wire
from hopper import assert_no_spills_and_exact
from kernel_device import DEVICE

from composer_qsdp.kernels import backend, use_triton
from composer_qsdp.kernels import symmetric as kernels
from composer_qsdp.kernels.groups import vec
from composer_qsdp.quant import HadamardCodec, SymmetricCodec, hadamard_rows

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# The interpreter evaluates IEEE special cases of non-finite buckets through numpy, which warns.
pytestmark = [pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning"),
              pytest.mark.requires_triton_kernels]


def _data(rows: int, n: int, dtype: torch.dtype, seed: int, nonfinite: bool) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    # Magnitudes spread over 1e-3..1e3 so buckets differ in scale; exact zeros give zero buckets and ties.
    x = torch.randn(rows, n, generator=gen) * 10 ** (6 * torch.rand(rows, n, generator=gen) - 3)
    x[:, : min(n, 7)] = 0.0
    x = x.to(DEVICE, dtype)
    if nonfinite:
        x[0, n // 3] = float("nan")
        x[-1, -1] = float("inf")
    return x


def _check_kernels(codec: SymmetricCodec, x: torch.Tensor, **launch) -> None:
    rows, n = x.shape
    fmt = codec.wire_format(n)
    expected = codec._encode_rows_reference(x, fmt)
    wire = kernels.encode_rows(x, codec.bits, codec.bucket_size, fmt, **launch)
    assert_same_wire(codec, wire, expected, n)
    reference = codec._decode_rows_fp32(expected, fmt)
    for dtype in DTYPES:
        got = kernels.decode_rows(expected, codec.bits, codec.bucket_size, fmt, dtype, **launch)
        assert_same_values(got, reference.to(dtype))
    # Into the rows of a wider buffer (row stride n + 8): its other columns untouched.
    buffer = torch.full((rows, n + 8), 3.0, device=x.device, dtype=x.dtype)
    kernels.decode_rows(expected, codec.bits, codec.bucket_size, fmt, x.dtype, out=buffer[:, :n], **launch)
    assert_same_values(buffer[:, :n], reference.to(x.dtype))
    assert bool((buffer[:, n:] == 3).all())
    total = torch.zeros(n, device=x.device)
    for row in reference:
        total += row
    assert_same_values(kernels.decode_sum(expected, codec.bits, codec.bucket_size, fmt, **launch), total)


def _check_difference_kernels(codec: SymmetricCodec, x: torch.Tensor, ref: torch.Tensor) -> None:
    """The fused difference encode equals the reference encode of the materialized fp32 difference, and the
    fused decode-and-add equals ``(ref + decoded)`` added in fp32 and rounded once."""
    rows, n = x.shape
    fmt = codec.wire_format(n)
    diff = x.to(torch.float32) - ref.to(torch.float32)
    expected = codec._encode_rows_reference(diff, fmt)
    assert_same_wire(codec, kernels.encode_rows(x, codec.bits, codec.bucket_size, fmt, ref=ref), expected, n)
    out = ref.clone()
    kernels.decode_add_rows(expected, codec.bits, codec.bucket_size, fmt, out)
    assert_same_values(out, (ref.to(torch.float32) + codec._decode_rows_fp32(expected, fmt)).to(ref.dtype))


CASES = [  # rows, n, bucket_size, bits, dtype
    (1, 4096, 1024, 8, torch.float32),
    (4, 1000, 64, 4, torch.bfloat16),  # tail bucket
    (3, 1001, 104, 4, torch.float16),  # non-power-of-two bucket, odd tail (a partial last word)
    (2, 777, 24, 2, torch.bfloat16),  # odd number of groups per bucket
    (3, 99, 8, 8, torch.float16),  # one group per bucket
    (1, 5, 2048, 4, torch.float32),  # one partial bucket
    (5, 64, 8, 2, torch.float32),
    (2, 1000, 256, 3, torch.bfloat16),  # byte-wise words; tail word short of the metadata
    (3, 203, 40, 5, torch.float32),  # 40-bit words, partial tail group
    (2, 300, 32, 7, torch.float16),
]


@pytest.mark.parametrize("nonfinite", [False, True])
@pytest.mark.parametrize("rows,n,bucket,bits,dtype", CASES)
def test_kernels_match_reference(rows, n, bucket, bits, dtype, nonfinite):
    codec = SymmetricCodec(bits=bits, bucket_size=bucket)
    _check_kernels(codec, _data(rows, n, dtype, seed=n + bits, nonfinite=nonfinite))


@pytest.mark.parametrize("nonfinite", [False, True])
@pytest.mark.parametrize("rows,n,bucket,bits,dtype", CASES)
def test_difference_kernels_match_reference(rows, n, bucket, bits, dtype, nonfinite):
    x = _data(rows, n, dtype, seed=n + bits, nonfinite=nonfinite)
    ref = x + (_data(rows, n, torch.float32, seed=n, nonfinite=False) * 1e-2).to(dtype)  # a nearby reference
    _check_difference_kernels(SymmetricCodec(bits=bits, bucket_size=bucket), x, ref)


def test_difference_methods_dispatch_to_triton_and_match_torch():
    codec = SymmetricCodec(bits=4, bucket_size=256)
    x = _data(3, 700, torch.bfloat16, seed=5, nonfinite=False)
    ref = (x.to(torch.float32) * 0.99).to(torch.bfloat16)
    with backend("torch"):
        wire = codec.encode_difference_rows(x, ref, seed=3)
        assert torch.equal(wire, codec.encode_rows(x.to(torch.float32) - ref.to(torch.float32)))
        updated = codec.decode_add_rows(wire, ref.clone())
    with backend("triton"):
        assert torch.equal(codec.encode_difference_rows(x, ref, seed=3), wire)
        assert torch.equal(codec.decode_add_rows(wire, ref.clone()), updated)
    with pytest.raises(ValueError, match=r"ref has shape \(3, 699\) but x has \(3, 700\)"):
        codec.encode_difference_rows(x, ref[:, :699])
    with pytest.raises(ValueError, match="out must be a contiguous 2-D floating tensor"):
        codec.decode_add_rows(wire, ref.t().contiguous().t())
    with pytest.raises(ValueError, match="wire has 3 rows but out has 2"):
        codec.decode_add_rows(wire, ref[:2].clone())


def _check_rotated_kernels(codec: SymmetricCodec, x: torch.Tensor, **launch) -> None:
    """The fused Hadamard kernels equal the rotation kernel's reference composed with the codec's reference."""
    rows, n = x.shape
    bucket = codec.bucket_size
    padded = -(-n // bucket) * bucket
    fmt = codec.wire_format(padded)
    with backend("torch"):
        expected = codec._encode_rows_reference(hadamard_rows(x, bucket, padded, torch.float32), fmt)
    assert_same_wire(codec, kernels.encode_rows(x, codec.bits, bucket, fmt, True, **launch), expected, padded)
    decoded = codec._decode_rows_fp32(expected, fmt)
    total = torch.zeros(padded, device=x.device)
    for row in decoded:
        total += row
    with backend("torch"):
        rotated_sum = hadamard_rows(total.view(1, -1), bucket, n, torch.float32)[0]
        rotated = {dtype: hadamard_rows(decoded, bucket, n, dtype) for dtype in DTYPES}
    for dtype in DTYPES:
        got = kernels.decode_rows(expected, codec.bits, bucket, fmt, dtype, True, n, **launch)
        assert_same_values(got, rotated[dtype])
    assert_same_values(kernels.decode_sum(expected, codec.bits, bucket, fmt, True, n, **launch), rotated_sum)


@pytest.mark.parametrize("nonfinite", [False, True])
@pytest.mark.parametrize("rows,n,bucket,bits,dtype", [
    (3, 1000, 128, 4, torch.bfloat16), (2, 2048, 1024, 8, torch.float32), (2, 70, 64, 2, torch.float16),
    (2, 700, 256, 3, torch.bfloat16),
    (1, 20, 8, 4, torch.float32),
])  # fmt: skip
def test_fused_rotation_matches_rotation_then_reference(rows, n, bucket, bits, dtype, nonfinite):
    codec = SymmetricCodec(bits=bits, bucket_size=bucket)
    _check_rotated_kernels(codec, _data(rows, n, dtype, seed=n + bucket, nonfinite=nonfinite))


@pytest.mark.parametrize("buckets_per_program,num_warps", [(1, 4), (4, 2), (64, 8)])
def test_launch_configuration_does_not_change_results(buckets_per_program, num_warps):
    codec = SymmetricCodec(bits=4, bucket_size=128)
    x = _data(2, 1000, torch.bfloat16, seed=3, nonfinite=False)
    _check_kernels(codec, x, buckets_per_program=buckets_per_program, num_warps=num_warps)
    _check_rotated_kernels(codec, x, buckets_per_program=buckets_per_program, num_warps=num_warps)


def test_tiny_and_huge_scales():
    codec = SymmetricCodec(bits=8, bucket_size=32)
    x = torch.cat([1e-38 * torch.arange(32.0), torch.full((32,), -3e38), torch.randn(32) * 1e-44, torch.randn(32)])
    _check_kernels(codec, x.view(1, -1).to(DEVICE))


def test_ties_round_half_to_even():
    codec = SymmetricCodec(bits=4, bucket_size=8)  # absmax 7 = qmax: the scaled values are the inputs
    x = torch.tensor([[7.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5]], device=DEVICE)
    _check_kernels(codec, x)
    with backend("triton"):
        decoded = codec.decode(codec.encode(x[0]), 8)
    assert decoded.tolist() == [7.0, 0.0, 2.0, 2.0, 0.0, -2.0, -2.0, 4.0]


def test_codec_dispatch_to_triton_matches_torch():
    codec = SymmetricCodec(bits=4, bucket_size=256)
    x = _data(3, 700, torch.float32, seed=4, nonfinite=False)
    with backend("torch"):
        assert not use_triton(x)
        wire_1d, wire = codec.encode(x[1]), codec.encode_rows(x)
        decoded, total = codec.decode(wire_1d, 700, torch.bfloat16), codec.decode_sum(wire, 700)
        rows = codec.decode_rows(wire, 700, torch.float16)
    with backend("triton"):
        assert use_triton(x)
        assert torch.equal(codec.encode(x[1]), wire_1d)
        assert torch.equal(codec.encode_rows(x), wire)
        assert torch.equal(codec.decode(wire_1d, 700, torch.bfloat16), decoded)
        assert torch.equal(codec.decode_rows(wire, 700, torch.float16), rows)
        assert torch.equal(codec.decode_sum(wire, 700), total)
        # A byte-shifted (misaligned) wire is copied before the kernel reads its fp32 scales.
        shifted = torch.cat([torch.zeros(1, dtype=torch.uint8, device=DEVICE), wire_1d])[1:]
        assert torch.equal(codec.decode(shifted, 700, torch.bfloat16), decoded)


def test_fused_rotation_methods_equal_the_two_pass_hadamard_codec():
    """SymmetricCodec's FusedRotation methods (one kernel pass) equal HadamardCodec's rotation-then-codec passes."""
    codec = SymmetricCodec(bits=4, bucket_size=64)
    x = _data(3, 300, torch.bfloat16, seed=7, nonfinite=True)
    two_pass = HadamardCodec(codec)
    with backend("torch"):
        wire = two_pass.encode_rows(x)
        decoded, total = two_pass.decode_rows(wire, 300, torch.float16), two_pass.decode_sum(wire, 300)
    with backend("triton"):
        # Bytewise up to the NaN payload of a non-finite bucket's scale, which a GPU writes canonical.
        assert_same_wire(codec, codec.encode_rows_rotated(x), wire, two_pass.padded(300))
        assert_same_values(codec.decode_rows_rotated(wire, 300, torch.float16), decoded)
        assert_same_values(codec.decode_sum_rotated(wire, 300), total)
        assert SymmetricCodec(bits=3, bucket_size=48).encode_rows_rotated(x) is None  # not a power of two


@pytest.mark.parametrize("divisor,dtype", [(2, torch.float32), (3, torch.bfloat16)])
@pytest.mark.parametrize("rotate", [False, True])
def test_decode_sum_averages_into_the_callers_buffer(rotate, divisor, dtype):
    """A reduce-scatter's decode-sum into its output (``out=``, ``divisor=``), rotated back or not: one kernel pass
    divides (after the rotation) and rounds once into ``out``, bit for bit the torch reference's sum, IEEE division
    and copy."""
    inner = SymmetricCodec(bits=4, bucket_size=64)
    codec = HadamardCodec(inner) if rotate else inner
    x = _data(3, 300, torch.bfloat16, seed=divisor, nonfinite=True)
    with backend("torch"):
        wire = codec.encode_rows(x)
        expected = codec.decode_sum(wire, 300, out=torch.empty(300, dtype=dtype, device=x.device), divisor=divisor)
    with backend("triton"):
        out = torch.full((300,), 7.0, dtype=dtype, device=x.device)
        assert codec.decode_sum(wire, 300, out=out, divisor=divisor) is out
        assert_same_values(out, expected)


def test_unsupported_configurations_fall_back_to_the_reference():
    x = _data(1, 300, torch.float32, seed=6, nonfinite=False)
    for codec in (SymmetricCodec(bits=3, bucket_size=60), SymmetricCodec(bits=8, bucket_size=20000),
                  SymmetricCodec(bits=4, bucket_size=100)):  # fmt: skip
        with backend("torch"):
            expected = codec.encode(x[0])
        with backend("triton"):
            assert torch.equal(codec.encode(x[0]), expected)
    with pytest.raises(ValueError, match=r"bucket_size=60.*allowed: bits in \(2, 3, 4, 5, 6, 7, 8\)"):
        kernels.encode_rows(x, 3, 60, SymmetricCodec(3, 60).wire_format(300))
    with pytest.raises(ValueError, match="bucket_size=20000"):
        wire = torch.zeros(1, 8, dtype=torch.uint8, device=DEVICE)
        kernels.decode_sum(wire, 8, 20000, SymmetricCodec(8, 20000).wire_format(3))
    with pytest.raises(ValueError, match="buckets_per_program=3"):
        kernels.encode_rows(x, 8, 64, SymmetricCodec(8, 64).wire_format(300), buckets_per_program=3)
    with pytest.raises(ValueError, match="bucket_size=24, rotate=True"):
        kernels.encode_rows(x, 8, 24, SymmetricCodec(8, 24).wire_format(312), rotate=True)


def test_kernels_compile_for_hopper_without_spills():
    variants = []
    for bits, dtype, bucket, rotate in [(8, "bf16", 2048, False), (4, "fp32", 8192, False), (2, "fp16", 104, False),
                                        (4, "bf16", 16, False), (4, "bf16", 2048, True), (8, "fp32", 128, True),
                                        (3, "bf16", 2048, False), (3, "bf16", 256, True)]:
        fmt = SymmetricCodec(bits, bucket).wire_format(1 << 24)
        groups, bpp, warps = kernels._config(bits, bucket, 1, fmt, rotate, True, None, None)
        streamed = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
        constants = {"BUCKET": bucket, "GROUPS": groups, "BPP": bpp, "BITS": bits, "QMAX": (1 << (bits - 1)) - 1,
                     "ROTATE": rotate, "LOG_B": bucket.bit_length() - 1}  # fmt: skip
        common = {"module": kernels.__name__, "num_warps": warps}
        name = f"{bits}b {dtype} bucket {bucket} rotate={rotate}"
        fused = not rotate  # the weight-difference variants (subtract in the encode, add in the decode)
        variants += [
            {"name": f"encode {name}", "kernel": "_encode_kernel",
             "types": {"x_ptr": "*" + dtype, "ref_ptr": "*" + dtype, "wire_ptr": "*u8", "scale_rot": "fp32"}, **common,
             "constants": {**constants, "VEC": vec(streamed), "PARTIAL_GROUPS": True, "DIFFERENCE": False}},
            {"name": f"decode {name}", "kernel": "_decode_kernel",
             "types": {"wire_ptr": "*u8", "out_ptr": "*" + dtype, "scale_rot": "fp32"}, **common,
             "constants": {**constants, "VEC": vec(streamed), "SUM": False, "ROWS": 1, "EMULATE_BF16_RNE": False,
                           "ADD": False}},
            {"name": f"decode_sum {name}", "kernel": "_decode_kernel",
             "types": {"wire_ptr": "*u8", "out_ptr": "*fp32", "scale_rot": "fp32"}, **common,
             "constants": {**constants, "VEC": vec(torch.float32), "SUM": True, "ROWS": 8, "EMULATE_BF16_RNE": False,
                           "ADD": False}},
        ] + ([
            {"name": f"difference encode {name}", "kernel": "_encode_kernel", "types": {"x_ptr": "*" + dtype,
             "ref_ptr": "*" + dtype, "wire_ptr": "*u8", "scale_rot": "fp32"}, **common,
             "constants": {**constants, "VEC": vec(streamed), "PARTIAL_GROUPS": True, "DIFFERENCE": True}},
            {"name": f"decode_add {name}", "kernel": "_decode_kernel",
             "types": {"wire_ptr": "*u8", "out_ptr": "*" + dtype, "scale_rot": "fp32"}, **common,
             "constants": {**constants, "VEC": vec(streamed), "SUM": False, "ROWS": 1, "EMULATE_BF16_RNE": False,
                           "ADD": True}},
        ] if fused else [])  # fmt: skip
    assert_no_spills_and_exact(variants)


# ------------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_kernels_match_reference(bits, dtype):
    codec = SymmetricCodec(bits=bits, bucket_size=2048)
    x = _data(4, (1 << 20) + 333, dtype, seed=bits, nonfinite=True).cuda()
    assert use_triton(x)
    _check_kernels(codec, x)
    # The GPU kernels write the same wire as the CPU reference.
    assert_same_wire(codec, codec.encode_rows(x).cpu(), codec.encode_rows(x.cpu()), x.shape[1])


@pytest.mark.gpu
@pytest.mark.parametrize("bucket", [64, 104, 4096, 8192])
def test_cuda_bucket_sizes(bucket):
    codec = SymmetricCodec(bits=4, bucket_size=bucket)
    _check_kernels(codec, _data(2, 300_001, torch.bfloat16, seed=bucket, nonfinite=False).cuda())


@pytest.mark.gpu
@pytest.mark.parametrize("bucket,dtype", [(128, torch.bfloat16), (2048, torch.bfloat16), (8192, torch.float32)])
def test_cuda_fused_rotation(bucket, dtype):
    codec = SymmetricCodec(bits=4, bucket_size=bucket)
    _check_rotated_kernels(codec, _data(3, 300_001, dtype, seed=bucket, nonfinite=True).cuda())


@pytest.mark.gpu
@pytest.mark.parametrize("bits,dtype", [(4, torch.bfloat16), (8, torch.float32), (2, torch.float16)])
def test_cuda_difference_kernels(bits, dtype):
    x = _data(2, 300_001, dtype, seed=bits, nonfinite=True).cuda()
    ref = x + (_data(2, 300_001, torch.float32, seed=7, nonfinite=False) * 1e-2).to(dtype).cuda()
    _check_difference_kernels(SymmetricCodec(bits=bits, bucket_size=2048), x, ref)


@pytest.mark.gpu
def test_cuda_decode_sum_many_rows():
    codec = SymmetricCodec(bits=8, bucket_size=512)
    x = _data(16, 1 << 18, torch.float32, seed=1, nonfinite=False).cuda()
    wire = codec.encode_rows(x)
    with backend("torch"):
        expected = codec.decode_sum(wire, x.shape[1])
    assert_same_values(codec.decode_sum(wire, x.shape[1]), expected)
