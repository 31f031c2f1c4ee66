"""RandomShiftCodec: nearest rounding onto the bucket's lattice shifted by one uniform random offset."""

import pytest
import torch

from composer_qsdp.quant import RandomShiftCodec, make_codec
from composer_qsdp.quant.philox import rounding_noise


def _x(n: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=gen) * 3 + 1


def _meta(codec: RandomShiftCodec, wire: torch.Tensor, numel: int) -> torch.Tensor:
    """``[nb, 2]`` (origin, step) pairs stored at the end of the wire."""
    nb = codec.num_buckets(numel)
    return wire[-8 * nb :].clone().view(torch.float32).view(nb, 2)


@pytest.mark.parametrize("bits", (1, 3, 8))
def test_decoded_values_lie_on_one_shifted_lattice_per_bucket_within_half_a_step(bits):
    codec = RandomShiftCodec(bits, 100)
    n = 950
    x = _x(n)
    wire = codec.encode(x, seed=3, offset=10)
    decoded = codec.decode(wire, n).to(torch.float64)
    x64 = x.to(torch.float64)
    meta = _meta(codec, wire, n).to(torch.float64)
    xb = torch.nn.functional.pad(x64, (0, 1000 - n), value=float(x64[-1])).view(10, 100)
    step = (xb.amax(1) - xb.amin(1)) / (2**bits - 1)
    torch.testing.assert_close(meta[:, 1], step, rtol=1e-6, atol=0)
    # Every decoded value is origin + k * step for an integer code k in [0, 2**bits - 1].
    k = (decoded - meta[:, 0].repeat_interleave(100)[:n]) / step.repeat_interleave(100)[:n]
    assert ((k - k.round()).abs() < 1e-3).all()
    assert k.round().min() >= 0 and k.round().max() <= 2**bits - 1
    # Nearest lattice point: at most half a step away.
    assert ((decoded - x64).abs() <= step.repeat_interleave(100)[:n] * (0.5 + 1e-5)).all()


def test_shift_is_the_philox_noise_at_each_buckets_first_counter():
    codec = RandomShiftCodec(4, 64)
    n, seed, offset = 64 * 6, 77, 1000
    x = _x(n, seed=1)
    meta = _meta(codec, codec.encode(x, seed=seed, offset=offset), n).to(torch.float64)
    lo = x.view(6, 64).amin(1).to(torch.float64)
    shift = 0.5 - (meta[:, 0] - lo) / meta[:, 1]  # origin = lo + (1/2 - u) * step
    expected = rounding_noise(seed, offset + torch.arange(6) * 64).to(torch.float64)
    torch.testing.assert_close(shift, expected, rtol=0, atol=1e-4)


def test_error_is_uniform_on_half_a_step_whatever_the_value():
    """Over the shift, the error of ANY value is uniform on [-step/2, step/2]: mean 0, variance step**2 / 12.

    Min-max stochastic rounding fails this for values on its grid (variance 0) and midway (variance step**2/4).
    """
    codec = RandomShiftCodec(2, 8)
    # Range [0, 3] gives step 1: values on the unshifted grid, a quarter off it, and midway.
    x = torch.tensor([0.0, 3.0, 1.0, 2.0, 1.25, 0.5, 2.5, 1.75])
    draws = 20000  # rows of one encode_rows call: row r's shift is drawn at its own counter
    wire = codec.encode_rows(x.expand(draws, 8), seed=5)
    errors = (codec.decode_rows(wire, 8) - x).to(torch.float64)
    assert errors.abs().max() <= 0.5 + 1e-6
    sigma_mean = (1 / 12 / draws) ** 0.5
    assert (errors.mean(0).abs() < 5 * sigma_mean).all()
    # The sample variance of a uniform on [-1/2, 1/2] has standard deviation sqrt(1/180/draws).
    assert ((errors.var(0) - 1 / 12).abs() < 5 * (1 / 180 / draws) ** 0.5).all()


def test_constant_bucket_is_exact_and_nonfinite_bucket_is_nan():
    codec = RandomShiftCodec(4, 16)
    x = _x(48, seed=2)
    x[:16] = 2.5
    x[30] = float("nan")
    decoded = codec.decode(codec.encode(x, seed=9), 48)
    assert torch.equal(decoded[:16], torch.full((16,), 2.5))
    assert decoded[16:32].isnan().all() and torch.isfinite(decoded[32:]).all()


def test_registered_and_unbiased():
    codec = make_codec("random_shift", bits=8, bucket_size=1024)
    assert isinstance(codec, RandomShiftCodec) and codec.unbiased
    assert codec.wire_bytes(4096) * 8 == 4096 * 8 + 64 * 4  # bits + two fp32 per bucket


@pytest.mark.parametrize("bits", (0, 9, 2.0))
def test_rejects_bits_outside_1_to_8(bits):
    with pytest.raises(ValueError, match=r"bits=.*allowed: integers 1\.\.8"):
        make_codec("random_shift", bits=bits, bucket_size=64)


def test_rejects_unknown_option():
    with pytest.raises(ValueError, match="invalid option for codec 'random_shift'"):
        make_codec("random_shift", bits=8, bucket_size=64, shift="fixed")


@pytest.mark.gpu
@pytest.mark.parametrize("bits", (2, 4, 8))
def test_cuda_wire_equals_the_cpu_wire(bits):
    # The bucket scale is one IEEE division on both devices (torch's CUDA `tensor / scalar` would be 1 ulp off).
    codec = RandomShiftCodec(bits, 1000)
    x = torch.randn(3, 4096, generator=torch.Generator().manual_seed(bits)) * torch.logspace(-3, 3, 4096)
    assert torch.equal(codec.encode_rows(x.cuda(), seed=5, offset=7).cpu(), codec.encode_rows(x, seed=5, offset=7))
