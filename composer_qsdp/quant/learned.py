"""Learned non-uniform levels with unbiased stochastic rounding (QSDP, Markov et al., ICML 2023, "Algorithm 1:
gradient-based optimization of the levels"; the paper gives the method, the details below are our reconstruction).

Each bucket is normalized by its own range, ``z = (x - lo) / (hi - lo)`` in ``[0, 1]``, and quantized onto
``K = 2**bits`` levels ``0 = l_0 < l_1 < ... < l_{K-1} = 1`` by stochastic rounding between the two levels
that bracket it::

    j       = the largest index with l_j <= z (at most K - 2)
    g_j     = l_{j+1} - l_j
    code    = j + [z - l_j >= (1 - u) * g_j]     # u: rounding noise, element i at counter offset + i
    decoded = lo + l_code * (hi - lo)

Rounding without a division: this is ``j + floor(p + u)`` with ``p = (z - l_j) / g_j``, the comparison ``p >= 1 -
u`` multiplied through by ``g_j``, so the kernels need no IEEE division per element (about ten GPU instructions).
Unbiasedness: ``1 - u`` takes the ``2**16`` values ``(i + 1/2) / 2**16`` with equal probability (``u = (k + 1/2) /
2**16``, :mod:`composer_qsdp.quant.philox`; ``1 - u`` is exact in fp32), so in exact arithmetic ``P(code = j + 1) =
round(2**16 * p) / 2**16`` and ``E[l_code] = l_j + P * g_j`` is ``z`` up to ``2**-17 * g_j``, the noise's resolution
(as for ``floor(p + u)``). The three fp32 roundings (of ``z - l_j``, of ``g_j`` and of the product) move the
threshold by a relative ``3 * 2**-24`` at most, so ``|E[l_code] - z| <= g_j * (2**-17 + 2**-22)``, a bias far below
the rounding's standard deviation. The comparison keeps the edges exact for any gap, however small (down to
``2**-100``, which :meth:`LearnedLevelsCodec.set_levels` requires, so that the threshold stays a normal fp32
number): at ``z = l_j``, ``z - l_j`` is exactly 0 and the threshold positive, so the code is ``j`` for every ``u``;
at ``z = 1``, ``z - l_j`` is the same fp32 subtraction as ``g_j`` and the threshold ``<= g_j``, so the code is ``K -
1``. (A threshold on ``z`` itself, ``z >= l_j + (1 - u) * g_j``, rounds ``l_j + tiny`` back to ``l_j`` when the gap
is below the spacing of fp32 numbers at ``l_j``, and rounds ``z = l_j`` up with positive probability: a bias, with
fitted gaps as small as ``2**-20``.) ``tests/quant/test_learned.py`` checks the bound and the edges over all
``2**16`` noise values, for fitted levels and for gaps of ``2**-20``.

``E[l_code] = z`` up to that bound, so the codec is unbiased for any levels, and the error of one round trip is
at most the gap of the bracketing levels times the bucket's range.

Granularity: ONE set of normalized levels per wire, shared by all its buckets, with a per-bucket
``(lo, hi - lo)``. Normalizing by the bucket's range makes the levels describe the *shape* of the value
distribution (how heavy its tails are), which is close to the same for all buckets of a tensor and changes
slowly during training, so one fitted set serves every bucket and many steps. Levels per bucket would cost
``2**bits`` floats per bucket (as much as the codes at 8 bits and 1024-element buckets) and a fit per bucket.

Fitting (:func:`fit_levels`) minimizes the expected squared error of this stochastic rounding, which for one
element is the variance ``(z - l_j)(l_{j+1} - z) * (hi - lo)**2``, summed over a strided subsample of the
tensor, by gradient steps (Adam) on the log-gaps of the levels: a softmax of the parameters gives gaps that
stay positive and sum to 1, so the levels stay sorted with ``l_0 = 0`` and ``l_{K-1} = 1``. The optimum puts
levels densely where values are dense, which is where uniform levels waste precision on heavy-tailed tensors:
an interval of width ``g`` holding values of density ``p`` costs about ``p * g**3 / 6``, so for many levels the
best gaps shrink like ``p**(-1/3)`` (high-resolution quantization theory). A fit without a warm start begins
at exactly that solution, computed from a ``K``-bin histogram of the sample, and the gradient steps refine it.

Determinism: the fit runs on the CPU in float64 whatever the input's device (a subsample of at most
``fit_samples`` values), so CUDA inputs give the CPU's levels, and never depend on the unordered atomic
accumulation of CUDA's backward pass (run to run, rank to rank). Across CPUs, vectorized kernels round
differently (AVX-512, AVX2, scalar); the start point and the step size keep that from mattering: from the
high-resolution solution with small steps, the fitted levels differ only slightly and their error not
measurably, whereas large Adam steps from uniform levels amplify such differences.

Reuse and refresh: the codec holds its levels. They are fitted lazily on the first encode, refitted on the
input of an encode after every ``refresh_every`` new seeds (warm-started from the current levels), or set
explicitly with :meth:`LearnedLevelsCodec.fit` / :meth:`LearnedLevelsCodec.set_levels`. A seed is one
quantization event (FSDP's forward and backward gathers of a step share one), so the levels an encode uses
are pinned to its seed: a later encode with the same seed (among the ``pinned_seeds`` most recent) uses the
same levels even if a refresh happened in between, and ``encode`` stays a function of ``(x, seed, offset)``.

Kernels: on CUDA tensors (see :mod:`composer_qsdp.kernels.dispatch`) ``encode``/``decode``/``encode_rows``/
``decode_rows``/``decode_sum`` run the Triton kernels of :mod:`composer_qsdp.kernels.learned` (one pass: bucket
min/max, normalization, the bracket from a grid of cells over ``[0, 1]``, stochastic rounding, packing; decode
gathers each code's level) when they cover the configuration (``bits`` in 1, 2, 4, 8; ``bucket_size`` a multiple
of 8 up to 8192), else this torch reference (``_encode_rows_reference``, ``_decode_rows_fp32``). Every fp32 step
of the rounding above is one IEEE operation in the same order in both, and the kernels draw the same noise, so
both give the same wire and the same decoded values bit for bit. The levels live on the device of the inputs:
levels set on another device move there once, on the first encode, never per call; the encode kernel's search
table (``kernels.learned.search_table``) is built from them once, on the first kernel encode that uses them.

Wire (:mod:`composer_qsdp.kernels.wire_format`): codes packed bucket by bucket, then ``(lo, hi - lo)`` as fp32 per
bucket, then the ``K`` levels as fp32 (``bits + 64 / bucket_size`` bits per element plus ``32 * K`` bits per
wire). The decoder needs nothing but the wire.

Non-finite input: a bucket holding a NaN or an infinity, or whose range overflows fp32, is stored with
``lo = range = NaN`` and codes 0, so every element of that bucket decodes to NaN. Fits ignore such buckets.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator

import torch
from torch.utils.weak import WeakIdKeyDictionary

from composer_qsdp.quant.buckets import bucket_lattice, bucket_min_max
from composer_qsdp.kernels import WireFormat, bucket_wire_format
from composer_qsdp.quant.codec import sum_rows_in_order
from composer_qsdp.validate import check_int
from composer_qsdp.quant.kernel_decode import KernelDecodes
from composer_qsdp.quant.philox import rounding_noise_range
from composer_qsdp.quant.wire import assemble_rows, pack_rows, read_meta, unpack_rows

__all__ = ["LearnedLevelsCodec", "fit_levels", "uniform_levels", "expected_sq_error", "high_resolution_levels"]

# Smallest gap between fitted levels, a fraction of the normalized range: keeps the levels strictly increasing in
# fp32 (whose spacing just below 1 is 6e-8).
_MIN_GAP = 2.0**-20
# Smallest gap of levels set explicitly: keeps the rounding threshold (1 - u) * gap (1 - u >= 2**-17) a normal fp32
# number, on which the rounding's bias bound and exact edges rest (module docstring).
_MIN_SET_GAP = 2.0**-100
# Adam step on the log-gaps: 0.1 oscillated at 8 bits (each step moves every gap by up to ~10%), which made the
# fitted levels chaotic in rounding differences; from the high-resolution start 0.03 refines stably.
_ADAM_LR = 0.03


def uniform_levels(bits: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The ``2**bits`` evenly spaced normalized levels on ``[0, 1]`` (fp32): min-max quantization's grid."""
    return torch.linspace(0.0, 1.0, 1 << bits, dtype=torch.float32, device=device)


def _levels_from_params(theta: torch.Tensor) -> torch.Tensor:
    """Sorted levels from ``K - 1`` unconstrained parameters: gaps ``>= _MIN_GAP`` summing to 1."""
    gaps = torch.softmax(theta, dim=0) * (1.0 - _MIN_GAP * theta.numel()) + _MIN_GAP
    inner = torch.cumsum(gaps, dim=0)[:-1]
    return torch.cat([inner.new_zeros(1), inner, inner.new_ones(1)])


def _bracket(levels: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Index ``j`` of the lower bracketing level of each ``z`` (``l_j <= z``, clamped to ``0..K-2``)."""
    j = torch.searchsorted(levels, z.contiguous(), right=True) - 1
    return j.clamp_(0, levels.numel() - 2)


def _stochastic_codes(levels: torch.Tensor, z: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Codes (int64) of normalized values ``z`` in ``[0, 1]`` rounded stochastically onto ``levels`` (fp32) with
    rounding noise ``noise`` (``u``, fp32 like ``rounding_noise``): ``j + [z - l_j >= (1 - u) * g_j]``, the
    division-free form of ``j + floor(p + u)`` (module docstring)."""
    j = _bracket(levels, z)
    lower = levels[j]
    return j + (z - lower >= (1.0 - noise) * (levels[j + 1] - lower))


def expected_sq_error(levels: torch.Tensor, z: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Weighted mean of the stochastic-rounding variance ``(z - l_j)(l_{j+1} - z)`` (differentiable in ``levels``).

    Args:
        levels: ``K`` sorted normalized levels.
        z: normalized values in ``[0, 1]``.
        weight: per-value weight (the squared bucket range turns it into the squared error of ``x``).
    """
    j = _bracket(levels.detach(), z)
    return ((z - levels[j]) * (levels[j + 1] - z) * weight).sum() / weight.sum()


def high_resolution_levels(z: torch.Tensor, weight: torch.Tensor, num_levels: int) -> torch.Tensor:
    """The ``num_levels`` levels (float64, 0 first, 1 last) whose local density is proportional to the cube root of
    the weighted density of ``z``, the high-resolution optimum of :func:`expected_sq_error`.

    The density is a histogram of ``num_levels`` equal bins on ``[0, 1]`` (one per level: finer bins hold too few
    values to estimate a density whose cube root matters in sparse regions); levels are placed at equal steps
    of the cumulative cube-rooted density, linearly within a bin.
    """
    bins = num_levels
    which = (z * bins).long().clamp_(0, bins - 1)
    mass = torch.zeros(bins, dtype=torch.float64).index_add_(0, which, weight.to(torch.float64))
    root = mass.pow(1.0 / 3.0)
    cdf = torch.cat([root.new_zeros(1), torch.cumsum(root, 0)]) / root.sum()
    targets = torch.linspace(0.0, 1.0, num_levels, dtype=torch.float64)
    j = (torch.searchsorted(cdf, targets, right=True) - 1).clamp_(0, bins - 1)
    width = cdf[j + 1] - cdf[j]
    frac = torch.where(width > 0, (targets - cdf[j]) / width.clamp_min(torch.finfo(torch.float64).tiny), 0.0)
    levels = (j + frac.clamp(0.0, 1.0)) / bins
    levels[0], levels[-1] = 0.0, 1.0
    return levels


@contextlib.contextmanager
def _one_cpu_thread() -> Iterator[None]:
    # A fit works on at most ``fit_samples`` float64 values, where one thread is about as fast as many. A training
    # process's default intra-op pool has a thread per core, and with one such process per GPU fitting at the
    # same moment (every unit's first encode) the pools oversubscribe the host and the fits slow down several
    # times. One thread also makes the fit independent of the core
    # count.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def fit_levels(
    x: torch.Tensor,
    bits: int,
    bucket_size: int,
    init: torch.Tensor | None = None,
    samples: int = 65536,
    steps: int = 50,
) -> torch.Tensor:
    """Fit ``2**bits`` normalized levels to ``x`` by gradient descent on the expected squared error.

    Args:
        x: floating tensor; a 2-D one is bucketed row by row (as ``encode_rows`` does), any other is flattened
            (as ``encode`` does).
        bits: bits per code; ``K = 2**bits`` levels.
        bucket_size: elements per bucket.
        init: levels to start from (warm start); default the high-resolution optimum of the sample
            (:func:`high_resolution_levels`).
        samples: at most this many elements (a regular stride through the buckets) enter the objective.
        steps: Adam steps.

    Returns:
        fp32 levels on ``x.device``: ``K`` values, ``0`` first, ``1`` last, gaps ``>= 2**-20``; the same for the
        same values on any device.
    """
    num_levels = 1 << bits
    # Inside inference mode or no_grad (e.g. an evaluation loop) the fit still needs autograd.
    with torch.inference_mode(False), torch.enable_grad():
        xb, lo, hi = bucket_min_max(x.detach().reshape(1, -1) if x.dim() != 2 else x.detach(), bucket_size)
        rng = hi - lo
        # The sample takes every k-th element of the rows padded to whole buckets of bucket_size elements (the
        # padding repeats a row's last element). xb holds those buckets cut to `width` columns; a column past
        # them is a copy of the last one, so the sample is read from xb without building the padding.
        rows, nb, width = xb.shape
        padded = rows * nb * bucket_size
        idx = torch.arange(0, padded, -(-padded // samples), device=x.device)
        bucket, column = idx // bucket_size, (idx % bucket_size).clamp_(max=width - 1)
        # Only the small float64 work on the sample is pinned to one thread; the bucketing above sees the whole
        # tensor and keeps the caller's threads.
        with _one_cpu_thread():
            cpu = {"device": "cpu", "dtype": torch.float64}
            lo_s, rng_s = lo.reshape(-1)[bucket].to(**cpu), rng.reshape(-1)[bucket].to(**cpu)
            z = (xb.reshape(rows * nb, width)[bucket, column].to(**cpu) - lo_s) / rng_s
            # Constant buckets have no rounding error and non-finite ones no meaningful levels: leave them out.
            keep = torch.isfinite(z) & torch.isfinite(rng_s) & (rng_s > 0)
            if not keep.any():
                start = uniform_levels(bits) if init is None else init.to(torch.float32)
                return start.to(x.device)
            z, rng_s = z[keep].clamp(0.0, 1.0), rng_s[keep]
            weight = (rng_s / rng_s.max()).square()  # relative squared ranges: the absolute ones could overflow

            start = high_resolution_levels(z, weight, num_levels) if init is None else init.to(**cpu)
            # Inverse of _levels_from_params; gaps at the minimum become very negative parameters.
            free = (torch.diff(start) - _MIN_GAP) / (1.0 - _MIN_GAP * (num_levels - 1))
            theta = torch.log(free.clamp_min(torch.finfo(torch.float64).tiny)).requires_grad_(True)
            optimizer = torch.optim.Adam([theta], lr=_ADAM_LR)
            for _ in range(steps):
                optimizer.zero_grad(set_to_none=True)
                expected_sq_error(_levels_from_params(theta), z, weight).backward()
                optimizer.step()
            return _levels_from_params(theta.detach()).to(device=x.device, dtype=torch.float32)


class LearnedLevelsCodec(KernelDecodes):
    """Learned-levels quantizer with unbiased stochastic rounding (see the module docstring).

    Args:
        bits: bits per code, 1..8 (``2**bits`` levels).
        bucket_size: elements per bucket (1..2**24); one fp32 ``lo`` and one fp32 range per bucket.
        refresh_every: refit the levels after this many new seeds (>= 1), or 0 to keep the first fit until
            :meth:`fit` or :meth:`set_levels` is called.
        fit_samples: elements of the input (a regular stride) used by a fit (>= 1).
        fit_steps: gradient steps of a fit (>= 1).
        pinned_seeds: how many recent seeds keep the levels their first encode used (>= 1).

    Raises:
        ValueError: an invalid option, naming it and the allowed values.
    """

    name = "learned"
    kernels_module = "learned"

    def __init__(
        self,
        bits: int = 8,
        bucket_size: int = 1024,
        refresh_every: int = 1000,
        fit_samples: int = 65536,
        fit_steps: int = 50,
        pinned_seeds: int = 1024,
    ) -> None:
        super().__init__(bits, bucket_size)
        self.refresh_every = check_int("refresh_every", refresh_every, minimum=0)
        self.fit_samples = check_int("fit_samples", fit_samples, minimum=1)
        self.fit_steps = check_int("fit_steps", fit_steps, minimum=1)
        self.pinned_seeds = check_int("pinned_seeds", pinned_seeds, minimum=1)
        self._levels: torch.Tensor | None = None
        self._seeds_since_fit = 0
        self._pinned: collections.OrderedDict[int, torch.Tensor] = collections.OrderedDict()
        # The encode kernel's search table of each level set in use, keyed by the levels tensor.
        self._tables: WeakIdKeyDictionary = WeakIdKeyDictionary()

    @property
    def unbiased(self) -> bool:
        return True

    @property
    def num_levels(self) -> int:
        """``K = 2**bits``."""
        return 1 << self.bits

    @property
    def levels(self) -> torch.Tensor | None:
        """The current normalized levels (fp32, ``K`` values from 0 to 1), or None before the first fit."""
        return self._levels

    # ------------------------------------------------------------------ levels
    def fit(self, x: torch.Tensor) -> torch.Tensor:
        """Fit the levels to ``x`` (any shape, bucketed flat like :meth:`encode`; warm-started from the current
        levels) and use them for every later encode.

        Returns:
            The new fp32 levels (on ``x.device``).
        """
        self._check_input(x)
        levels = fit_levels(x.reshape(-1), self.bits, self.bucket_size, self._levels, self.fit_samples, self.fit_steps)
        return self.set_levels(levels)

    def set_levels(self, levels: torch.Tensor) -> torch.Tensor:
        """Use ``levels`` (``K`` increasing values, 0 first and 1 last) for every later encode, e.g. levels
        fitted once by another codec; forgets the levels pinned to earlier seeds.

        Raises:
            ValueError: wrong count, not finite, not strictly increasing, not from 0 to 1, or two levels closer than
                ``2**-100``.
        """
        if not isinstance(levels, torch.Tensor) or levels.shape != (self.num_levels,):
            shape = tuple(levels.shape) if isinstance(levels, torch.Tensor) else type(levels).__name__
            raise ValueError(f"levels must be a 1-D tensor of 2**bits = {self.num_levels} values, got {shape}")
        levels = levels.to(torch.float32)
        gaps = torch.diff(levels)
        if not torch.isfinite(levels).all() or not (gaps > 0).all() or levels[0] != 0 or levels[-1] != 1:
            raise ValueError(f"levels must be finite and strictly increasing from 0 to 1, got {levels.tolist()}")
        if not (gaps >= _MIN_SET_GAP).all():
            raise ValueError(f"levels must be at least 2**-100 apart, got a gap of {float(gaps.min())}")
        self._levels = levels
        self._seeds_since_fit = 0
        self._pinned.clear()
        return levels

    def _levels_for(self, seed: int, x: torch.Tensor) -> torch.Tensor:
        """The levels of an encode with ``seed`` on ``x.device``: pinned ones, else the current ones
        (fitted/refreshed on ``x``)."""
        levels = self._pinned.get(seed)
        if levels is None:
            if self._levels is None or (self.refresh_every and self._seeds_since_fit >= self.refresh_every):
                self._levels = fit_levels(x, self.bits, self.bucket_size, self._levels, self.fit_samples,
                                          self.fit_steps)  # fmt: skip
                self._seeds_since_fit = 0
            self._seeds_since_fit += 1
            levels = self._levels
        if levels.device != x.device:
            # Levels set on another device (e.g. the CPU) move once and stay there: a copy per encode would
            # synchronize the host with every quantized collective.
            moved = levels.to(x.device)
            if levels is self._levels:
                self._levels = moved
            levels = moved
        self._pinned[seed] = levels
        self._pinned.move_to_end(seed)
        if len(self._pinned) > self.pinned_seeds:
            self._pinned.popitem(last=False)
        return levels

    # ------------------------------------------------------------------ codec
    def wire_format(self, numel: int) -> WireFormat:
        """Wire format of ``numel`` elements."""
        self._check_numel(numel)
        words = 2 * self.num_buckets(numel) + self.num_levels
        return bucket_wire_format(numel, self.bucket_size, self.bits, meta_words=words)

    def _encode_rows(self, x: torch.Tensor, seed: int, offset: int) -> torch.Tensor:
        kernels = self._kernels(x, x.shape[1])
        if kernels is None:
            return self._encode_rows_reference(x, seed, offset)
        levels = self._levels_for(seed, x)
        # Built on the first kernel encode with these levels (on their device, without a host synchronization),
        # then reused by every encode pinned to them; the torch reference never needs it.
        table = self._tables.get(levels)
        if table is None:
            table = self._tables[levels] = kernels.search_table(levels)
        return kernels.encode_rows(x, levels, self.bits, self.bucket_size, self.wire_format(x.shape[1]), seed, offset,
                                   table=table)  # fmt: skip

    # ------------------------------------------------------------------ torch reference
    def _encode_rows_reference(self, x: torch.Tensor, seed: int, offset: int) -> torch.Tensor:
        """Reference of ``encode_rows`` (also the CPU path); the kernels match it bit for bit."""
        levels = self._levels_for(seed, x)
        rows, n = x.shape
        fmt = self.wire_format(n)
        # One level step spans the whole range: rng = max - min exactly (a division by 1), with its capped
        # reciprocal, and a NaN or infinity anywhere in a bucket makes its range non-finite.
        xb, lo, rng, inv, nonfinite = bucket_lattice(x, self.bucket_size, 1)
        nb, width = xb.shape[1:]
        z = ((xb - lo.unsqueeze(2)) * inv.unsqueeze(2)).clamp_(0.0, 1.0).nan_to_num_(0.0)
        noise = rounding_noise_range(seed, offset, rows * n, device=x.device).view(rows, n)
        noise = torch.nn.functional.pad(noise, (0, nb * width - n)).view(rows, nb, width)
        codes = _stochastic_codes(levels, z, noise)
        codes = codes.masked_fill_(nonfinite.unsqueeze(2), 0).to(torch.uint8).view(rows, nb * width)
        codes[:, n:] = 0

        per_bucket = torch.stack((lo, rng), dim=2).masked_fill_(nonfinite.unsqueeze(2), float("nan"))
        meta = torch.cat([per_bucket.view(rows, 2 * nb), levels.expand(rows, -1)], dim=1)
        return assemble_rows(pack_rows(codes, fmt, self.bits), meta, fmt)

    def _decode_rows_fp32(self, wire: torch.Tensor, numel: int) -> torch.Tensor:
        """Reference of ``decode_rows`` in fp32 (the output dtype is one rounding of this)."""
        fmt = self.wire_format(numel)
        rows, nb = wire.shape[0], fmt.num_buckets
        codes = unpack_rows(wire, fmt, self.bits, self.bucket_size).to(torch.int64)
        meta = read_meta(wire, fmt)
        per_bucket = meta[:, : 2 * nb].view(rows, nb, 2)
        levels = meta[:, 2 * nb :]
        values = torch.gather(levels, 1, codes.view(rows, -1)).view(rows, nb, -1)
        decoded = per_bucket[:, :, 0:1] + values * per_bucket[:, :, 1:2]
        return decoded.view(rows, -1)[:, :numel]

    def _decode_sum_reference(self, wire: torch.Tensor, numel: int) -> torch.Tensor:
        """Reference of ``decode_sum``: the decoded rows summed in order, as the kernel accumulates."""
        return sum_rows_in_order(self._decode_rows_fp32(wire, numel))

    def __repr__(self) -> str:
        return (
            f"LearnedLevelsCodec(bits={self.bits}, bucket_size={self.bucket_size}, refresh_every={self.refresh_every}, "
            f"fit_samples={self.fit_samples}, fit_steps={self.fit_steps}, pinned_seeds={self.pinned_seeds})"
        )
