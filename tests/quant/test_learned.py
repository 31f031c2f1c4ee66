"""LearnedLevelsCodec: levels fitted to the expected squared error of stochastic rounding (QSDP Algorithm 1)."""

import pytest
import torch

from composer_qsdp.quant import LearnedLevelsCodec, make_codec
from composer_qsdp.quant.learned import _stochastic_codes, fit_levels, uniform_levels


def _student_t(n: int, seed: int = 0, df: float = 3.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    normal = torch.randn(n, generator=gen, dtype=torch.float64)
    chi2 = torch.randn(n, int(df), generator=gen, dtype=torch.float64).square().sum(1)
    return (normal / (chi2 / df).sqrt()).to(torch.float32)


def _expected_mse(levels: torch.Tensor, x: torch.Tensor, bucket: int) -> float:
    """Exact expected squared error of stochastic rounding onto ``levels`` in each bucket's range (float64)."""
    xb = x.to(torch.float64).view(-1, bucket)
    lo, rng = xb.amin(1, keepdim=True), xb.amax(1, keepdim=True) - xb.amin(1, keepdim=True)
    z = ((xb - lo) / rng).clamp(0, 1)
    lv = levels.to(torch.float64)
    j = (torch.searchsorted(lv, z.contiguous(), right=True) - 1).clamp(0, lv.numel() - 2)
    return float(((z - lv[j]) * (lv[j + 1] - z) * rng.square()).mean())


def _required_ratio(x: torch.Tensor, bucket: int, levels: int) -> float:
    """Largest acceptable ratio of fitted to uniform expected squared error on ``x``: the fit must realize at least
    half of the gain that high-resolution quantization theory predicts for the best levels.

    For many levels, an interval of width ``g`` holding values of density ``p`` costs ``p * g**3 / 6``, so the best
    levels have gaps ``~ p**(-1/3)`` and the best-to-uniform ratio is ``(integral of p**(1/3))**3`` for the density
    ``p`` of the bucket-normalized values weighted by their squared bucket ranges (which turn normalized errors
    into errors of ``x``). Estimated in float64 with a histogram no finer than the levels and with >= 512 values
    per bin on average, so sampling noise does not inflate the predicted gain. Uniform levels give ratio 1, which
    always fails; a fit that does nothing fails.
    """
    xb = x.to(torch.float64).view(-1, bucket)
    lo, rng = xb.amin(1, keepdim=True), xb.amax(1, keepdim=True) - xb.amin(1, keepdim=True)
    z = ((xb - lo) / rng).reshape(-1)
    bins = min(levels, x.numel() // 512)
    mass = torch.zeros(bins, dtype=torch.float64).index_add_(0, (z * bins).long().clamp(max=bins - 1),
                                                             rng.square().expand_as(xb).reshape(-1))  # fmt: skip
    best = float((mass / mass.sum()).pow(1 / 3).sum() ** 3 / bins**2)
    return 1 - (1 - best) / 2


@pytest.mark.parametrize("bits", (3, 8))
def test_learned_levels_beat_uniform_levels_on_heavy_tails_and_stay_unbiased(bits):
    bucket, n = 256, 256 * 64
    x = _student_t(n)
    learned = LearnedLevelsCodec(bits, bucket)
    levels = learned.fit(x)
    uniform = LearnedLevelsCodec(bits, bucket)
    uniform.set_levels(uniform_levels(bits))

    # Exact expectations (float64, independent of the codec) on the fitted data and on fresh data from the same
    # distribution: the fit realizes at least half of the gain theory predicts.
    y = _student_t(n, seed=1)
    for data in (x, y):
        ratio = _expected_mse(levels, data, bucket) / _expected_mse(uniform_levels(bits), data, bucket)
        assert ratio < _required_ratio(data, bucket, 1 << bits)

    # Measured over seeds through the codec itself on the fresh data: the error is the expected one, unbiased.
    seeds = 40
    errs = {"learned": [], "uniform": []}
    mean = torch.zeros(n, dtype=torch.float64)
    for seed in range(seeds):
        for name, codec in (("learned", learned), ("uniform", uniform)):
            decoded = codec.decode(codec.encode(y, seed=seed), n)
            errs[name].append(float((decoded.double() - y.double()).square().mean()))
            if name == "learned":
                mean += decoded.double()
    mse_learned, mse_uniform = (sum(v) / seeds for v in errs.values())
    torch.testing.assert_close(mse_learned, _expected_mse(levels, y, bucket), rtol=0.05, atol=0)
    torch.testing.assert_close(mse_uniform, _expected_mse(uniform_levels(bits), y, bucket), rtol=0.05, atol=0)

    # Unbiased: the mean over seeds of all errors, normalized by its standard error, is small.
    err = mean / seeds - y.double()
    sigma = (mse_learned / seeds) ** 0.5
    assert abs(float(err.mean()) / (sigma / n**0.5)) < 5


def _tiny_gap_levels(bits: int) -> torch.Tensor:
    """Levels with the smallest fitted gap, 2**-20, between most of them: a run of them just above 1/2."""
    inner = 0.5 + torch.arange((1 << bits) - 2, dtype=torch.float64) * 2.0**-20
    return torch.cat([inner.new_zeros(1), inner, inner.new_ones(1)]).to(torch.float32)


@pytest.mark.parametrize("bits", (1, 4, 8))
@pytest.mark.parametrize("kind", ("fitted", "tiny gaps"))
def test_rounding_is_unbiased_for_every_value_over_all_noise_values(bits, kind):
    # Over all 2**16 noise values u, the code is j + 1 for a count N of them; E[l_code] = l_j + N / 2**16 * gap.
    # Exact arithmetic would give N = round(2**16 * p), p = (z - l_j) / gap: the 2**16 values of 1 - u are
    # (i + 1/2) / 2**16 and count those <= p. The fp32 roundings of z - l_j, of the gap and of (1 - u) * gap move
    # the threshold by a relative 3 * 2**-24 at most (each one half an ulp), so |N / 2**16 - p| <= 2**-17 + 2**-22
    # and |E[l_code] - z| <= gap * (2**-17 + 2**-22); N is the float64 count or next to it.
    levels = fit_levels(_student_t(256 * 64, seed=bits), bits, 256) if kind == "fitted" else _tiny_gap_levels(bits)
    gen = torch.Generator().manual_seed(bits)
    below, above = torch.nextafter(levels, torch.tensor(-1.0)), torch.nextafter(levels, torch.tensor(2.0))
    mids = (levels[:-1] + levels[1:]) / 2
    z = torch.cat([torch.rand(200, generator=gen), levels, below[1:], above[:-1], mids, torch.tensor([2.0**-30])])
    noise = (torch.arange(1 << 16, dtype=torch.float32) + 0.5) / 2**16  # every value of the codec's noise u
    lv = levels.double()
    for chunk in z.split(64):
        codes = _stochastic_codes(levels, chunk.unsqueeze(1).expand(-1, noise.numel()), noise.expand(chunk.numel(), -1))
        j = (torch.searchsorted(lv, chunk.double(), right=True) - 1).clamp(0, lv.numel() - 2)
        assert ((codes == j.unsqueeze(1)) | (codes == j.unsqueeze(1) + 1)).all()
        up = (codes > j.unsqueeze(1)).sum(1)
        gap = lv[j + 1] - lv[j]
        p = (chunk.double() - lv[j]) / gap
        mean = lv[j] + up / 2**16 * gap
        assert ((mean - chunk.double()).abs() <= gap * (2**-17 + 2**-22)).all()
        assert ((up - (p * 2**16 + 0.5).floor().clamp(0, 2**16)).abs() <= 1).all()
        # On a level the code is that level's, whatever the noise (also 2**-20 above the previous one); at 1, K - 1.
        on_level = chunk.double() == lv[j]
        assert (up[on_level] == 0).all()
        assert (up[chunk == 1] == 1 << 16).all()


@pytest.mark.gpu
def test_cuda_fit_is_deterministic_and_equals_the_cpu_fit():
    x = _student_t(256 * 512, seed=9)
    reference = fit_levels(x, 8, 256, steps=10)
    for _ in range(2):
        assert torch.equal(fit_levels(x.cuda(), 8, 256, steps=10).cpu(), reference)


def test_fit_starts_at_the_high_resolution_optimum():
    # Values with density 8 on [0, 1/4] and 8/3 on [1/4, 1] in every bucket (endpoints 0 and 1 present): the
    # best gaps are in ratio (8 / (8/3)) ** (-1/3) = 3 ** (-1/3) between the two parts.
    gen = torch.Generator().manual_seed(0)
    x = torch.where(torch.rand(64 * 4096, generator=gen) < 0.5, torch.rand(64 * 4096, generator=gen) / 4,
                    0.25 + 0.75 * torch.rand(64 * 4096, generator=gen))  # fmt: skip
    x.view(64, 4096)[:, 0], x.view(64, 4096)[:, 1] = 0.0, 1.0
    levels = fit_levels(x, 6, 4096, samples=x.numel(), steps=0).double()
    gaps = torch.diff(levels)
    dense, sparse = gaps[levels[1:] <= 0.24].mean(), gaps[levels[:-1] >= 0.26].mean()
    torch.testing.assert_close(float(dense / sparse), 3 ** (-1 / 3), rtol=0.03, atol=0)


def test_fitted_levels_are_sorted_from_0_to_1_and_dense_where_values_are():
    x = _student_t(128 * 64, seed=2)
    levels = fit_levels(x, bits=3, bucket_size=128)
    assert levels.dtype == torch.float32 and levels.shape == (8,)
    assert levels[0] == 0 and levels[-1] == 1 and (torch.diff(levels) > 0).all()
    # Student-t buckets are symmetric with most mass in the middle: the inner gaps are the small ones.
    gaps = torch.diff(levels)
    assert gaps[3] < gaps[0] and gaps[3] < gaps[-1]


def test_wire_carries_the_levels_so_any_codec_instance_decodes_it():
    x = _student_t(1000, seed=3)
    sender = LearnedLevelsCodec(4, 100)
    wire = sender.encode(x, seed=5)
    receiver = LearnedLevelsCodec(4, 100)
    receiver.set_levels(uniform_levels(4))
    assert torch.equal(receiver.decode(wire, 1000), sender.decode(wire, 1000))
    assert not torch.equal(sender.levels, receiver.levels)


def test_fit_once_and_reuse_the_levels_elsewhere():
    x = _student_t(4096, seed=4)
    first = LearnedLevelsCodec(4, 256)
    levels = first.fit(x)
    second = LearnedLevelsCodec(4, 256)
    second.set_levels(levels)
    y = _student_t(4096, seed=5)
    assert torch.equal(first.encode(y, seed=1), second.encode(y, seed=1))
    assert torch.equal(first.levels, levels)  # encoding other data does not refit before refresh_every seeds


def test_fit_buckets_any_shape_flat_like_encode():
    x = _student_t(100 * 30, seed=8)
    matrix = LearnedLevelsCodec(3, 64).fit(x.view(30, 100))  # rows of 100 would split the buckets differently
    assert torch.equal(matrix, LearnedLevelsCodec(3, 64).fit(x))
    assert not torch.equal(matrix, fit_levels(x.view(30, 100), 3, 64))


def test_lazy_fit_then_refresh_every_n_new_seeds_keeps_levels_pinned_to_seen_seeds():
    codec = LearnedLevelsCodec(3, 64, refresh_every=3)
    assert codec.levels is None
    x = _student_t(64 * 32, seed=6)
    first_wire = codec.encode(x, seed=100)
    lazily_fitted = codec.levels
    assert lazily_fitted is not None and torch.equal(lazily_fitted, fit_levels(x, 3, 64))

    uniform_data = torch.rand(64 * 32, generator=torch.Generator().manual_seed(0))
    codec.encode(uniform_data, seed=101)
    codec.encode(uniform_data, seed=102)
    assert torch.equal(codec.levels, lazily_fitted)  # 3 seeds so far: no refresh yet
    codec.encode(uniform_data, seed=102)  # a repeated seed is not a new one
    assert torch.equal(codec.levels, lazily_fitted)
    codec.encode(uniform_data, seed=103)  # 4th new seed: refit on this input
    assert not torch.equal(codec.levels, lazily_fitted)
    # Uniform data pulls the levels back towards an even spacing.
    spread = lambda lv: float(torch.diff(lv).max() - torch.diff(lv).min())  # noqa: E731
    assert spread(codec.levels) < spread(lazily_fitted)

    # The first seed still encodes with the levels it was first encoded with (forward/backward consistency).
    assert torch.equal(codec.encode(x, seed=100), first_wire)


def test_refresh_every_zero_keeps_the_first_fit():
    codec = LearnedLevelsCodec(2, 64, refresh_every=0)
    codec.encode(_student_t(640), seed=0)
    levels = codec.levels
    for seed in range(1, 5):
        codec.encode(torch.rand(640), seed=seed)
    assert torch.equal(codec.levels, levels)


def test_pinned_seeds_are_bounded():
    codec = LearnedLevelsCodec(2, 64, refresh_every=1, pinned_seeds=2)
    x = _student_t(640)
    first = codec.encode(x, seed=0)
    codec.encode(torch.rand(640), seed=1)
    codec.encode(torch.rand(640), seed=2)  # evicts seed 0, whose levels were refreshed since
    assert not torch.equal(codec.encode(x, seed=0), first)


@pytest.mark.parametrize("context", (torch.no_grad, torch.inference_mode))
def test_fits_inside_no_grad_and_inference_mode(context):
    x = _student_t(2048, seed=7)
    with context():
        wire = LearnedLevelsCodec(3, 128).encode(x, seed=1)
    assert torch.equal(wire, LearnedLevelsCodec(3, 128).encode(x, seed=1))


def test_fit_runs_on_one_thread_and_restores_the_callers_thread_count(monkeypatch):
    x = _student_t(1 << 16, seed=3)
    seen = []
    real = torch.Tensor.backward

    def spy(self, *args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(self, *args, **kwargs)

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        monkeypatch.setattr(torch.Tensor, "backward", spy)
        levels = fit_levels(x, 4, 256, steps=5)
        assert seen == [1] * 5
        assert torch.get_num_threads() == 2
        monkeypatch.undo()
        torch.set_num_threads(1)
        assert torch.equal(fit_levels(x, 4, 256, steps=5), levels)  # the caller's thread count does not matter
    finally:
        torch.set_num_threads(before)


def test_all_constant_or_nonfinite_input_keeps_uniform_levels():
    x = torch.full((256,), 3.0)
    x[200] = float("nan")
    codec = LearnedLevelsCodec(2, 64)
    decoded = codec.decode(codec.encode(x, seed=0), 256)
    assert torch.equal(codec.levels, uniform_levels(2))
    assert torch.equal(decoded[:192], x[:192]) and decoded[192:].isnan().all()


@pytest.mark.parametrize(
    "levels, match",
    [
        (torch.linspace(0, 1, 8), "2\\*\\*bits = 16 values"),
        (torch.linspace(0, 2, 16), "from 0 to 1"),
        (torch.linspace(0, 1, 16).flip(0), "strictly increasing"),
        (torch.cat([torch.zeros(2), torch.linspace(0.1, 1, 14)]), "strictly increasing"),
        (torch.linspace(0, 1, 16).index_fill(0, torch.tensor([3]), float("nan")), "finite"),
        (torch.cat([torch.zeros(1), torch.full((14,), 2.0**-101).cumsum(0), torch.ones(1)]), "2\\*\\*-100 apart"),
        ([0.0, 1.0], "1-D tensor"),
    ],
)
def test_set_levels_rejects_invalid_levels(levels, match):
    with pytest.raises(ValueError, match=match):
        LearnedLevelsCodec(4, 64).set_levels(levels)


@pytest.mark.parametrize(
    "option, value",
    [("refresh_every", -1), ("fit_samples", 0), ("fit_steps", 0), ("pinned_seeds", 0), ("fit_steps", 2.5), ("bits", 9)],
)
def test_rejects_invalid_options(option, value):
    with pytest.raises(ValueError, match=f"{option}="):
        make_codec("learned", **{"bits": 4, "bucket_size": 64, option: value})
