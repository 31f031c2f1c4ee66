"""The torch Philox stream equals Triton's ``tl.randint4x`` / ``tl.rand`` and a textbook Philox4x32-10; the rounding
stream (Philox4x32-7) is uniform, and its values are independent across elements, groups, calls and seeds."""

import pytest
import torch
import triton
import triton.language as tl

from composer_qsdp.kernels.philox_constants import NOISE_ROUNDS
from composer_qsdp.quant import philox

_MASK = 0xFFFFFFFF
SEEDS = [0, 1, 12345, 2**31 + 7, 2**40 + 3, 2**62 + 2**32 + 5, 2**63 - 1]
# The Triton comparison runs under the interpreter on CPU (CI) and compiled on a GPU machine.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _philox_python(seed: int, counter: int, rounds: int = 10) -> tuple[int, int, int, int]:
    """Philox4x32 on Python ints (Salmon et al. 2011), independent of the vectorized torch code."""
    c = [counter & _MASK, counter >> 32 & _MASK, 0, 0]
    k = [seed & _MASK, seed >> 32 & _MASK]
    for _ in range(rounds):
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k[0], p1 & _MASK, (p0 >> 32) ^ c[3] ^ k[1], p0 & _MASK]
        k = [(k[0] + 0x9E3779B9) & _MASK, (k[1] + 0xBB67AE85) & _MASK]
    return tuple(c)


@triton.jit
def _triton_stream_kernel(seed, offsets_ptr, words_ptr, uniform_ptr, n, BLOCK: tl.constexpr):
    idx = tl.arange(0, BLOCK)
    mask = idx < n
    offsets = tl.load(offsets_ptr + idx, mask=mask, other=0)
    w0, w1, w2, w3 = tl.randint4x(seed, offsets)
    tl.store(words_ptr + 4 * idx, w0.to(tl.int64) & 0xFFFFFFFF, mask=mask)
    tl.store(words_ptr + 4 * idx + 1, w1.to(tl.int64) & 0xFFFFFFFF, mask=mask)
    tl.store(words_ptr + 4 * idx + 2, w2.to(tl.int64) & 0xFFFFFFFF, mask=mask)
    tl.store(words_ptr + 4 * idx + 3, w3.to(tl.int64) & 0xFFFFFFFF, mask=mask)
    tl.store(uniform_ptr + idx, tl.rand(seed, offsets), mask=mask)


def _offsets() -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    edges = torch.tensor([2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40 + 5, 2**62 + 1])
    return torch.cat([torch.arange(0, 1500), torch.randint(0, 2**62, (500,), generator=gen), edges])


def test_known_answer_vector():
    # Random123's published Philox4x32-10 answer for counter 0 and key 0.
    words = [int(w) for w in philox.randint4x(0, torch.zeros(1, dtype=torch.int64))]
    assert words == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]


@pytest.mark.parametrize("seed", [0, 7, 2**33 + 11, 2**63 - 1])
def test_randint4x_matches_python_philox(seed):
    offsets = _offsets()[::37]
    words = torch.stack(philox.randint4x(seed, offsets), dim=1)
    expected = torch.tensor([_philox_python(seed, int(c)) for c in offsets], dtype=torch.int64)
    assert torch.equal(words, expected)


@pytest.mark.requires_triton_kernels
@pytest.mark.parametrize("seed", SEEDS)
def test_matches_triton_stream(seed):
    offsets = _offsets().to(DEVICE)
    n = offsets.numel()
    words = torch.zeros(n, 4, dtype=torch.int64, device=DEVICE)
    uniform = torch.zeros(n, dtype=torch.float32, device=DEVICE)
    _triton_stream_kernel[(1,)](seed, offsets, words, uniform, n, BLOCK=triton.next_power_of_2(n))
    assert torch.equal(torch.stack(philox.randint4x(seed, offsets), dim=1), words)
    assert torch.equal(philox.randint(seed, offsets), words[:, 0])
    assert torch.equal(philox.uniform(seed, offsets), uniform)


def test_uniform_range_and_int32_offsets():
    offsets = torch.arange(0, 20000, dtype=torch.int32)
    u = philox.uniform(5, offsets)
    assert u.dtype == torch.float32 and bool((u >= 0).all()) and bool((u < 1).all())
    assert torch.equal(u, philox.uniform(5, offsets.to(torch.int64)))
    # Mean of 20000 U[0,1) draws: standard error 0.29/sqrt(20000) = 0.002; 5 sigma.
    assert abs(u.mean().item() - 0.5) < 0.01


def test_rounding_stream_definition():
    # Counter c: half c % 2 of word (c // 2) % 4 of the 7-round Philox call c // 8, against Python-int Philox.
    counters = _offsets()[::7]
    bits = philox.rounding_bits(42, counters)
    expected = []
    for c in counters.tolist():
        word = _philox_python(42, c >> 3, rounds=NOISE_ROUNDS)[(c >> 1) & 3]
        expected.append(word >> 16 if c & 1 else word & 0xFFFF)
    assert NOISE_ROUNDS == 7 and bits.tolist() == expected
    noise = philox.rounding_noise(42, counters)
    assert torch.equal(noise.to(torch.float64), (bits.to(torch.float64) + 0.5) / 65536)
    assert bool((noise > 0).all()) and bool((noise < 1).all())


@pytest.mark.parametrize("start,count", [(0, 1), (0, 8), (3, 1), (5, 100), (2**32 - 3, 19), (2**45 + 1, 64)])
def test_rounding_noise_range_equals_pointwise(start, count):
    counters = torch.arange(start, start + count, dtype=torch.int64)
    assert torch.equal(philox.rounding_bits_range(9, start, count), philox.rounding_bits(9, counters))
    assert torch.equal(philox.rounding_noise_range(9, start, count), philox.rounding_noise(9, counters))


def test_rounding_noise_is_uniform():
    noise = philox.rounding_noise_range(3, 11, 80000).to(torch.float64)
    # Mean and variance of U(0,1) are 1/2 and 1/12; 5 standard errors for n = 80000.
    assert abs(noise.mean().item() - 0.5) < 5 * (1 / 12) ** 0.5 / 80000**0.5
    assert abs(noise.var().item() - 1 / 12) < 5 * (1 / 180) ** 0.5 / 80000**0.5
    assert philox.rounding_noise_range(3, 11, 80000).unique().numel() > 40000


# Chi-square with 255 degrees of freedom (mean 255, standard deviation sqrt(510) = 22.6): 6 standard deviations.
_CHI2_255_LIMIT = 255 + 6 * 510**0.5


def _chi2(cells: torch.Tensor, total: int) -> float:
    """Chi-square of 256 cell counts against the uniform expectation."""
    expected = total / 256
    return float(((cells.double() - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("shift", [8, 0], ids=["top-8-bits", "low-8-bits"])
def test_rounding_bits_are_uniform(shift):
    bits = philox.rounding_bits_range(21, 5, 2**18)
    assert _chi2(torch.bincount((bits >> shift) & 0xFF, minlength=256), bits.numel()) < _CHI2_255_LIMIT
    # Each of the 16 bits is set half the time: 6 standard errors of a fair coin over 2**18 draws.
    ones = torch.stack([(bits >> b) & 1 for b in range(16)]).double().mean(1)
    assert bool(((ones - 0.5).abs() < 6 * 0.5 / 2**9).all())


@pytest.mark.parametrize("lag", [1, 2, 7, 8, 9, 64, 1024], ids=lambda lag: f"lag{lag}")
@pytest.mark.parametrize("shift", [12, 0], ids=["top-4-bits", "low-4-bits"])
def test_rounding_bits_are_pairwise_independent(lag, shift):
    # Lag 1 and 2: the two halves of a word and neighbouring words of one Philox call; 7: the ends of one group of
    # 8; 8 and 9: the same lane of consecutive calls; 64, 1024: far apart. The joint distribution of 4-bit slices
    # of the two values must be uniform over the 16 x 16 cells.
    bits = philox.rounding_bits_range(77, 3, 2**18 + lag)
    a, b = (bits[: 2**18] >> shift) & 0xF, (bits[lag:] >> shift) & 0xF
    assert _chi2(torch.bincount(16 * a + b, minlength=256), 2**18) < _CHI2_255_LIMIT


@pytest.mark.parametrize("seeds", [(0, 1), (5, 5 + 2**32), (2**62, 2**62 + 1)], ids=str)
def test_rounding_bits_are_independent_across_seeds(seeds):
    # The same counters under neighbouring seeds (low and high key words) give independent values.
    a, b = ((philox.rounding_bits_range(seed, 0, 2**18) >> 12) for seed in seeds)
    assert _chi2(torch.bincount(16 * a + b, minlength=256), 2**18) < _CHI2_255_LIMIT


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: philox.randint4x(-1, torch.zeros(1, dtype=torch.int64)), "seed=-1"),
        (lambda: philox.randint4x(2**63, torch.zeros(1, dtype=torch.int64)),
         r"seed=9223372036854775808 is invalid; it must be an integer in \[0, 2\*\*63\)"),
        (lambda: philox.uniform(1, torch.zeros(1)), "int64 or int32"),
        (lambda: philox.rounding_noise(1, torch.tensor([-1])), "counters must be >= 0"),
        (lambda: philox.rounding_noise_range(1, -2, 3), "start=-2"),
        (lambda: philox.rounding_noise_range(1, 0, -3), "count=-3"),
    ],
)
def test_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()
