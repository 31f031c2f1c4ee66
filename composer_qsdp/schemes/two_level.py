"""``TwoLevelReduceScatter``: the hierarchical gradient reduce-scatter of ZeRO++ (qgZ) and SDP4Bit (TLq-HS).

An intra-node all-to-all with one codec, an fp32 reduction on each rank, an inter-node all-to-all among the
ranks with the same local index with another codec, a final fp32 reduction
(:func:`~composer_qsdp.comm.two_level_reduce_scatter`). Only the second hop crosses nodes, and it carries
``1 / L`` of the chunks a flat collective would send there (``L`` ranks per node), so the intra-node hop can
afford more bits:

* qgZ (ZeRO++): INT4 symmetric blocks on both hops (the side's codec, ``intra_codec="same"``);
* TLq-HS (SDP4Bit §3.2): INT8 within the node, INT4 across nodes, groups of 128 elements, and a Hadamard
  rotation of 32-element blocks applied once before the first hop and undone once after the second
  (``rotation_block=32``): the reduction in between stays in the rotated domain.

The side's codec (``SideConfig.codec``/``bits``/``bucket_size``) is the inter-node codec: its bits are what the
cluster's network carries.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from composer_qsdp.comm import CallTraffic, NodeGroups, Topology, node_groups, two_level_reduce_scatter
from composer_qsdp.comm.two_level import is_power_of_two
from composer_qsdp.quant import Codec, codec_names, make_codec
from composer_qsdp.schemes.base import GradScheme

__all__ = ["TwoLevelReduceScatter", "check_two_level_options"]

#: ``intra_codec`` value that reuses the side's (inter-node) codec on the intra-node hop.
SAME = "same"


class TwoLevelReduceScatter(GradScheme):
    """Two-hop quantized reduce-scatter over the group's intra-node and inter-node subgroups.

    On a group within one node, or with one rank per node, there is one hop: the flat collective with that hop's
    codec (the intra codec on one node, the inter codec otherwise), bit-identical to ``"flat"`` when there is no
    rotation. Honours ``ReduceOp.SUM`` and ``AVG``.

    Args:
        codec: the inter-node hop's codec (the side's codec); ``None`` sends the partial sums unquantized.
        error_sample_interval: measure the relative quantization error (both hops) every this many calls.
        intra_codec: the intra-node hop's codec: ``"same"`` (default: the side's codec on both hops, qgZ),
            ``None`` (unquantized, in the reduce dtype), or the options of :func:`~composer_qsdp.quant.make_codec`
            with the codec's ``name``, e.g. ``{"name": "symmetric", "bits": 8, "bucket_size": 128}``.
        rotation_block: Hadamard block in elements (a power of two; SDP4Bit: 32), or ``None`` for no rotation.

    Raises:
        ValueError: an invalid ``intra_codec`` or ``rotation_block``, naming the value and what is allowed.
    """

    name = "two_level"

    def __init__(
        self,
        codec: Codec | None,
        error_sample_interval: int = 0,
        *,
        intra_codec: str | Mapping[str, Any] | None = SAME,
        rotation_block: int | None = None,
    ) -> None:
        super().__init__(codec, error_sample_interval)
        self.intra_codec = _intra_codec(intra_codec, codec)
        self.rotation_block = _check_rotation_block(rotation_block)
        self.node_split: NodeGroups | None = None

    def setup(self, group: dist.ProcessGroup, topology: Topology) -> None:
        """Bind to ``group`` and split it into the nodes of ``topology``: collective over the default group the
        first time a group is seen (its subgroups are created then and shared by every unit on it)."""
        super().setup(group, topology)
        self.node_split = node_groups(topology, group)

    def describe(self) -> str:
        hops = f"intra {self.intra_codec!r} | inter {self.codec!r}"
        rotation = f", Hadamard {self.rotation_block}" if self.rotation_block else ""
        split = self.node_split
        shape = f" on {split.nodes} nodes x {split.ranks_per_node}" if split is not None else ""
        return f"two-level{shape}: {hops}{rotation}"

    def _reduce_scatter(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        op: dist.ReduceOp | dist.ReduceOp.RedOpType,
        seed: int,
        group: dist.ProcessGroup,
        measure_error: bool,
        overwrite_input: bool,
    ) -> CallTraffic:
        assert self.node_split is not None  # set with the group, which _check_group required
        return two_level_reduce_scatter(
            output, input, self.intra_codec, self.codec, group, self.node_split, op, seed,
            rotation_block=self.rotation_block, measure_error=measure_error, overwrite_input=overwrite_input,
            **self._feedback(input),
        )  # fmt: skip

    def _feedback(self, input: torch.Tensor) -> dict[str, Any]:
        """Error-feedback arguments of the collective for this call's ``input``: none here (``two_level_loco``
        keeps a residual of the inter-node hop)."""
        return {}


def check_two_level_options(intra_codec: object, rotation_block: object) -> None:
    """Raise the ``ValueError`` that :class:`TwoLevelReduceScatter` raises for these options, building no scheme (an
    intra-node codec given by its options is built to check them, and dropped)."""
    _intra_codec(intra_codec, None)
    _check_rotation_block(rotation_block)


def _check_rotation_block(rotation_block: Any) -> int | None:
    if rotation_block is not None and not is_power_of_two(rotation_block):
        raise ValueError(
            f"rotation_block={rotation_block!r} is invalid; allowed: a power of two (elements per Hadamard block, "
            "SDP4Bit uses 32), or None"
        )
    return rotation_block


def _intra_codec(spec: str | Mapping[str, Any] | None, side_codec: Codec | None) -> Codec | None:
    if spec == SAME:
        return side_codec
    if spec is None:
        return None
    if not isinstance(spec, Mapping) or not isinstance(spec.get("name"), str):
        raise ValueError(
            f"intra_codec={spec!r} is invalid; allowed: 'same' (the side's codec), None (unquantized), or a mapping "
            f"of codec options with the codec's name, e.g. {{'name': 'symmetric', 'bits': 8, 'bucket_size': 128}} "
            f"(names: {', '.join(codec_names())})"
        )
    try:
        return make_codec(**spec)
    except ValueError as err:
        raise ValueError(f"intra_codec={dict(spec)!r}: {err}") from None
