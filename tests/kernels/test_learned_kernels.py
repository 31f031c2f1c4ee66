"""Learned-levels Triton kernels equal the torch reference bit for bit (interpreter on CPU, compiled on CUDA)."""

import pytest
import torch
from bitwise import assert_dispatch_matches_torch, assert_falls_back_to_torch, assert_same_values, assert_same_wire
from hopper import assert_no_spills_and_exact
from kernel_device import DEVICE

from composer_qsdp.kernels import backend, bucket_decode, use_triton
from composer_qsdp.kernels import learned as kernels
from composer_qsdp.kernels.groups import vec
from composer_qsdp.quant import LearnedLevelsCodec
from composer_qsdp.quant.learned import fit_levels

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# The interpreter evaluates IEEE special cases (inf - inf in NaN buckets, 1 / denormal range) through numpy,
# which warns where a GPU silently produces the same inf/NaN.
pytestmark = [pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning"),
              pytest.mark.requires_triton_kernels]


def _levels(bits: int, seed: int) -> torch.Tensor:
    """Strictly increasing fp32 levels from 0 to 1 whose gaps differ by up to ~1000x (dense and sparse regions)."""
    gen = torch.Generator().manual_seed(seed)
    gaps = torch.rand((1 << bits) - 1, generator=gen, dtype=torch.float64) ** 3 + 1e-3
    levels = torch.cat([gaps.new_zeros(1), torch.cumsum(gaps, 0) / gaps.sum()]).to(torch.float32)
    levels[-1] = 1.0
    return levels


def _clustered_levels(bits: int, run: int) -> torch.Tensor:
    """Runs of ``run`` levels 2**-20 apart (the smallest fitted gap) separated by equal large gaps: one cell of
    the search's grid holds a whole run, so the search takes refinement steps."""
    gaps = torch.full(((1 << bits) - 1,), 2.0**-20, dtype=torch.float64)
    big = gaps[::run]
    gaps[::run] = (1 - 2.0**-20 * (gaps.numel() - big.numel())) / big.numel()
    levels = torch.cat([gaps.new_zeros(1), torch.cumsum(gaps, 0)]).to(torch.float32)
    levels[-1] = 1.0
    return levels


def _codec(bits: int, bucket: int, seed: int = 0, levels: torch.Tensor | None = None) -> LearnedLevelsCodec:
    codec = LearnedLevelsCodec(bits, bucket)
    codec.set_levels((_levels(bits, seed) if levels is None else levels).to(DEVICE))
    return codec


def _refinement_steps(levels: torch.Tensor) -> int:
    """The search table's refinement step count ``R`` (its last int64 word)."""
    return int(kernels.search_table(levels)[-1])


def _data(rows: int, n: int, dtype: torch.dtype, seed: int, nonfinite: bool) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    # Heavy tails (cubed normals) and magnitudes spread over 1e-3..1e3 so buckets differ in range and shape.
    x = torch.randn(rows, n, generator=gen) ** 3 * 10 ** (6 * torch.rand(rows, 1, generator=gen) - 3)
    x = x.to(DEVICE, dtype)
    if nonfinite:
        x[0, n // 3] = float("nan")
        x[-1, -1] = float("inf")
    return x


def _check_codec_kernels(codec: LearnedLevelsCodec, x: torch.Tensor, seed: int, offset: int, **launch) -> None:
    rows, n = x.shape
    fmt = codec.wire_format(n)
    expected = codec._encode_rows_reference(x, seed, offset)
    wire = kernels.encode_rows(x, codec.levels, codec.bits, codec.bucket_size, fmt, seed, offset, **launch)
    assert_same_wire(codec, wire, expected, n)
    for dtype in DTYPES:
        got = kernels.decode_rows(expected, codec.bits, codec.bucket_size, fmt, dtype, **launch)
        assert_same_values(got, codec._decode_rows_fp32(expected, n).to(dtype))
    got_sum = kernels.decode_sum(expected, codec.bits, codec.bucket_size, fmt, **launch)
    assert_same_values(got_sum, codec._decode_sum_reference(expected, n))


CASES = [  # rows, n, bucket_size, bits, dtype, offset, seed
    (1, 4096, 1024, 8, torch.float32, 0, 1),  # aligned: one Philox call per 8 elements
    (4, 1000, 64, 8, torch.bfloat16, 8, 2**40 + 3),  # aligned rows, tail bucket
    (3, 1001, 64, 4, torch.float16, 3, 7),  # unaligned counters, tail group
    (2, 777, 104, 2, torch.bfloat16, 2**32 - 5, 9),  # non-power-of-two bucket, counter carry
    (2, 530, 24, 1, torch.float32, 16, 5),  # odd group count per bucket
    (3, 99, 8, 8, torch.float16, 5, 0),  # one group per bucket
    (2, 1500, 256, 4, torch.bfloat16, 1, 0),
    (1, 5, 1024, 8, torch.float16, 0, 0),  # one partial bucket
    (5, 64, 16, 2, torch.float32, 0, 0),
]


@pytest.mark.parametrize("nonfinite", [False, True])
@pytest.mark.parametrize("rows,n,bucket,bits,dtype,offset,seed", CASES)
def test_kernels_match_reference(rows, n, bucket, bits, dtype, offset, seed, nonfinite):
    codec = _codec(bits, bucket, seed=n)
    _check_codec_kernels(codec, _data(rows, n, dtype, seed=n + bits, nonfinite=nonfinite), seed, offset)


@pytest.mark.parametrize("buckets_per_program,num_warps", [(1, 4), (2, 2), (32, 8)])
def test_launch_configuration_does_not_change_results(buckets_per_program, num_warps):
    codec = _codec(4, 128)
    x = _data(2, 1000, torch.bfloat16, seed=3, nonfinite=False)
    _check_codec_kernels(codec, x, 11, 8, buckets_per_program=buckets_per_program, num_warps=num_warps)


LEVEL_SETS = [  # bits, levels ("random": _levels; else a run length of _clustered_levels), refinement steps R
    (1, "random", 0), (2, "random", 1), (4, "random", 1), (8, "random", 3),
    (2, 2, 1), (4, 3, 2), (4, 15, 4), (8, 5, 3), (8, 255, 8),
]


@pytest.mark.parametrize("bits,kind,steps", LEVEL_SETS)
def test_values_on_levels_constant_and_tiny_range_buckets(bits, kind, steps):
    # A bucket holding 0, 1 and every level (normalized by a range of exactly 1, so z is the value itself), and
    # the midpoints between levels: the search's edges, z == l_j and z == 1 included, for level sets whose search
    # needs 0 to `bits` refinement steps.
    levels = None if kind == "random" else _clustered_levels(bits, kind)
    codec = _codec(bits, 8 << bits, seed=bits, levels=levels)
    assert _refinement_steps(codec.levels) == steps
    levels = codec.levels.cpu()
    mids = (levels[:-1] + levels[1:]) / 2
    on_levels = torch.cat([levels, mids, levels[:1]]).repeat(8)[: 8 << bits]
    x = torch.cat([on_levels, torch.full((8 << bits,), 1.5), 1e-38 * torch.arange(8 << bits, dtype=torch.float32),
                   torch.randn(8 << bits)])  # fmt: skip
    for seed in (3, 4):
        _check_codec_kernels(codec, x.view(1, -1).to(DEVICE), seed, 0)


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("bucket", [256, 4096])
def test_fitted_levels_need_no_refinement_step(bits, bucket):
    # The grid has CELLS_PER_LEVEL cells per level so that levels fitted to common distributions (here normal,
    # Laplace-like, Student-t with 3 degrees of freedom and cubed normal values) never put two levels in one cell:
    # their search is one cell lookup and one comparison.
    gen = torch.Generator().manual_seed(bits)
    normal = torch.randn(1 << 18, generator=gen)
    chi2 = torch.randn(1 << 18, 3, generator=gen).square().sum(1)
    laplace = torch.log(torch.rand(1 << 18, generator=gen)) * torch.randn(1 << 18, generator=gen).sign()
    for x in (normal, laplace, normal / (chi2 / 3).sqrt(), normal**3):
        assert _refinement_steps(fit_levels(x, bits, bucket)) == 0


def test_search_table_is_built_once_per_level_set():
    codec = _codec(4, 256)
    x = _data(2, 1000, torch.float32, seed=3, nonfinite=False)
    with backend("triton"):
        codec.encode_rows(x, seed=1)
        table = codec._tables[codec.levels]
        codec.encode_rows(x, seed=2)
        assert codec._tables[codec.levels] is table and len(codec._tables) == 1
        codec.set_levels(_clustered_levels(4, 3).to(DEVICE))
        codec.encode_rows(x, seed=3)
        assert _refinement_steps(codec.levels) == 2 and codec._tables[codec.levels] is not table


def test_codec_dispatch_to_triton_matches_torch():
    codec = _codec(4, 256)
    x = _data(3, 700, torch.float32, seed=4, nonfinite=False)
    assert_dispatch_matches_torch(codec, x)


def test_lazy_fit_under_the_kernels_equals_the_reference():
    x = _data(1, 4096, torch.float32, seed=8, nonfinite=False)
    with backend("torch"):
        expected = LearnedLevelsCodec(4, 256).encode(x, seed=2)
    with backend("triton"):
        assert torch.equal(LearnedLevelsCodec(4, 256).encode(x, seed=2), expected)


@pytest.mark.parametrize("bits,bucket", [(3, 64), (4, 100)])
def test_unsupported_configuration_falls_back_to_reference(bits, bucket):
    assert_falls_back_to_torch(_codec(bits, bucket), kernels, _data(1, 300, torch.float32, seed=6, nonfinite=False))


def test_kernel_launchers_reject_unsupported_configurations_and_levels():
    x = _data(1, 300, torch.float32, seed=6, nonfinite=False)
    codec = _codec(4, 64)
    with pytest.raises(ValueError, match="bits=3"):
        kernels.encode_rows(x, _levels(3, 0).to(DEVICE), 3, 64, LearnedLevelsCodec(3, 64).wire_format(300), 1, 0)
    with pytest.raises(ValueError, match="16 fp32 values"):
        kernels.encode_rows(x, codec.levels.double(), 4, 64, codec.wire_format(300), 1, 0)
    with pytest.raises(ValueError, match="bucket_size=16384"):
        wire = torch.zeros(1, 8, dtype=torch.uint8, device=DEVICE)
        kernels.decode_sum(wire, 8, 16384, LearnedLevelsCodec(8, 16384).wire_format(3))


def _hopper_variant(name: str, kernel: str, types: dict, constants: dict, bucket: int) -> dict:
    """A compile job for :func:`hopper.resource_usage` in the launch configuration a large tensor gets on a GPU
    (rows 16-element aligned: their strides are known multiples of 16, as Triton specializes them)."""
    groups, bpp, warps = kernels._config(bucket, 1 << 16, True, None, None,
                                         "encode" if kernel == "_quantize_kernel" else "decode")
    streamed = {"*bf16": torch.bfloat16, "*fp16": torch.float16, "*fp32": torch.float32}[
        types.get("x_ptr", types.get("out_ptr"))]
    decode = kernel != "_quantize_kernel"  # the decoders are bucket_decode's, given this codec's tile decoder
    if decode:
        constants = {"DECODE_TILE": "jit:composer_qsdp.kernels.learned:_decode_tile", **constants}
    module = "composer_qsdp.kernels." + ("bucket_decode" if decode else "learned")
    return {"name": name, "module": module, "kernel": kernel,
            "types": {"wire_ptr": "*u8", "meta_ptr": "*fp32", "levels_ptr": "*fp32", "table_ptr": "*i64",
                      "seed": "i64", "offset": "i64", **types},
            "constants": {"BUCKET": bucket, "GROUPS": groups, "BPP": bpp, "VEC": vec(streamed), **constants},
            "num_warps": warps, "divisible": ["x_row_stride", "wire_row_stride", "out_row_stride"]}  # fmt: skip


def test_kernels_compile_for_hopper_without_spills():
    variants = [
        _hopper_variant(f"quantize {bits}b {dtype} bucket {bucket} aligned={aligned}", "_quantize_kernel",
                        {"x_ptr": "*" + dtype}, {"BITS": bits, "ALIGNED": aligned, "PARTIAL_GROUPS": not aligned},
                        bucket)  # fmt: skip
        for bits, dtype, aligned, bucket in [
            (8, "bf16", True, 1024), (8, "fp32", False, 1024), (4, "bf16", True, 1024), (4, "fp32", False, 8192),
            (2, "fp16", False, 64), (1, "bf16", True, 200),
        ]
    ]
    variants += [
        _hopper_variant(f"dequantize {bits}b {dtype} bucket {bucket}", "_dequantize_kernel", {"out_ptr": "*" + dtype},
                        {"BITS": bits, "EMULATE_BF16_RNE": False}, bucket)  # fmt: skip
        for bits, dtype, bucket in [(8, "bf16", 1024), (8, "fp32", 1024), (4, "fp32", 8192), (2, "fp16", 64)]
    ]
    variants += [
        _hopper_variant(f"decode_sum {bits}b bucket {bucket}", "_dequantize_sum_kernel",
                        {"out_ptr": "*fp32", "divisor": "fp32", "scale_rot": "fp32"},
                        {"ROWS": 8, "BITS": bits, "DIVIDE": False, "EMULATE_BF16_RNE": False,
                         "STEP": bucket_decode.ROWS_PER_STEP, "ROTATE": False, "LOG_B": 0}, bucket)  # fmt: skip
        for bits, bucket in [(8, 1024), (4, 8192)]
    ]
    assert_no_spills_and_exact(variants)


# ------------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_kernels_match_reference(bits, dtype):
    codec = _codec(bits, 1024, seed=bits)
    # n a multiple of 8 but not of 16: rows are not 16-byte aligned, noise is aligned at offset 0.
    x = _data(4, (1 << 20) + 328, dtype, seed=bits, nonfinite=True)
    assert use_triton(x)
    for offset in (0, 5):  # aligned and unaligned noise paths
        _check_codec_kernels(codec, x, 2**35 + 1, offset)
    _check_codec_kernels(codec, x[:1], 7, 0)  # the single-row (all-gather) launch
    # The CPU reference gives the same wire as the GPU kernels.
    assert_same_wire(codec, codec.encode_rows(x, seed=3).cpu(), codec.encode_rows(x.cpu(), seed=3), x.shape[1])


@pytest.mark.gpu
@pytest.mark.parametrize("bits,kind,steps", LEVEL_SETS)
def test_cuda_kernels_match_reference_for_any_refinement_steps(bits, kind, steps):
    codec = _codec(bits, 1024, seed=bits, levels=None if kind == "random" else _clustered_levels(bits, kind))
    x = _data(2, 1 << 18, torch.bfloat16, seed=bits, nonfinite=True)
    # Half of each row inside the runs of close levels (z from 0.4 to 0.6 of a range of 1 around them).
    x[:, ::2] = codec.levels[(1 << bits) // 2].to(x.dtype) + (torch.rand(2, 1 << 17, device=DEVICE) - 0.5).to(x.dtype)
    _check_codec_kernels(codec, x, 5, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("bucket", [64, 200, 2048, 8192])
def test_cuda_bucket_sizes(bucket):
    codec = _codec(8, bucket)
    _check_codec_kernels(codec, _data(2, 300_001, torch.bfloat16, seed=bucket, nonfinite=False), 17, 8)


@pytest.mark.gpu
def test_cuda_decode_sum_many_rows():
    codec = _codec(8, 512)
    x = _data(16, 1 << 18, torch.float32, seed=1, nonfinite=False)
    wire = codec.encode_rows(x, seed=1)
    assert_same_values(codec.decode_sum(wire, x.shape[1]), codec._decode_sum_reference(wire, x.shape[1]))


@pytest.mark.gpu
def test_cuda_levels_set_on_the_cpu_move_to_the_gpu_once():
    codec = LearnedLevelsCodec(4, 256)
    codec.set_levels(_levels(4, 0))
    x = _data(1, 4096, torch.bfloat16, seed=2, nonfinite=False)
    wire = codec.encode_rows(x, seed=1)
    levels = codec.levels
    assert levels.is_cuda
    assert torch.equal(codec.encode_rows(x, seed=1), wire) and codec.levels is levels
    codec.encode_rows(x, seed=2)
    assert codec.levels is levels
