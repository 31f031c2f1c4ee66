"""Properties every registered codec must have, with and without the Hadamard pre-rotation.

Bounds are computed here in float64 from each codec's documented quantization step (independent of its
implementation): the error of one round trip is at most one step of the element's bucket (for ``learned``:
the gap of the bracketing levels times the bucket's range); with the rotation, the L2 norm of a bucket's
error is at most the L2 norm of the inner codec's per-element bounds on the rotated bucket.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from composer_qsdp.quant import Codec, codec_names, make_codec

# (name, options) for every registered codec, plus the non-default modes that change its behaviour.
# The 1-bit sign codec has no quantization step and one width: its properties are in test_sign.py.
VARIANTS = [(name, {}) for name in codec_names() if name != "sign"] + [("minmax", {"rounding": "nearest"})]
BITS = {"symmetric": (2, 3, 4, 8)}  # codecs not listed take 1..8; a representative subset is used
DEFAULT_BITS = (1, 3, 4, 8)
BUCKETS = (1, 64, 100)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Relative rounding of the final cast to the output dtype (half an ulp).
CAST_EPS = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def _cases(buckets=BUCKETS, dtypes=DTYPES, bits_subset=None):
    for (name, options), bucket, dtype, hadamard in itertools.product(VARIANTS, buckets, dtypes, (False, True)):
        if hadamard and bucket & (bucket - 1):
            continue
        for bits in BITS.get(name, DEFAULT_BITS):
            if bits_subset is None or bits in bits_subset:
                label = "-".join([name, *map(str, options.values()), f"b{bits}", f"B{bucket}", str(dtype)[6:]])
                label += "-had" if hadamard else ""
                yield pytest.param(name, options, bits, bucket, dtype, hadamard, id=label)


def _codec(name, options, bits, bucket, hadamard) -> Codec:
    return make_codec(name, bits=bits, bucket_size=bucket, hadamard=hadamard, **options)


def _sample(n: int, bucket: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Heavy-tailed values with a different scale and offset per bucket, rounded to ``dtype``."""
    gen = torch.Generator().manual_seed(seed)
    nb = -(-n // bucket)
    scale = torch.exp(torch.randn(nb, generator=gen)).repeat_interleave(bucket)[:n]
    shift = torch.randn(nb, generator=gen).repeat_interleave(bucket)[:n]
    tails = torch.randn(n, generator=gen) / torch.rand(n, generator=gen).clamp_min(0.05).sqrt()
    return (tails * scale + shift).to(dtype)


def _inner(codec: Codec) -> Codec:
    return codec.inner if hasattr(codec, "inner") else codec


def _element_bounds(codec: Codec, values: torch.Tensor) -> torch.Tensor:
    """Per-element error bound (float64) of the (non-rotating) ``codec`` on the 1-D ``values``."""
    bucket = codec.bucket_size
    n = values.numel()
    nb = -(-n // bucket)
    v = values.to(torch.float64)
    padded = torch.cat([v, v[-1:].expand(nb * bucket - n)]).view(nb, bucket)
    lo, hi = padded.amin(1), padded.amax(1)
    if codec.name == "symmetric":
        step = padded.abs().amax(1) / (2 ** (codec.bits - 1) - 1)
    elif codec.name == "learned":
        levels = codec.levels.to(torch.float64)
        rng = (hi - lo).repeat_interleave(bucket)[:n]
        z = ((v - lo.repeat_interleave(bucket)[:n]) / torch.where(rng > 0, rng, 1.0)).clamp(0, 1)
        gaps = torch.diff(levels)

        def gap_at(t: torch.Tensor) -> torch.Tensor:
            return gaps[(torch.searchsorted(levels, t, right=True) - 1).clamp(0, gaps.numel() - 1)]

        # Within fp32 rounding of a level the codec may bracket with either neighbouring interval.
        return torch.maximum(gap_at(z - 1e-6), gap_at(z + 1e-6)) * rng
    else:  # minmax, random_shift: the lattice step of the bucket's range
        step = (hi - lo) / (2**codec.bits - 1)
    return step.repeat_interleave(bucket)[:n]


def _sylvester(order: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < order:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / order**0.5


def _rotate64(x: torch.Tensor, bucket: int) -> torch.Tensor:
    nb = -(-x.numel() // bucket)
    padded = torch.nn.functional.pad(x.to(torch.float64), (0, nb * bucket - x.numel())).view(nb, bucket)
    return (padded @ _sylvester(bucket)).reshape(-1)


def _assert_within_bound(codec: Codec, x: torch.Tensor, decoded: torch.Tensor) -> None:
    """Round-trip error of ``x -> decoded`` within the codec's step bound (plus fp32 and cast rounding)."""
    x64, d64 = x.to(torch.float64), decoded.to(torch.float64)
    slack = 1e-5 * x64.abs().max() + CAST_EPS[decoded.dtype] * d64.abs() + 1e-30
    if codec is _inner(codec):
        bound = _element_bounds(codec, x) * (1 + 1e-5) + slack
        excess = (d64 - x64).abs() - bound
        assert excess.max() <= 0, f"error exceeds one step by {excess.max():.3g} at element {int(excess.argmax())}"
        return
    bucket = codec.bucket_size
    rotated = _rotate64(x, bucket)
    inner_bound = _element_bounds(codec.inner, rotated.to(torch.float32)).view(-1, bucket).norm(dim=1)
    err = torch.nn.functional.pad(d64 - x64, (0, rotated.numel() - x.numel())).view(-1, bucket).norm(dim=1)
    cast = torch.nn.functional.pad(slack, (0, rotated.numel() - x.numel())).view(-1, bucket).norm(dim=1)
    excess = err - (inner_bound * (1 + 1e-5) + cast + 1e-5 * rotated.abs().max())
    assert excess.max() <= 0, f"bucket L2 error exceeds the rotated bound by {excess.max():.3g}"


@pytest.mark.parametrize("name, options, bits, bucket, dtype, hadamard", list(_cases()))
def test_round_trip_error_within_one_step(name, options, bits, bucket, dtype, hadamard):
    codec = _codec(name, options, bits, bucket, hadamard)
    for n in (3 * bucket + 5, max(1, bucket // 2)):  # not a multiple of the bucket; a single partial bucket
        x = _sample(n, bucket, dtype, seed=n)
        wire = codec.encode(x, seed=11, offset=3)
        assert wire.dtype == torch.uint8 and wire.shape == (codec.wire_bytes(n),)
        decoded = codec.decode(wire, n, dtype)
        assert decoded.dtype == dtype and decoded.shape == (n,)
        _assert_within_bound(codec, x, decoded)


def _variant_params(stochastic: bool | None):
    for (name, options), hadamard in itertools.product(VARIANTS, (False, True)):
        probe = make_codec(name, bits=4, bucket_size=64, **options)
        if stochastic is None or probe.unbiased == stochastic:
            label = "-".join([name, *map(str, options.values())]) + ("-had" if hadamard else "")
            yield pytest.param(name, options, hadamard, id=label)


@pytest.mark.parametrize("bits", (2, 4))
@pytest.mark.parametrize("name, options, hadamard", list(_variant_params(stochastic=True)))
def test_stochastic_codecs_are_unbiased(name, options, hadamard, bits):
    codec = _codec(name, options, bits, 64, hadamard)
    n, seeds = 150, 400
    x = _sample(n, 64, torch.float32, seed=5)
    mean = torch.zeros(n, dtype=torch.float64)
    for seed in range(seeds):
        mean += codec.decode(codec.encode(x, seed=1000 + seed), n).to(torch.float64)
    mean /= seeds
    # Each error lies within one step s of its bucket, so its standard deviation is at most s / 2 and that of
    # the mean s / (2 sqrt(seeds)); allow 5 of those.
    if hadamard:
        rotated = _rotate64(x, 64)
        steps = _element_bounds(codec.inner, rotated.to(torch.float32)).view(-1, 64).amax(dim=1)
        sigma = (steps / (2 * seeds**0.5)).repeat_interleave(64)[:n]
    else:
        sigma = _element_bounds(codec, x) / (2 * seeds**0.5)
    deviation = (mean - x.to(torch.float64)).abs()
    worst = (deviation / sigma).max()
    assert (deviation <= 5 * sigma + 1e-6 * x.abs().max()).all(), f"max deviation / sigma = {worst:.2f}"
    # The average signed error over all elements is far tighter than any single element's.
    z = ((mean - x.to(torch.float64)) / sigma).mean() * n**0.5
    assert abs(z) < 5, f"mean normalized error {z:.2f} sigma"


@pytest.mark.parametrize("name, options, hadamard", list(_variant_params(stochastic=None)))
def test_seed_determinism(name, options, hadamard):
    x = _sample(300, 64, torch.float32, seed=2)
    codec = _codec(name, options, 4, 64, hadamard)
    first = codec.encode(x, seed=7, offset=2)
    assert torch.equal(first, codec.encode(x, seed=7, offset=2))
    # A fresh codec gives the same wire: the encoding is a function of (x, seed, offset).
    assert torch.equal(first, _codec(name, options, 4, 64, hadamard).encode(x, seed=7, offset=2))
    other_seed = codec.encode(x, seed=8, offset=2)
    other_offset = codec.encode(x, seed=7, offset=3)
    if codec.unbiased:
        assert not torch.equal(first, other_seed) and not torch.equal(first, other_offset)
    else:
        assert torch.equal(first, other_seed) and torch.equal(first, other_offset)


@pytest.mark.parametrize("n", (1, 63, 64, 65, 1000))
@pytest.mark.parametrize("name, options, hadamard", list(_variant_params(stochastic=None)))
def test_wire_bytes_is_exact(name, options, hadamard, n):
    codec = _codec(name, options, 3, 64, hadamard)
    wire = codec.encode(torch.randn(n), seed=1)
    assert wire.dim() == 1 and wire.dtype == torch.uint8 and wire.numel() == codec.wire_bytes(n)
    rows = codec.encode_rows(torch.randn(2, n), seed=1)
    assert rows.shape == (2, codec.wire_bytes(n))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, options, hadamard", list(_variant_params(stochastic=None)))
def test_row_methods_equal_their_per_row_definitions(name, options, hadamard, dtype):
    rows, n, offset, seed = 3, 200, 17, 99
    codec = _codec(name, options, 4, 64, hadamard)
    x = torch.stack([_sample(n, 64, dtype, seed=r) for r in range(rows)])
    wire = codec.encode_rows(x, seed=seed, offset=offset)
    for r in range(rows):
        assert torch.equal(wire[r], codec.encode(x[r], seed=seed, offset=offset + r * n))
    decoded = codec.decode_rows(wire, n, dtype)
    expected = torch.stack([codec.decode(wire[r], n, dtype) for r in range(rows)])
    assert decoded.dtype == dtype and torch.equal(decoded, expected)
    # Into rows of a wider buffer (a collective's output), leaving its other columns alone.
    buffer = torch.full((rows, n + 5), 7.0, dtype=dtype)
    assert codec.decode_rows(wire, n, dtype, out=buffer[:, :n]).data_ptr() == buffer.data_ptr()
    assert torch.equal(buffer[:, :n], expected) and bool((buffer[:, n:] == 7).all())
    for bad in (torch.empty(rows, n + 1, dtype=dtype), torch.empty(rows, n, dtype=torch.float64),
                torch.empty(n, rows, dtype=dtype).t()):
        with pytest.raises(ValueError, match="out must be"):
            codec.decode_rows(wire, n, dtype, out=bad)

    total = codec.decode_sum(wire, n)
    acc = torch.zeros(n, dtype=torch.float32)
    for r in range(rows):
        acc += codec.decode(wire[r], n, torch.float32)
    assert total.dtype == torch.float32 and total.shape == (n,)
    if hadamard:  # rotates back once after summing: the same sum up to fp32 rounding
        torch.testing.assert_close(total, acc, rtol=1e-5, atol=1e-5 * acc.abs().max().item())
    else:
        assert torch.equal(total, acc)
    # An average rounded into an output buffer: the fp32 sum divided in fp32, then one rounding to its dtype.
    third = total / torch.full_like(total, 3)  # one IEEE division per element on every device
    assert torch.equal(codec.decode_sum(wire, n, divisor=3), third)
    out = torch.empty(n, dtype=dtype)
    assert codec.decode_sum(wire, n, out=out, divisor=3) is out and torch.equal(out, third.to(dtype))
    for bad, match in (({"divisor": 0}, "divisor=0"), ({"out": torch.empty(n + 1)}, "out must be"),
                       ({"out": torch.empty(2 * n)[::2]}, "out must be contiguous")):
        with pytest.raises(ValueError, match=match):
            codec.decode_sum(wire, n, **bad)


@pytest.mark.parametrize("bad", (float("nan"), float("inf"), -float("inf")))
@pytest.mark.parametrize("name, options, hadamard", list(_variant_params(stochastic=None)))
def test_non_finite_input_decodes_non_finite(name, options, hadamard, bad):
    codec = _codec(name, options, 4, 64, hadamard)
    x = _sample(200, 64, torch.float32, seed=3)
    x[70] = bad  # bucket 1 of 0..3
    decoded = codec.decode(codec.encode(x, seed=4), 200)
    assert not torch.isfinite(decoded[64:128]).any(), "a bucket holding a NaN/Inf decoded to finite values"
    others = torch.cat([decoded[:64], decoded[128:]])
    assert torch.isfinite(others).all(), "a NaN/Inf leaked into other buckets"


def _largest_allocation(fn) -> int:
    """Bytes of the largest single CPU allocation made while ``fn`` runs (the profiler's per-op memory events)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max((event.self_cpu_memory_usage for event in prof.events()), default=0)


@pytest.mark.filterwarnings("ignore:.*Profiler clears events:UserWarning")
@pytest.mark.parametrize("name, options", VARIANTS)
def test_a_tensor_smaller_than_one_bucket_costs_memory_for_its_own_size(name, options):
    """The references used to pad a row's partial bucket and its noise to the whole bucket: 2 x 64 MiB to encode
    2 x 100 elements in buckets of 2**24. The wire of a single partial bucket does not depend on bucket_size, so
    a codec whose bucket is exactly the row gives the expected wire (given the same levels, for learned levels,
    whose fit samples the rows padded to whole buckets)."""
    codec = make_codec(name, bits=3, bucket_size=2**24, **options)
    small = make_codec(name, bits=3, bucket_size=100, **options)
    x = _sample(200, 100, torch.float32).view(2, 100)
    wire = codec.encode_rows(x, seed=9, offset=4)
    limit = 64 * 1024  # bytes; the inputs are 800
    assert _largest_allocation(lambda: codec.encode_rows(x, seed=9, offset=4)) < limit
    assert _largest_allocation(lambda: codec.decode_rows(wire, 100)) < limit
    assert _largest_allocation(lambda: codec.decode_sum(wire, 100)) < limit
    if name == "learned":
        small.set_levels(codec.levels)
    assert torch.equal(wire, small.encode_rows(x, seed=9, offset=4))
    decoded = codec.decode_rows(wire, 100)
    assert torch.equal(decoded, small.decode_rows(wire, 100))
    assert torch.equal(codec.decode_sum(wire, 100), small.decode_sum(wire, 100))
    _assert_within_bound(small, x[0], decoded[0])
