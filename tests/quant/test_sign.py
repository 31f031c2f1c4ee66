"""The 1-bit sign codec against a float64 reference of its definition, its exact wire size and bit order, and its
handling of zeros, partial buckets and non-finite values."""

from __future__ import annotations

import pytest
import torch

from zero_one_reference import sign_compress

from composer_qsdp.quant import make_codec


def _reference(x: torch.Tensor, bucket: int) -> torch.Tensor:
    """float64 ``||x_b||_2 / sqrt(d_b) * sign(x)`` per bucket ``b`` of ``d_b`` elements, ``sign(0) = +1``."""
    return sign_compress(x.to(torch.float64), bucket)


def _sample(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    # A different magnitude per 64 elements, so the buckets' scales differ.
    scales = torch.exp(2 * torch.randn(-(-n // 64), generator=gen)).repeat_interleave(64)[:n]
    return torch.randn(n, generator=gen) * scales


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.float16))
@pytest.mark.parametrize("n, bucket", ((1000, 64), (64, 64), (5, 64), (777, 100), (2049, 2048), (33, 1)))
def test_decode_equals_the_float64_definition(n, bucket, dtype):
    codec = make_codec("sign", bucket_size=bucket)
    x = _sample(n, seed=n + bucket).to(dtype)
    decoded = codec.decode(codec.encode(x), n)
    torch.testing.assert_close(decoded.to(torch.float64), _reference(x, bucket), rtol=2e-6, atol=0)
    out = codec.decode(codec.encode(x), n, dtype)
    assert out.dtype == dtype


def test_bucket_norms_are_preserved_and_signs_kept():
    codec = make_codec("sign", bucket_size=128)
    x = _sample(1000, seed=3)
    decoded = codec.decode(codec.encode(x), 1000)
    assert torch.equal(decoded >= 0, x >= 0)
    for start in range(0, 1000, 128):
        torch.testing.assert_close(decoded[start : start + 128].norm(), x[start : start + 128].norm(), rtol=1e-6,
                                   atol=0)


def test_zeros_map_to_plus_one():
    codec = make_codec("sign", bucket_size=8)
    x = torch.tensor([0.0, -0.0, 3.0, -4.0, 0.0, 0.0, 0.0, 0.0])
    decoded = codec.decode(codec.encode(x), 8)
    scale = 5.0 / 8**0.5
    assert decoded.tolist() == pytest.approx([scale, scale, scale, -scale, scale, scale, scale, scale])
    # An all-zero bucket has scale 0 and decodes to exact zeros (error feedback then adds nothing to it).
    assert torch.equal(codec.decode(codec.encode(torch.zeros(20)), 20), torch.zeros(20))


@pytest.mark.parametrize("n, bucket", ((1, 64), (63, 64), (64, 64), (65, 64), (1000, 64), (100, 12), (9, 3)))
def test_wire_size_and_bit_order(n, bucket):
    codec = make_codec("sign", bucket_size=bucket)
    nb = -(-n // bucket)
    last = n - (nb - 1) * bucket
    code_bytes = (nb - 1) * -(-bucket // 8) + -(-last // 8)
    assert codec.wire_bytes(n) == -(-code_bytes // 4) * 4 + 4 * nb
    x = _sample(n, seed=n)
    wire = codec.encode(x)
    assert wire.shape == (codec.wire_bytes(n),)
    # Bit j of bucket b's little-endian bit stream is element b * bucket + j being >= 0.
    for b in range(nb):
        start = b * -(-bucket // 8)
        for j in range(min(bucket, n - b * bucket)):
            bit = (int(wire[start + j // 8]) >> (j % 8)) & 1
            assert bit == int(x[b * bucket + j] >= 0)
    meta_offset = -(-code_bytes // 4) * 4
    scales = wire[meta_offset:].view(torch.float32)
    torch.testing.assert_close(scales, torch.stack([x[s : s + bucket].norm() / len(x[s : s + bucket]) ** 0.5
                                                    for s in range(0, n, bucket)]), rtol=1e-6, atol=0)


def test_rows_equal_their_per_row_definitions_and_decode_sum_adds_in_order():
    codec = make_codec("sign", bucket_size=64)
    x = torch.stack([_sample(200, seed=r) for r in range(3)])
    wire = codec.encode_rows(x)
    for r in range(3):
        assert torch.equal(wire[r], codec.encode(x[r]))
    decoded = codec.decode_rows(wire, 200)
    acc = torch.zeros(200)
    for r in range(3):
        acc += decoded[r]
    assert torch.equal(codec.decode_sum(wire, 200), acc)


def test_deterministic_and_biased():
    codec = make_codec("sign", bucket_size=64)
    x = _sample(300, seed=1)
    assert torch.equal(codec.encode(x, seed=1), codec.encode(x, seed=2, offset=5))
    assert not codec.unbiased


@pytest.mark.parametrize("bad", (float("nan"), float("inf"), -float("inf")))
def test_non_finite_input_decodes_non_finite_in_its_bucket_only(bad):
    codec = make_codec("sign", bucket_size=64)
    x = _sample(200, seed=4)
    x[70] = bad
    decoded = codec.decode(codec.encode(x), 200)
    assert not torch.isfinite(decoded[64:128]).any()
    assert torch.isfinite(torch.cat([decoded[:64], decoded[128:]])).all()


@pytest.mark.parametrize("options, match", (({"bits": 2}, "bits=2"), ({"bucket_size": 0}, "bucket_size=0"),
                                            ({"rounding": "nearest"}, "invalid option for codec 'sign'")))
def test_bad_options_are_named(options, match):
    with pytest.raises(ValueError, match=match):
        make_codec("sign", **options)
