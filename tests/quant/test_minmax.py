"""Min-max codec (torch reference): error bounds, unbiasedness, wire format, batched paths, bad input."""

import math

import pytest
import torch

from composer_qsdp.kernels.fixed_point import fraction_bits
from composer_qsdp.quant import MinMaxCodec, make_codec
from composer_qsdp.quant.minmax import stochastic_round

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _rand(n: int, dtype: torch.dtype, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=gen, dtype=torch.float64) * scale).to(dtype)


def _bucket_stats(x: torch.Tensor, bucket: int, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-element (bucket min, bucket step) in float64 from the valid elements only."""
    x64 = x.to(torch.float64)
    lo = torch.empty_like(x64)
    step = torch.empty_like(x64)
    for start in range(0, x64.numel(), bucket):
        chunk = x64[start : start + bucket]
        lo[start : start + bucket] = chunk.min()
        step[start : start + bucket] = (chunk.max() - chunk.min()) / levels
    return lo, step


def _meta(codec: MinMaxCodec, wire: torch.Tensor, n: int) -> torch.Tensor:
    fmt = codec.wire_format(n)
    return wire[fmt.meta_offset :].clone().view(torch.float32).view(-1, 2)


CASES = [  # (numel, bucket_size, bits)
    (1, 1, 8),
    (7, 3, 1),
    (1000, 64, 2),
    (1037, 100, 3),
    (4096, 1024, 4),
    (2500, 1024, 5),
    (333, 17, 6),
    (640, 128, 7),
    (3001, 512, 8),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rounding", ["stochastic", "nearest"])
@pytest.mark.parametrize("numel,bucket,bits", CASES)
def test_round_trip_error_bound(numel, bucket, bits, rounding, dtype):
    codec = make_codec("minmax", bits=bits, bucket_size=bucket, rounding=rounding)
    x = _rand(numel, dtype, seed=numel + bits, scale=3.0)
    wire = codec.encode(x, seed=11, offset=5)
    assert wire.dtype == torch.uint8 and wire.shape == (codec.wire_bytes(numel),)
    y = codec.decode(wire, numel, torch.float32)
    lo, step = _bucket_stats(x, bucket, codec.levels)
    # Position on the bucket's grid: stochastic lands on a neighbouring level, nearest on the closest one.
    # Slack: a few fp32 roundings of values of size |min| + |max|.
    slack = 4 * 2**-24 * (lo.abs() + step * codec.levels + x.double().abs())
    err = (y.double() - x.double()).abs()
    bound = step if rounding == "stochastic" else step / 2
    assert bool((err <= bound + slack).all()), f"max excess {(err - bound - slack).max().item()}"
    # Output dtype is the fp32 decode rounded once.
    assert torch.equal(codec.decode(wire, numel, dtype), y.to(dtype))


@pytest.mark.parametrize("numel,bucket", [(1037, 100), (64, 64), (5, 1024)])
def test_metadata_is_exact_min_and_scale_of_valid_elements(numel, bucket):
    codec = MinMaxCodec(bits=4, bucket_size=bucket)
    # Large positive values: a partial bucket padded with zeros would report min 0.
    x = _rand(numel, torch.float32, seed=1).abs() + 10.0
    meta = _meta(codec, codec.encode(x, seed=1), numel)
    lo, step = _bucket_stats(x, bucket, codec.levels)
    starts = torch.arange(0, numel, bucket)
    assert torch.equal(meta[:, 0].double(), lo[starts])
    assert torch.allclose(meta[:, 1].double(), step[starts], rtol=2**-22, atol=0)


def test_nearest_rounding_hits_bucket_extremes():
    codec = MinMaxCodec(bits=3, bucket_size=50, rounding="nearest")
    x = _rand(200, torch.float32, seed=2)
    y = codec.decode(codec.encode(x), 200)
    for start in range(0, 200, 50):
        chunk, dec = x[start : start + 50], y[start : start + 50]
        assert dec[chunk.argmin()] == chunk.min()
        assert abs(dec[chunk.argmax()].item() - chunk.max().item()) <= 1e-6 * (1 + chunk.abs().max().item())


@pytest.mark.parametrize("bits", [1, 2, 8])
def test_stochastic_rounding_is_unbiased(bits):
    codec = MinMaxCodec(bits=bits, bucket_size=64)
    n, draws = 128, 3000
    x = _rand(n, torch.float32, seed=3)
    # Each row of encode_rows draws fresh noise (counters offset + r * n); a few seeds on top.
    decoded = torch.cat(
        [codec.decode_rows(codec.encode_rows(x.expand(draws // 3, n), seed=s), n).double() for s in (1, 2, 3)]
    )
    _, step = _bucket_stats(x, 64, codec.levels)
    # Each decoded value is lower-level + step * Bernoulli(p): std <= step / 2 per draw.
    sigma = step / 2 / math.sqrt(draws)
    mean_err = decoded.mean(0) - x.double()
    assert bool((mean_err.abs() <= 6 * sigma + 1e-6 * step).all())
    # Averaging the standardized errors over all elements exposes a small systematic bias.
    assert abs((mean_err / step).mean().item()) <= 6 * 0.5 / math.sqrt(draws * n)


@pytest.mark.parametrize("bits", [1, 2, 4, 7, 8])
def test_fixed_point_rounding_is_exactly_unbiased_on_its_grid(bits):
    # Over all 2**16 noise values, the mean code is t rounded half to even onto the 2**-F grid (a float64
    # computation), and every code is floor or ceil of it.
    f = fraction_bits(bits)
    gen = torch.Generator().manual_seed(bits)
    top = float(2**bits - 1)
    t = torch.cat([torch.rand(60, generator=gen) * top, torch.tensor([0.0, top, 0.5, top - 2.0**-f / 2, 1 / 3])])
    k = torch.arange(2**16)
    codes = stochastic_round(t.unsqueeze(1), k.unsqueeze(0), bits)
    t_f = torch.round(t.double() * 2**f) / 2**f
    assert torch.equal(codes.double().sum(1) / 2**16, t_f)
    assert bool(((codes == t_f.floor().long().unsqueeze(1)) | (codes == t_f.ceil().long().unsqueeze(1))).all())
    assert bool(((t_f - t.double()).abs() <= 2.0 ** -(f + 1)).all())


def test_nearest_is_deterministic_and_biased_where_stochastic_is_not():
    x = torch.full((64,), 0.3)
    x[0], x[1] = 0.0, 1.0
    nearest = MinMaxCodec(bits=1, bucket_size=64, rounding="nearest")
    assert torch.equal(nearest.encode(x, seed=1), nearest.encode(x, seed=2))
    assert nearest.decode(nearest.encode(x), 64)[2].item() == 0.0  # 0.3 rounds to level 0: bias 0.3
    stochastic = MinMaxCodec(bits=1, bucket_size=64)
    mean = stochastic.decode_rows(stochastic.encode_rows(x.expand(4000, 64)), 64)[:, 2:].double().mean()
    assert abs(mean.item() - 0.3) < 6 * 0.5 / math.sqrt(4000 * 62)


def test_seed_and_offset_determinism():
    codec = MinMaxCodec(bits=4, bucket_size=128)
    x = _rand(1000, torch.bfloat16, seed=4)
    assert torch.equal(codec.encode(x, seed=7, offset=3), codec.encode(x.clone(), seed=7, offset=3))
    assert not torch.equal(codec.encode(x, seed=7), codec.encode(x, seed=8))
    assert not torch.equal(codec.encode(x, seed=7, offset=0), codec.encode(x, seed=7, offset=1))


@pytest.mark.parametrize("offset", [0, 3, 2**32 - 100, 2**45 + 7])
def test_noise_is_tied_to_counters(offset):
    # Encoding a bucket-aligned suffix at offset + k reproduces the suffix's buckets of the whole encode.
    codec = MinMaxCodec(bits=2, bucket_size=64)
    x = _rand(640, torch.float32, seed=5)
    whole, part = codec.encode(x, seed=9, offset=offset), codec.encode(x[192:], seed=9, offset=offset + 192)
    bpb = codec.wire_format(640).bucket_bytes
    assert torch.equal(whole[3 * bpb : codec.wire_format(640).code_bytes], part[: codec.wire_format(448).code_bytes])


@pytest.mark.parametrize("numel,bucket,bits", [(1, 1, 1), (1037, 100, 3), (4096, 1024, 4), (10, 1024, 8), (99, 10, 5)])
def test_wire_size_and_alignment(numel, bucket, bits):
    codec = MinMaxCodec(bits=bits, bucket_size=bucket)
    nb = math.ceil(numel / bucket)
    last = numel - (nb - 1) * bucket
    code_bytes = (nb - 1) * math.ceil(bucket * bits / 8) + math.ceil(last * bits / 8)
    expected = 4 * math.ceil(code_bytes / 4) + 8 * nb
    assert codec.wire_bytes(numel) == expected
    fmt = codec.wire_format(numel)
    assert fmt.meta_offset % 4 == 0 and fmt.wire_bytes % 4 == 0
    wire = codec.encode(_rand(numel, torch.float16), seed=1)
    assert wire.numel() == expected
    assert not wire[fmt.code_bytes : fmt.meta_offset].any()  # padding is zero


@pytest.mark.parametrize("rounding", ["stochastic", "nearest"])
@pytest.mark.parametrize("rows,n,bucket,bits", [(3, 1000, 128, 4), (4, 37, 16, 8), (2, 130, 64, 3), (5, 1, 4, 2)])
def test_rows_paths_equal_per_row_definitions(rows, n, bucket, bits, rounding):
    codec = MinMaxCodec(bits=bits, bucket_size=bucket, rounding=rounding)
    x = _rand(rows * n, torch.bfloat16, seed=rows).view(rows, n)
    wire = codec.encode_rows(x, seed=21, offset=6)
    assert wire.shape == (rows, codec.wire_bytes(n))
    for r in range(rows):
        assert torch.equal(wire[r], codec.encode(x[r], seed=21, offset=6 + r * n))
    decoded = codec.decode_rows(wire, n, torch.float16)
    acc = torch.zeros(n, dtype=torch.float32)
    for r in range(rows):
        assert torch.equal(decoded[r], codec.decode(wire[r], n, torch.float16))
        acc += codec.decode(wire[r], n, torch.float32)
    total = codec.decode_sum(wire, n)
    assert total.dtype == torch.float32 and torch.equal(total, acc)
    assert torch.allclose(total.double(), codec.decode_rows(wire, n).double().sum(0), rtol=1e-6, atol=1e-6)


def test_decode_accepts_unaligned_wire_views():
    codec = MinMaxCodec(bits=4, bucket_size=32)
    x = _rand(100, torch.float32, seed=6)
    wire = codec.encode(x, seed=2)
    shifted = torch.cat([torch.zeros(1, dtype=torch.uint8), wire])[1:]  # data pointer off by one byte
    assert torch.equal(codec.decode(shifted, 100), codec.decode(wire, 100))


@pytest.mark.parametrize("bits", [1, 4, 8])
def test_constant_buckets_decode_exactly(bits):
    codec = MinMaxCodec(bits=bits, bucket_size=16)
    x = torch.cat([torch.full((16,), -2.75), torch.full((16,), 1e-30), torch.full((5,), 3.0e38)])
    for rounding in ("stochastic", "nearest"):
        codec.rounding = rounding
        assert torch.equal(codec.decode(codec.encode(x, seed=3), x.numel()), x)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("dtype", DTYPES)
def test_non_finite_bucket_decodes_to_nan(bad, dtype):
    codec = MinMaxCodec(bits=4, bucket_size=32)
    x = _rand(100, dtype, seed=7)
    x[40] = bad
    y = codec.decode(codec.encode(x, seed=1), 100, dtype)
    assert bool(y[32:64].isnan().all())
    finite = torch.cat([y[:32], y[64:]])
    assert bool(torch.isfinite(finite).all())
    rows = codec.decode_sum(codec.encode_rows(x.view(1, 100).expand(2, 100)), 100)
    assert bool(rows[32:64].isnan().all()) and bool(torch.isfinite(rows[64:]).all())


def test_range_overflow_decodes_to_nan():
    codec = MinMaxCodec(bits=8, bucket_size=4)
    x = torch.tensor([-3.0e38, 3.0e38, 0.0, 1.0, 1.0, 2.0, 3.0, 4.0])
    y = codec.decode(codec.encode(x), 8)
    assert bool(y[:4].isnan().all()) and bool(torch.isfinite(y[4:]).all())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"bits": 0}, "bits=0"),
        ({"bits": 9}, "bits=9"),
        ({"bits": 4.0}, "bits=4.0"),
        ({"bucket_size": 0}, "bucket_size=0"),
        ({"rounding": "floor"}, r"rounding='floor'.*stochastic, nearest"),
    ],
)
def test_bad_configuration_raises(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_codec("minmax", **kwargs)


def test_bad_calls_raise():
    codec = MinMaxCodec(bits=4, bucket_size=32)
    with pytest.raises(ValueError, match="int64"):
        codec.encode(torch.arange(10))
    with pytest.raises(ValueError, match="empty"):
        codec.encode(torch.zeros(0))
    wire = codec.encode(torch.randn(50))
    with pytest.raises(ValueError, match="bytes"):
        codec.decode(wire[:-1], 50)
    with pytest.raises(ValueError, match="bytes"):
        codec.decode(wire, 70)
    with pytest.raises(ValueError, match="dtype"):
        codec.decode(wire, 50, torch.int32)
    with pytest.raises(ValueError, match="2-D"):
        codec.encode_rows(torch.randn(10))
    with pytest.raises(ValueError, match="per row"):
        codec.decode_sum(wire.view(1, -1)[:, :-4], 50)
    with pytest.raises(ValueError, match="seed"):
        codec.encode(torch.randn(5), seed=-1)
    # A codec's seed is a noise key (validate.NOISE_KEY_BITS): the kernels' int64.
    codec.encode(torch.randn(5), seed=2**63 - 1)
    with pytest.raises(ValueError, match=r"^seed=9223372036854775808 is invalid; .* integer in \[0, 2\*\*63\)"):
        codec.encode(torch.randn(5), seed=2**63)


def test_registry_and_repr():
    codec = make_codec("minmax", bits=2, bucket_size=256, rounding="nearest")
    assert isinstance(codec, MinMaxCodec) and not codec.unbiased
    assert repr(codec) == "MinMaxCodec(bits=2, bucket_size=256, rounding='nearest')"
    assert make_codec("minmax").unbiased
