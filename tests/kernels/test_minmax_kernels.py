"""Min-max Triton kernels equal the torch reference bit for bit (interpreter on CPU, compiled on CUDA)."""

import pytest
import torch
from bitwise import assert_dispatch_matches_torch, assert_falls_back_to_torch, assert_same_values, assert_same_wire
from hopper import assert_no_spills_and_exact
from kernel_device import DEVICE

from composer_qsdp.kernels import backend, bucket_decode, use_triton
from composer_qsdp.kernels import minmax as kernels
from composer_qsdp.kernels.groups import vec
from composer_qsdp.kernels.fixed_point import fraction_bits
from composer_qsdp.quant import MinMaxCodec
from composer_qsdp.quant.buckets import ieee_div

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# The interpreter evaluates IEEE special cases (inf - inf in NaN buckets, 1 / denormal scale) through numpy,
# which warns where a GPU silently produces the same inf/NaN.
pytestmark = [pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning"),
              pytest.mark.requires_triton_kernels]


def _data(rows: int, n: int, dtype: torch.dtype, seed: int, nonfinite: bool) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    # Magnitudes spread over 1e-3..1e3 so buckets differ in range and offset.
    x = (torch.randn(rows, n, generator=gen) * 10 ** (6 * torch.rand(rows, n, generator=gen) - 3)).to(DEVICE, dtype)
    if nonfinite:
        x[0, n // 3] = float("nan")
        x[-1, -1] = float("inf")
    return x


def _check_codec_kernels(codec: MinMaxCodec, x: torch.Tensor, seed: int, offset: int, **launch) -> None:
    rows, n = x.shape
    fmt = codec.wire_format(n)
    expected = codec._encode_rows_reference(x, seed, offset)
    wire = kernels.encode_rows(x, codec.bits, codec.bucket_size, fmt, codec.stochastic, seed, offset, **launch)
    assert_same_wire(codec, wire, expected, n)
    for dtype in DTYPES:
        got = kernels.decode_rows(expected, codec.bits, codec.bucket_size, fmt, dtype, **launch)
        assert_same_values(got, codec._decode_rows_fp32(expected, n).to(dtype))
    # Into the rows of a wider buffer (row stride n + 8): its other columns untouched.
    buffer = torch.full((rows, n + 8), 3.0, device=x.device, dtype=x.dtype)
    kernels.decode_rows(expected, codec.bits, codec.bucket_size, fmt, x.dtype, out=buffer[:, :n], **launch)
    assert_same_values(buffer[:, :n], codec._decode_rows_fp32(expected, n).to(x.dtype))
    assert bool((buffer[:, n:] == 3).all())
    got_sum = kernels.decode_sum(expected, codec.bits, codec.bucket_size, fmt, **launch)
    assert_same_values(got_sum, codec._decode_sum_reference(expected, n))
    # The reduce-scatter's fused average: fp32 division by the group size, one rounding to the output dtype.
    for dtype in DTYPES:
        out = torch.empty(n, device=x.device, dtype=dtype)
        kernels.decode_sum(expected, codec.bits, codec.bucket_size, fmt, out=out, divisor=rows + 2, **launch)
        assert_same_values(out, ieee_div(codec._decode_sum_reference(expected, n), rows + 2).to(dtype))


CASES = [  # rows, n, bucket_size, bits, rounding, dtype, offset, seed
    (1, 4096, 1024, 8, "stochastic", torch.float32, 0, 1),  # aligned: one Philox call per 8 elements
    (4, 1000, 64, 4, "stochastic", torch.bfloat16, 8, 2**40 + 3),  # aligned rows, tail bucket
    (3, 1001, 64, 4, "stochastic", torch.float16, 3, 7),  # unaligned counters
    (2, 777, 104, 2, "stochastic", torch.bfloat16, 2**32 - 5, 9),  # non-power-of-two bucket, counter carry
    (2, 530, 24, 1, "stochastic", torch.float32, 16, 5),  # odd group count per bucket
    (3, 99, 8, 8, "stochastic", torch.float16, 0, 0),  # one group per bucket, tail group
    (2, 2048, 512, 2, "nearest", torch.float32, 0, 0),
    (2, 1500, 256, 4, "nearest", torch.bfloat16, 1, 0),
    (1, 5, 1024, 8, "nearest", torch.float16, 0, 0),  # one partial bucket
    (5, 64, 16, 1, "nearest", torch.float32, 0, 0),
    (2, 1000, 256, 3, "nearest", torch.bfloat16, 0, 0),  # byte-wise words; tail word short of the metadata
    (3, 203, 64, 3, "stochastic", torch.float32, 5, 3),  # odd width, partial tail group, unaligned counters
    (2, 517, 40, 5, "stochastic", torch.float16, 8, 1),
    (1, 261, 128, 6, "nearest", torch.float32, 0, 0),
    (2, 300, 32, 7, "stochastic", torch.bfloat16, 0, 2),
]


@pytest.mark.parametrize("nonfinite", [False, True])
@pytest.mark.parametrize("rows,n,bucket,bits,rounding,dtype,offset,seed", CASES)
def test_kernels_match_reference(rows, n, bucket, bits, rounding, dtype, offset, seed, nonfinite):
    codec = MinMaxCodec(bits=bits, bucket_size=bucket, rounding=rounding)
    _check_codec_kernels(codec, _data(rows, n, dtype, seed=n + bits, nonfinite=nonfinite), seed, offset)


@pytest.mark.parametrize("buckets_per_program,num_warps", [(1, 4), (2, 2), (32, 8)])
def test_launch_configuration_does_not_change_results(buckets_per_program, num_warps):
    codec = MinMaxCodec(bits=4, bucket_size=128)
    x = _data(2, 1000, torch.bfloat16, seed=3, nonfinite=False)
    _check_codec_kernels(codec, x, 11, 8, buckets_per_program=buckets_per_program, num_warps=num_warps)


def test_constant_and_tiny_range_buckets():
    codec = MinMaxCodec(bits=8, bucket_size=32)
    x = torch.cat([torch.full((32,), 1.5), torch.full((32,), -0.0), 1e-38 * torch.arange(32.0), torch.randn(32)])
    _check_codec_kernels(codec, x.view(1, -1).to(DEVICE), 3, 0)


@pytest.mark.parametrize("rounding", ["stochastic", "nearest"])
def test_codec_dispatch_to_triton_matches_torch(rounding):
    codec = MinMaxCodec(bits=2, bucket_size=256, rounding=rounding)
    x = _data(3, 700, torch.float32, seed=4, nonfinite=False)
    assert_dispatch_matches_torch(codec, x)


@pytest.mark.parametrize("bits,bucket", [(3, 60), (4, 100)])
def test_unsupported_configuration_falls_back_to_reference(bits, bucket):
    x = _data(1, 300, torch.float32, seed=6, nonfinite=False)
    assert_falls_back_to_torch(MinMaxCodec(bits=bits, bucket_size=bucket), kernels, x)


def test_kernel_launchers_reject_unsupported_configurations():
    x = _data(1, 300, torch.float32, seed=6, nonfinite=False)
    codec = MinMaxCodec(bits=3, bucket_size=60)
    with pytest.raises(ValueError, match="bucket_size=60"):
        kernels.encode_rows(x, 3, 60, codec.wire_format(300), True, 1, 0)
    with pytest.raises(ValueError, match="bucket_size=16384"):
        wire = torch.zeros(1, 8, dtype=torch.uint8, device=DEVICE)
        kernels.decode_sum(wire, 8, 16384, MinMaxCodec(8, 16384).wire_format(3))


def test_backend_selection_errors(monkeypatch):
    with pytest.raises(ValueError, match="backend='fast'.*auto, triton, torch"):
        with backend("fast"):
            pass
    monkeypatch.setenv("COMPOSER_QSDP_KERNELS", "gpu")
    with pytest.raises(ValueError, match="COMPOSER_QSDP_KERNELS='gpu'"):
        use_triton(torch.zeros(1))
    monkeypatch.setenv("COMPOSER_QSDP_KERNELS", "torch")
    assert not use_triton(torch.zeros(1))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with backend("triton"), pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        use_triton(torch.zeros(1))
    with backend("auto"):
        assert use_triton(torch.zeros(1)) is False


def _hopper_variant(name: str, kernel: str, types: dict, constants: dict, bucket: int, aligned_rows: bool) -> dict:
    """A compile job for :func:`hopper.resource_usage` in the launch configuration a large tensor gets on a GPU.

    ``aligned_rows``: rows start on 16-element boundaries (one row: row stride 0), so the row strides are known
    multiples of 16, as Triton specializes them; otherwise nothing but the pointers is known to be aligned.
    """
    streamed = {"*bf16": torch.bfloat16, "*fp16": torch.float16, "*fp32": torch.float32}[
        types.get("x_ptr", types.get("out_ptr"))]
    kind = "encode" if kernel == "_quantize_kernel" else "decode"
    wide = constants.get("STOCHASTIC", False) and constants["BITS"] == 8 and streamed.itemsize == 2  # as encode_rows
    if constants.get("ROTATE"):  # a decode-sum rotated back, launched as decode_sum launches it
        (groups, bpp, warps), log_row = bucket_decode.rotated_sum_launch(constants["BITS"], bucket, 1 << 16, True)
        constants = {**constants, "LOG_ROW": log_row}
    else:
        groups, bpp, warps = kernels._config(bucket, 1 << 16, True, aligned_rows, None, None, kind, wide)
    decode = kernel != "_quantize_kernel"  # the decoders are bucket_decode's, given this codec's tile decoder
    if decode:
        constants = {"DECODE_TILE": "jit:composer_qsdp.kernels.minmax:_decode_tile", **constants}
    module = "composer_qsdp.kernels." + ("bucket_decode" if decode else "minmax")
    return {"name": name, "module": module, "kernel": kernel,
            "types": {"wire_ptr": "*u8", "meta_ptr": "*fp32", "seed": "i64", "offset": "i64", **types},
            "constants": {"BUCKET": bucket, "GROUPS": groups, "BPP": bpp, "VEC": vec(streamed), **constants},
            "num_warps": warps,
            "divisible": ["x_row_stride", "wire_row_stride", "out_row_stride"] if aligned_rows else []}  # fmt: skip


@pytest.mark.parametrize("aligned_rows", [True, False])
def test_kernels_compile_for_hopper_without_spills(aligned_rows):
    variants = [
        _hopper_variant(f"quantize {bits}b {dtype} bucket {bucket} stochastic={stochastic} aligned={aligned}",
                        "_quantize_kernel", {"x_ptr": "*" + dtype},
                        {"BITS": bits, "STOCHASTIC": stochastic, "FRACTION": fraction_bits(bits) if stochastic else 0,
                         "ALIGNED": aligned, "PARTIAL_GROUPS": not aligned},
                        bucket, aligned_rows)  # fmt: skip
        for bits, dtype, stochastic, aligned, bucket in [
            (8, "bf16", True, True, 1024), (4, "bf16", True, False, 1024), (2, "fp16", True, False, 64),
            (1, "fp32", True, True, 200), (4, "fp32", True, False, 8192), (2, "bf16", False, True, 2048),
            (3, "bf16", False, True, 256), (5, "fp32", True, False, 40), (7, "fp16", True, True, 1024),
        ]
    ]
    variants += _feedback_variants(aligned_rows)
    variants += [
        _hopper_variant(f"dequantize {bits}b {dtype} bucket {bucket}", "_dequantize_kernel", {"out_ptr": "*" + dtype},
                        {"BITS": bits, "EMULATE_BF16_RNE": False}, bucket, aligned_rows)  # fmt: skip
        for bits, dtype, bucket in [(8, "bf16", 1024), (4, "fp32", 8192), (2, "fp16", 64), (1, "bf16", 200)]
    ]
    variants += [
        _hopper_variant(f"decode_sum {bits}b bucket {bucket} {rows} rows into {dtype} rotate={rotate}",
                        "_dequantize_sum_kernel", {"out_ptr": "*" + dtype, "divisor": "fp32", "scale_rot": "fp32"},
                        {"ROWS": rows, "BITS": bits, "DIVIDE": dtype != "fp32", "EMULATE_BF16_RNE": False,
                         "STEP": bucket_decode.ROWS_PER_STEP, "ROTATE": rotate, "LOG_B": bucket.bit_length() - 1},
                        bucket, aligned_rows)  # fmt: skip
        for bits, bucket, rows, dtype, rotate in [
            (8, 1024, 8, "fp32", False), (4, 8192, 8, "fp32", False), (4, 1024, 8, "bf16", False),
            (3, 256, 8, "fp32", False), (3, 256, 4, "fp32", True), (3, 256, 8, "fp32", True),
            (2, 256, 7, "fp32", True), (8, 1024, 8, "fp32", True), (4, 256, 4, "bf16", True),
            (6, 64, 4, "fp32", True),
        ]
    ]
    assert_no_spills_and_exact(variants)


def _feedback_variants(aligned_rows: bool) -> list[dict]:
    """The error-feedback quantize in the launch shapes encode_rows_feedback picks: the qwd-*-loco presets' (3 bits,
    rotated, 256) with an fp32, bf16 or 8-bit coded (``u8``) residual, other widths, the flat rotation of larger
    buckets, not rotated."""
    variants = []
    for bits, bucket, rotate, stochastic, rdtype in [
        (3, 256, True, False, "fp32"), (3, 256, True, False, "bf16"), (2, 256, True, False, "fp32"),
        (4, 256, True, True, "fp32"), (8, 256, True, False, "fp32"), (6, 64, True, True, "fp32"),
        (3, 64, True, False, "bf16"), (3, 512, True, False, "fp32"), (4, 256, False, True, "fp32"),
        (3, 256, True, False, "u8"), (2, 256, True, False, "u8"), (3, 512, True, False, "u8"),
        (4, 256, False, True, "u8"),
    ]:
        log_row = kernels.rotation_rows(bits, bucket) if rotate else 0
        per_thread = kernels.rotated_feedback_elements_per_thread(log_row, rdtype == "u8")
        groups, bpp, warps = kernels.launch_shape(bucket, 1 << 16, True, kernels.GPU_TILE, kernels.INTERPRETER_TILE,
                                                  per_thread, None, None) if rotate else \
            kernels._config(bucket, 1 << 16, True, aligned_rows, None, None, "encode")
        variants.append({
            "name": f"feedback {bits}b bucket {bucket} rotate={rotate} stochastic={stochastic} residual {rdtype}",
            "module": "composer_qsdp.kernels.minmax", "kernel": "_quantize_feedback_kernel",
            "types": {"x_ptr": "*bf16", "r_ptr": "*" + rdtype, "wire_ptr": "*u8", "meta_ptr": "*fp32", "seed": "i64",
                      "offset": "i64", "beta": "fp32", "scale_rot": "fp32"},
            "constants": {"BITS": bits, "BUCKET": bucket, "GROUPS": bucket >> log_row if log_row else groups,
                          "BPP": bpp, "VEC": 4 if log_row and rdtype == "fp32" else 8, "STOCHASTIC": stochastic,
                          "FRACTION": fraction_bits(bits) if stochastic else 0, "ALIGNED": True,
                          "PARTIAL_GROUPS": False, "ROTATE": rotate, "LOG_B": bucket.bit_length() - 1,
                          "LOG_ROW": log_row, "EMULATE_BF16_RNE": False, "CODED": rdtype == "u8",
                          # A coded row's stride: a multiple of 16 bytes, or of 8 (numel + 4 * buckets, often).
                          "R_ALIGN": 16 if aligned_rows else 8},
            "num_warps": warps,
            "divisible": ["x_row_stride", "r_row_stride", "wire_row_stride"] if aligned_rows else []})
    return variants


# ------------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rounding", ["stochastic", "nearest"])
def test_cuda_kernels_match_reference(bits, dtype, rounding):
    codec = MinMaxCodec(bits=bits, bucket_size=1024, rounding=rounding)
    # n a multiple of 8 but not of 16: rows are not 16-byte aligned, noise is aligned at offset 0.
    x = _data(4, (1 << 20) + 328, dtype, seed=bits, nonfinite=True)
    assert use_triton(x)
    for offset in (0, 5):  # aligned and unaligned noise paths
        _check_codec_kernels(codec, x, 2**35 + 1, offset)
    _check_codec_kernels(codec, x[:1], 7, 0)  # the single-row (all-gather) launch
    # The CPU reference gives the same wire as the GPU kernels.
    assert_same_wire(codec, codec.encode_rows(x, seed=3).cpu(), codec.encode_rows(x.cpu(), seed=3), x.shape[1])


@pytest.mark.gpu
@pytest.mark.parametrize("bucket", [64, 200, 2048, 8192])
def test_cuda_bucket_sizes(bucket):
    codec = MinMaxCodec(bits=4, bucket_size=bucket)
    _check_codec_kernels(codec, _data(2, 300_001, torch.bfloat16, seed=bucket, nonfinite=False), 17, 8)


@pytest.mark.gpu
def test_cuda_decode_sum_many_rows():
    codec = MinMaxCodec(bits=8, bucket_size=512)
    x = _data(16, 1 << 18, torch.float32, seed=1, nonfinite=False)
    wire = codec.encode_rows(x, seed=1)
    assert_same_values(codec.decode_sum(wire, x.shape[1]), codec._decode_sum_reference(wire, x.shape[1]))


FEEDBACK_CASES = [  # rows, n, bucket_size, bits, rounding, dtype, residual dtype, rotate
    (4, 1000, 256, 3, "nearest", torch.bfloat16, torch.float32, True),  # the qwd-w4g3-loco gradients; padded rows
    (2, 512, 64, 2, "nearest", torch.float32, torch.bfloat16, True),
    (3, 203, 64, 4, "stochastic", torch.bfloat16, torch.float32, True),  # unaligned counters, padded rows
    (2, 300, 40, 3, "stochastic", torch.float16, torch.float32, False),
    (3, 96, 32, 8, "nearest", torch.bfloat16, torch.bfloat16, False),
    # Rotated buckets of 256 as 16 rows of 16 (rotation_rows): more widths, residual dtypes, partial last buckets.
    (3, 600, 256, 2, "nearest", torch.bfloat16, torch.bfloat16, True),
    (2, 700, 256, 4, "stochastic", torch.float32, torch.float32, True),
    (2, 256, 256, 8, "nearest", torch.bfloat16, torch.float32, True),
    (2, 200, 64, 5, "stochastic", torch.bfloat16, torch.bfloat16, True),  # rows of 8
    (2, 300, 128, 6, "nearest", torch.bfloat16, torch.float32, True),  # flat: 16 rows of 8 exceed the view
    (2, 520, 512, 3, "nearest", torch.bfloat16, torch.float32, True),  # flat: 32 rows of 16 exceed the view
]


@pytest.mark.parametrize("nonfinite", [False, True])
@pytest.mark.parametrize("rows,n,bucket,bits,rounding,dtype,rdtype,rotate", FEEDBACK_CASES)
def test_feedback_kernel_matches_reference(rows, n, bucket, bits, rounding, dtype, rdtype, rotate, nonfinite):
    """The fused error-feedback quantize (one pass) gives the reference's wire and residual bit for bit: the encode
    of ``x + residual`` (rotated when asked), then ``fresh - beta * (fresh - residual)`` from the decode."""
    from composer_qsdp.quant import HadamardCodec

    inner = MinMaxCodec(bits=bits, bucket_size=bucket, rounding=rounding)
    codec = HadamardCodec(inner) if rotate else inner
    x = _data(rows, n, dtype, seed=n + bits, nonfinite=nonfinite)
    residual = (0.1 * _data(rows, n, torch.float32, seed=7, nonfinite=False)).to(rdtype).view(-1)
    with backend("torch"):
        expected_residual = residual.clone()
        expected = codec.encode_rows_feedback(x, expected_residual, 0.5, seed=9, offset=3)
    with backend("triton"):
        got_residual = residual.clone()
        got = codec.encode_rows_feedback(x, got_residual, 0.5, seed=9, offset=3)
    padded = codec.padded(n) if rotate else n
    assert_same_wire(inner, got, expected, padded)
    assert_same_values(got_residual, expected_residual)
    assert bool(torch.isfinite(got_residual).all())  # a non-finite bucket resets its residual



CODED_FEEDBACK_CASES = [  # rows, n, bucket_size, bits, rounding, dtype, rotate
    (3, 601, 256, 3, "nearest", torch.bfloat16, True),  # the qwd-*-loco presets': rows of 16, partial last bucket
    (2, 700, 256, 2, "nearest", torch.float32, True),
    (2, 500, 256, 4, "stochastic", torch.bfloat16, True),
    (2, 301, 128, 6, "nearest", torch.bfloat16, True),  # flat: 16 rows of 8 exceed the view
    (2, 520, 512, 3, "nearest", torch.float16, True),  # flat: 32 rows of 16 exceed the view
    (3, 203, 64, 4, "stochastic", torch.float16, False),  # partial group and bucket, unaligned rows
    (2, 96, 32, 8, "nearest", torch.bfloat16, False),
]


class _CountingFeedbackKernel:
    """Stands in for ``kernels.encode_rows_feedback``, counting the feedback calls (with a residual) that reach it;
    the reference's own rotated encode goes through it without one."""

    def __init__(self) -> None:
        self.calls, self._kernel = 0, kernels.encode_rows_feedback

    def __call__(self, x, residual, *args, **kwargs):
        self.calls += residual is not None
        return self._kernel(x, residual, *args, **kwargs)


@pytest.mark.parametrize("nonfinite", [False, True])
@pytest.mark.parametrize("rows,n,bucket,bits,rounding,dtype,rotate", CODED_FEEDBACK_CASES)
def test_feedback_kernel_with_a_coded_residual_matches_reference(rows, n, bucket, bits, rounding, dtype, rotate,
                                                                 nonfinite, monkeypatch):  # fmt: skip
    """With the residual kept as ``SymmetricCodec(8, bucket)``'s wire, the fused kernel gives the reference's wire and
    the residual's wire bytes bit for bit, over calls that read back the residual the previous one stored (a NaN and
    an infinity in the second call's gradient reset their buckets' residual to finite values)."""
    from composer_qsdp.quant import CodedResidual, HadamardCodec, SymmetricCodec

    inner = MinMaxCodec(bits=bits, bucket_size=bucket, rounding=rounding)
    codec = HadamardCodec(inner) if rotate else inner
    storage = SymmetricCodec(8, bucket)
    expected_residual, got_residual = (CodedResidual(storage, rows, n, DEVICE) for _ in range(2))
    counting = _CountingFeedbackKernel()
    monkeypatch.setattr(kernels, "encode_rows_feedback", counting)
    meta_offset = storage.wire_format(n).meta_offset
    got_residual.wire[:, n:meta_offset] = 0xFF  # the kernel zeroes the padding before the scales, as the encode does
    for step in range(3):
        x = _data(rows, n, dtype, seed=n + step, nonfinite=nonfinite and step == 1)
        with backend("torch"):
            expected = codec.encode_rows_feedback(x, expected_residual, 0.5, seed=9, offset=3 + step)
        with backend("triton"):
            got = codec.encode_rows_feedback(x, got_residual, 0.5, seed=9, offset=3 + step)
        assert counting.calls == step + 1  # the fused kernel, not the reference
        assert_same_wire(inner, got, expected, codec.padded(n) if rotate else n)
        assert torch.equal(got_residual.wire, expected_residual.wire)
        assert bool(got_residual.wire[:, meta_offset:].contiguous().view(torch.float32).isfinite().all())
    assert got_residual.decode().abs().max() > 0


@pytest.mark.parametrize("storage_bits,storage_bucket", [(8, 128), (4, 256)])
def test_feedback_with_another_coded_residual_takes_the_reference(storage_bits, storage_bucket, monkeypatch):
    """A coded residual the kernel does not store (other buckets than the codec's, other widths) goes through the
    reference under the Triton backend too, with the same wire and residual as the torch backend."""
    from composer_qsdp.quant import CodedResidual, HadamardCodec, SymmetricCodec

    rows, n = 2, 600
    codec = HadamardCodec(MinMaxCodec(bits=3, bucket_size=256, rounding="nearest"))
    storage = SymmetricCodec(storage_bits, storage_bucket)
    expected_residual, got_residual = (CodedResidual(storage, rows, n, DEVICE) for _ in range(2))
    counting = _CountingFeedbackKernel()
    monkeypatch.setattr(kernels, "encode_rows_feedback", counting)
    for step in range(2):
        x = _data(rows, n, torch.bfloat16, seed=step, nonfinite=False)
        with backend("torch"):
            expected = codec.encode_rows_feedback(x, expected_residual, 0.5)
        with backend("triton"):
            assert torch.equal(codec.encode_rows_feedback(x, got_residual, 0.5), expected)
        assert torch.equal(got_residual.wire, expected_residual.wire)
    assert counting.calls == 0


def test_feedback_kernel_rejects_a_coded_residual_of_another_shape():
    x = _data(2, 300, torch.bfloat16, seed=1, nonfinite=False)
    fmt = MinMaxCodec(3, 64).wire_format(300)
    short = torch.zeros(2, 316, dtype=torch.uint8, device=DEVICE)  # 300 codes and 4 of the 5 buckets' scales
    with pytest.raises(ValueError, match=r"\[2, 320\] uint8 wire of SymmetricCodec\(8, 64\) .* shape \(2, 316\)"):
        kernels.encode_rows_feedback(x, short, 0.5, 3, 64, fmt, False, 0, 0)


@pytest.mark.parametrize("rotate,rdtype", [(True, torch.float32), (False, torch.bfloat16)])
def test_feedback_launch_configuration_does_not_change_results(rotate, rdtype):
    """``buckets_per_program`` / ``num_warps`` overrides of the fused feedback quantize (benchmark sweeps) give the
    default launch's wire and residual bit for bit, programs ending inside a row and on its padded tail."""
    rows, n, bucket = 2, 1000, 64  # 16 buckets per row, the last one partial
    inner = MinMaxCodec(bits=3, bucket_size=bucket, rounding="nearest")
    fmt = inner.wire_format(-(-n // bucket) * bucket if rotate else n)
    x = _data(rows, n, torch.bfloat16, seed=5, nonfinite=False)
    residual = (0.1 * _data(rows, n, torch.float32, seed=6, nonfinite=False)).to(rdtype).view(-1)
    expected_residual = residual.clone()
    expected = kernels.encode_rows_feedback(x, expected_residual, 0.5, 3, bucket, fmt, False, 9, 0, rotate)
    for buckets_per_program, num_warps in [(1, 1), (2, 4), (4, 2), (8, 8)]:
        got_residual = residual.clone()
        got = kernels.encode_rows_feedback(x, got_residual, 0.5, 3, bucket, fmt, False, 9, 0, rotate,
                                           buckets_per_program=buckets_per_program, num_warps=num_warps)
        assert_same_wire(inner, got, expected, fmt.numel)
        assert_same_values(got_residual, expected_residual)
    with pytest.raises(ValueError, match="buckets_per_program=3"):
        kernels.encode_rows_feedback(x, residual.clone(), 0.5, 3, bucket, fmt, False, 9, 0, rotate,
                                     buckets_per_program=3)
    with pytest.raises(ValueError, match="num_warps=3"):
        kernels.encode_rows_feedback(x, residual.clone(), 0.5, 3, bucket, fmt, False, 9, 0, rotate, num_warps=3)

def test_feedback_reference_is_the_loco_recursion():
    """The reference update, against float64: ``beta * r + (1 - beta) * (c - decode(encode(c)))`` to fp32 rounding;
    its wire is the plain encode of ``c``."""
    codec = MinMaxCodec(bits=3, bucket_size=64, rounding="nearest")
    x = _data(2, 300, torch.float32, seed=1, nonfinite=False)
    residual = 0.1 * _data(2, 300, torch.float32, seed=2, nonfinite=False).view(-1)
    c = x.double() + residual.double().view(2, 300)
    with backend("torch"):
        new = residual.clone()
        wire = codec.encode_rows_feedback(x, new, 0.8, seed=1)
        assert torch.equal(wire, codec.encode_rows(c.float(), seed=1))
        fresh = c - codec.decode_rows(wire, 300).double()
    torch.testing.assert_close(new.double().view(2, 300), 0.8 * residual.double().view(2, 300) + 0.2 * fresh,
                               rtol=0, atol=1e-6 * float(c.abs().max()))
    with pytest.raises(ValueError, match="beta=1.0 is invalid"):
        codec.encode_rows_feedback(x, residual.clone(), 1.0)
    with pytest.raises(ValueError, match="contiguous tensor of 600 elements"):
        codec.encode_rows_feedback(x, residual[:10].clone(), 0.5)


def test_coded_row_alignment_is_what_the_row_stride_guarantees():
    """The feedback kernel reads a coded residual's rows with the alignment their byte stride guarantees (capped at 16;
    one row: 16); CODED_FEEDBACK_CASES run all three (616, 508 and 528 bytes per row)."""
    for rows, stride, align in [(2, 616, 8), (2, 508, 4), (2, 528, 16), (1, 508, 16)]:
        wire = torch.zeros(rows, stride, dtype=torch.uint8)
        assert kernels._coded_row_alignment(wire) == align


ROTATED_SUM_CASES = [  # rows, n, bucket_size, bits; rows of 16 elements (kernels.rotation_rows) unless said
    (4, 1000, 256, 3),  # the qwd-w4g3-loco gradients on 4 ranks: padded rows, one loop step of 4 rows
    (3, 601, 256, 2),  # fewer rows than a step
    (6, 300, 64, 4),  # a loop step and 2 rows after it
    (2, 96, 32, 8),
    (3, 200, 64, 6),  # rows of 8: 6-byte code words read byte by byte
    (2, 700, 512, 3),  # a bucket of more than 16 rows of 16: the flat rotation
]


@pytest.mark.parametrize("nonfinite", [False, True])
@pytest.mark.parametrize("rows,n,bucket,bits", ROTATED_SUM_CASES)
def test_rotated_decode_sum_matches_two_passes(rows, n, bucket, bits, nonfinite):
    """``HadamardCodec(MinMaxCodec)``'s decode-sum in one kernel (the sum rotated back in registers) gives the torch
    reference's two passes (sum, then ``hadamard_rows``) bit for bit, whatever the rows per loop step."""
    from composer_qsdp.quant import HadamardCodec

    inner = MinMaxCodec(bits=bits, bucket_size=bucket, rounding="nearest")
    codec = HadamardCodec(inner)
    x = _data(rows, n, torch.bfloat16, seed=n + bits, nonfinite=nonfinite)
    with backend("torch"):
        wire = codec.encode_rows(x)
        expected = codec.decode_sum(wire, n)
    with backend("triton"):
        assert_same_values(codec.decode_sum(wire, n), expected)
    fmt = inner.wire_format(codec.padded(n))
    for step in (1, 3):
        got = kernels.decode_sum(wire, bits, bucket, fmt, rotate=True, numel=n, rows_per_step=step)
        assert_same_values(got, expected)


@pytest.mark.parametrize("rounding,offset", [("nearest", 0), ("stochastic", 8), ("stochastic", 3)])
@pytest.mark.parametrize("rows,n,bucket,bits", ROTATED_SUM_CASES)
def test_rotated_encode_is_the_two_pass_hadamard_encode(rows, n, bucket, bits, rounding, offset):
    """``HadamardCodec(MinMaxCodec)``'s encode through the feedback kernel without a residual (the rows rotated in
    registers) gives the torch reference's two passes (an fp32 copy of the rotated rows, then the encode) bit for bit,
    the noise counters included."""
    from composer_qsdp.quant import HadamardCodec

    inner = MinMaxCodec(bits=bits, bucket_size=bucket, rounding=rounding)
    codec = HadamardCodec(inner)
    x = _data(rows, n, torch.bfloat16, seed=n + bits + offset, nonfinite=True)
    with backend("torch"):
        assert inner.encode_rows_rotated(x) is None
        expected = codec.encode_rows(x, seed=11, offset=offset)
    with backend("triton"):
        assert_same_wire(inner, inner.encode_rows_rotated(x, 11, offset), expected, codec.padded(n))
        assert_same_wire(inner, codec.encode_rows(x, seed=11, offset=offset), expected, codec.padded(n))


@pytest.mark.parametrize("divisor,dtype", [(2, torch.float32), (3, torch.bfloat16), (1, torch.bfloat16)])
@pytest.mark.parametrize("rows,n,bucket,bits", ROTATED_SUM_CASES[:2])
def test_rotated_decode_sum_averages_into_the_callers_buffer(rows, n, bucket, bits, divisor, dtype):
    """A reduce-scatter's rotated decode-sum into its output (``out=``, ``divisor=``): the kernel rotates back, then
    divides and rounds once into ``out`` in place, bit for bit the torch reference's sum, rotation, IEEE division
    and copy (which hold the fp32 sum and the quotient beside the codes)."""
    from composer_qsdp.quant import HadamardCodec

    codec = HadamardCodec(MinMaxCodec(bits=bits, bucket_size=bucket, rounding="nearest"))
    x = _data(rows, n, torch.bfloat16, seed=n + divisor, nonfinite=True)
    with backend("torch"):
        wire = codec.encode_rows(x)
        expected = codec.decode_sum(wire, n, out=torch.empty(n, dtype=dtype, device=x.device), divisor=divisor)
    with backend("triton"):
        out = torch.full((n,), 7.0, dtype=dtype, device=x.device)
        assert codec.decode_sum(wire, n, out=out, divisor=divisor) is out
        assert_same_values(out, expected)


def test_rotated_decode_sum_rejects_what_it_does_not_compute():
    inner = MinMaxCodec(bits=3, bucket_size=64, rounding="nearest")
    wire = inner.encode_rows(_data(2, 128, torch.float32, seed=1, nonfinite=False))
    fmt = inner.wire_format(128)
    with pytest.raises(ValueError, match="power-of-two bucket_size and 0 < numel <= 128; got bucket_size=64, numel=200"):
        kernels.decode_sum(wire, 3, 64, fmt, rotate=True, numel=200)
    with pytest.raises(ValueError, match="numel=100 differs"):
        kernels.decode_sum(wire, 3, 64, fmt, numel=100)
    with pytest.raises(ValueError, match="rows_per_step=0"):
        kernels.decode_sum(wire, 3, 64, fmt, rows_per_step=0)
