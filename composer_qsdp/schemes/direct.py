"""``DirectAllGather``: QSDP's weight path. Each rank quantizes its shard, the codes are gathered, every rank
decodes every shard (its own included), so all ranks compute with bit-identical weights."""

from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatchcase

import torch
import torch.distributed as dist

from composer_qsdp.comm import CallTraffic, Segments, Topology, quantized_all_gather
from composer_qsdp.quant import Codec
from composer_qsdp.schemes.base import GatherLayout, WeightScheme

__all__ = ["DirectAllGather", "check_direct_options"]


def check_direct_options(align_buckets: object, unquantized_params: object) -> None:
    """Raise the ``ValueError`` that :class:`DirectAllGather` raises for these options, building nothing."""
    if not isinstance(align_buckets, bool):
        raise ValueError(f"align_buckets={align_buckets!r} is invalid; it must be True or False")
    if isinstance(unquantized_params, str) or not all(isinstance(p, str) for p in unquantized_params):
        raise ValueError(
            f"unquantized_params={unquantized_params!r} is invalid; it must be a list of fnmatch patterns of "
            "parameter names, e.g. ['*.bias', '*ln_*']"
        )


class DirectAllGather(WeightScheme):
    """One flat quantized all-gather per call; stateless between calls (the default weight scheme).

    Stochastic rounding is keyed by the caller's seed: the forward and backward gathers of one microbatch get
    the same key and decode the same weights. A ``None`` codec gathers unquantized.

    A unit's shard is its parameters' shards back to back, so a bucket can straddle two parameters of very
    different scales (a LayerNorm gain near 1 beside weights of scale 0.02), which widens its step for both.
    ``align_buckets`` starts every parameter's piece on a bucket of its own, and ``unquantized_params`` sends
    the matching parameters (e.g. norms and biases: few elements, little traffic) unquantized. Both need the
    unit's gather layout from the adapter.

    Args:
        codec: the weight codec, or ``None``.
        error_sample_interval: measure the relative quantization error every this many calls (0: never).
        align_buckets: quantize each parameter in buckets of its own (the wire grows by the padding).
        unquantized_params: ``fnmatch`` patterns of parameter names within the unit (``"ln_1.weight"``,
            ``"*.bias"``) sent unquantized.

    Raises:
        ValueError: an option of the wrong type.
    """

    name = "direct"

    def __init__(
        self,
        codec: Codec | None,
        error_sample_interval: int = 0,
        align_buckets: bool = False,
        unquantized_params: Sequence[str] = (),
    ) -> None:
        super().__init__(codec, error_sample_interval)
        check_direct_options(align_buckets, unquantized_params)
        self.align_buckets = align_buckets
        self.unquantized_params = tuple(unquantized_params)
        self.segments: Segments | None = None

    @property
    def passthrough(self) -> bool:
        """Without a codec the gather is the framework's own."""
        return self.codec is None

    @property
    def needs_layout(self) -> bool:
        return self.codec is not None and (self.align_buckets or bool(self.unquantized_params))

    def setup(self, group: dist.ProcessGroup, topology: Topology, layout: GatherLayout | None = None) -> None:
        """:meth:`WeightScheme.setup`; with ``align_buckets`` or ``unquantized_params`` the layout gives the pieces.

        Raises:
            ValueError: those options without a layout.
        """
        super().setup(group, topology, layout)
        if not self.needs_layout:
            return
        if layout is None:
            raise ValueError("align_buckets and unquantized_params need the unit's gather layout from its adapter")
        sizes: list[int] = []
        flags: list[bool] = []
        for key, numel in layout.segments():
            quantize = not any(fnmatchcase(key, p) for p in self.unquantized_params)
            if flags and not self.align_buckets and flags[-1] == quantize:
                sizes[-1] += numel  # without alignment only raw pieces break the bucketed run
            else:
                sizes.append(numel)
                flags.append(quantize)
        self.segments = Segments(tuple(sizes), tuple(flags))

    def describe(self) -> str:
        text = super().describe()
        if self.align_buckets:
            text += ", buckets aligned to parameters"
        if self.unquantized_params:
            text += f", unquantized {list(self.unquantized_params)}"
        return text

    def _all_gather(
        self, output: torch.Tensor, input: torch.Tensor, seed: int, group: dist.ProcessGroup, measure_error: bool
    ) -> CallTraffic:
        return quantized_all_gather(
            output, input, self.codec, group, seed, measure_error=measure_error, off_node_peers=self._off_node_peers,
            segments=self.segments,
        )
