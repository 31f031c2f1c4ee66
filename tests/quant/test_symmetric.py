"""SymmetricCodec (ZeRO++ qwZ / SDP4Bit): abs-max scale per block, round to nearest on ±(2**(b-1) - 1) levels."""

import pytest
import torch

from composer_qsdp.quant import SymmetricCodec, make_codec
from composer_qsdp.quant.packing import unpack_codes


def _x(n: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=gen) * torch.exp(torch.randn(n, generator=gen))


def _scales(codec: SymmetricCodec, wire: torch.Tensor, numel: int) -> torch.Tensor:
    """The per-bucket fp32 scales stored at the end of the wire."""
    return wire[-4 * codec.num_buckets(numel) :].clone().view(torch.float32)


@pytest.mark.parametrize("bits", (2, 4, 5, 8))
@pytest.mark.parametrize("bucket", (32, 100))
def test_codes_are_nearest_levels_of_a_float64_reference(bits, bucket):
    codec = SymmetricCodec(bits, bucket)
    qmax = 2 ** (bits - 1) - 1
    n = 5 * bucket + 7
    x = _x(n)
    decoded = codec.decode(codec.encode(x), n).to(torch.float64)

    x64 = x.to(torch.float64)
    nb = codec.num_buckets(n)
    absmax = torch.nn.functional.pad(x64.abs(), (0, nb * bucket - n)).view(nb, bucket).amax(1)
    absmax = absmax.repeat_interleave(bucket)[:n]
    v = x64 / absmax * qmax
    level = torch.round(v)
    near_tie = ((v - v.floor()) - 0.5).abs() < 1e-4  # fp32 and float64 may round these either way
    step = absmax / qmax
    assert torch.equal(torch.round(decoded / step)[~near_tie], level[~near_tie])
    assert ((decoded - x64).abs() <= step * (0.5 + 1e-5)).all(), "error above half a step"


def test_grid_is_symmetric_with_exact_zero_and_unclipped_absmax():
    codec = SymmetricCodec(4, 64)
    x = _x(640, seed=1)
    x[::64] = 0.0
    pos = codec.decode(codec.encode(x), x.numel())
    neg = codec.decode(codec.encode(-x), x.numel())
    assert torch.equal(neg, -pos)
    assert (pos[::64] == 0).all()
    # The element of largest magnitude is itself a level: it comes back to fp32 rounding (no clipping).
    buckets = x.view(-1, 64)
    at = buckets.abs().argmax(1)
    peaks = buckets.gather(1, at[:, None])
    torch.testing.assert_close(pos.view(-1, 64).gather(1, at[:, None]), peaks, rtol=2**-22, atol=0)


@pytest.mark.parametrize("bits", (2, 3, 4, 8))
def test_codes_are_offset_binary_and_never_use_the_top_code(bits):
    codec = SymmetricCodec(bits, 128)
    x = _x(128 * 20, seed=2)
    wire = codec.encode(x)
    codes = unpack_codes(wire[: codec.wire_format(x.numel()).code_bytes].view(20, -1), bits, 128)
    qmax = 2 ** (bits - 1) - 1
    assert codes.max() == 2 * qmax and codes.min() == 0  # both ±absmax levels are reached
    assert not (codes == 2**bits - 1).any()
    levels = codes.to(torch.int32) - qmax
    expected = levels.to(torch.float32) * _scales(codec, wire, x.numel())[:, None]
    torch.testing.assert_close(codec.decode(wire, x.numel()).view(20, 128), expected, rtol=0, atol=0)


def test_wire_is_bits_plus_one_fp32_scale_per_bucket():
    for bits, bucket in ((8, 2048), (4, 2048), (4, 128)):
        codec = SymmetricCodec(bits, bucket)
        n = 16 * bucket
        assert codec.wire_bytes(n) * 8 == n * bits + 32 * 16
        x = _x(n, seed=3).view(16, bucket)
        scales = _scales(codec, codec.encode(x), n)
        torch.testing.assert_close(scales, x.abs().amax(1) / (2 ** (bits - 1) - 1), rtol=0, atol=0)


def test_zero_bucket_decodes_to_zeros_and_nonfinite_buckets_to_nan():
    codec = SymmetricCodec(8, 16)
    x = _x(64, seed=4)
    x[:16] = 0.0
    x[20] = float("inf")
    x[40] = float("nan")
    decoded = codec.decode(codec.encode(x), 64)
    assert torch.equal(decoded[:16], torch.zeros(16))
    assert decoded[16:48].isnan().all()
    assert torch.isfinite(decoded[48:]).all()


def test_seed_is_ignored_and_codec_is_biased():
    codec = make_codec("symmetric", bits=4, bucket_size=64)
    x = _x(256, seed=5)
    assert torch.equal(codec.encode(x, seed=1), codec.encode(x, seed=2, offset=5))
    assert codec.unbiased is False


@pytest.mark.parametrize("bits", (1, 9, 0, 4.0, "8"))
def test_rejects_bits_outside_2_to_8(bits):
    with pytest.raises(ValueError, match=r"bits=.*allowed: integers 2\.\.8"):
        make_codec("symmetric", bits=bits, bucket_size=64)


@pytest.mark.parametrize("bucket", (0, -4, 2.5))
def test_rejects_bad_bucket_size(bucket):
    with pytest.raises(ValueError, match="bucket_size="):
        SymmetricCodec(8, bucket)


def test_rejects_unknown_option():
    with pytest.raises(ValueError, match="invalid option for codec 'symmetric'"):
        make_codec("symmetric", bits=8, bucket_size=64, rounding="stochastic")
