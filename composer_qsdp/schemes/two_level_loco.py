"""``TwoLevelLoCoReduceScatter``: the two-level reduce-scatter with LoCo's error feedback on the inter-node hop only.

The ``loco`` scheme keeps on every rank the error of the whole unsharded gradient it encodes (``W * n`` elements for
``W`` ranks and chunks of ``n``): its memory grows with the model and does not shrink with the ranks as FSDP's own
state does. Here the feedback moves to the hop that crosses the network, after the intra-node reduce-scatter
(ZeRO++ qgZ's two hops, :class:`~composer_qsdp.schemes.two_level.TwoLevelReduceScatter`), so each rank's residual
covers what it sends across nodes: its node's partial sums of the ``M`` chunks its local index owns, ``1 / L`` of the
gradient for ``L`` ranks per node. LoCo's recursion (Xie, Lin, Toh, Zhou, "LoCo: Low-Bit Communication Adaptor for
Large-scale Model Training", 2024; :mod:`composer_qsdp.schemes.loco`) runs on those partial sums ``p_t``::

    p_t = sum over the node's L ranks of decode_intra(encode_intra(g_t))   # hop 1, fp32, the intra codec
    c_t = p_t + e_{t-1}                                                    # compensate
    send encode(c_t)                                                       # hop 2, the side's codec, M - 1 chunks
    e_t = beta * e_{t-1} + (1 - beta) * (c_t - decode(encode(c_t)))

and each owner sums the ``M`` decoded versions of its chunk (:func:`~composer_qsdp.comm.two_level_reduce_scatter`
with ``inter_residual``). The intra-node hop keeps no residual: its error is not fed back, so by default it carries
:data:`INTRA_CODEC`, 8-bit min-max codes with stochastic rounding (the ``w8g8`` preset's gradients; SDP4Bit's TLq-HS
sends 8 bits within the node too), whatever the side's codec. ``intra_codec="same"`` sends the side's codec on both
hops (for a LoCo preset's 3-bit round-to-nearest codes that is a biased error no step corrects). With a Hadamard
``rotation_block`` the partial sums, and so the residual, are in the rotated domain (chunks padded to whole blocks).

Memory per GPU, for a unit of ``P`` gradient elements (FSDP's padded ``W * n``; with a rotation, ``n`` rounded up to
whole blocks) on ``W = M * L`` ranks: a residual of ``P / L`` elements, i.e. ``4 P / L`` bytes in fp32, ``2 P / L``
in bf16, ``(1 + 4 / bucket_size) P / L`` as int8 codes (against ``P`` elements for ``loco``); its storage, options,
reset clock, checkpoint piece and resume rules are ``loco``'s (:class:`~composer_qsdp.schemes.loco.LoCoFeedback`). A
residual is saved with the number of ranks and of nodes, and restarts from zero with a
:class:`~composer_qsdp.schemes.loco.LoCoResidualWarning` when either differs on a resume. On one node (``L = W``)
there is no inter-node hop: no residual and no feedback, ``0`` bytes, exactly ``two_level``. With one rank per node
(``L = 1``) the one hop crosses nodes and this is ``loco`` (with the side's codec): a residual of ``P`` elements.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch

from composer_qsdp.quant import Codec
from composer_qsdp.schemes.loco import LoCoFeedback
from composer_qsdp.schemes.two_level import TwoLevelReduceScatter

__all__ = ["INTRA_CODEC", "TwoLevelLoCoReduceScatter"]

#: The intra-node hop's default codec (options of :func:`~composer_qsdp.quant.make_codec`): no residual corrects that
#: hop, so it needs an error that averages out (unbiased) and is small, whatever the fed-back side's codec.
INTRA_CODEC: Mapping[str, Any] = MappingProxyType({"name": "minmax", "bits": 8, "bucket_size": 1024,
                                                   "rounding": "stochastic"})


class TwoLevelLoCoReduceScatter(LoCoFeedback, TwoLevelReduceScatter):
    """Two-hop quantized reduce-scatter with a per-rank LoCo residual of the inter-node hop (module docstring).

    Args:
        codec: the inter-node hop's codec (the side's codec; its errors are fed back).
        error_sample_interval: measure the relative quantization error (both hops; the inter hop's against the
            compensated partial sums) every this many calls (0: never).
        intra_codec: the intra-node hop's codec: a codec's options (default :data:`INTRA_CODEC`), ``"same"`` (the
            side's codec) or ``None`` (unquantized), as for ``two_level``.
        rotation_block: Hadamard block in elements (a power of two), or ``None``, as for ``two_level``.
        beta: the residual's moving-average coefficient, in ``[0, 1)`` (0: classic error feedback).
        reset_every: zero the residual every this many optimizer steps (0: never).
        residual_dtype: the residual's storage: ``"float32"``, ``"bfloat16"`` or ``"int8"`` (8-bit symmetric
            codes, one fp32 scale per bucket of the codec's ``bucket_size``).
        residual_on_host: keep the residual in pinned host memory and copy it to the device for each call and back.

    Attributes:
        residual: this rank's residual (``M * m`` elements: ``M`` nodes, ``m`` the chunk's elements, padded to
            whole rotation blocks; a float tensor or a :class:`~composer_qsdp.quant.CodedResidual` of ``M`` rows),
            ``None`` before the first call and always on one node.

    Raises:
        ValueError: no codec, or an invalid option, naming it and what is allowed.
    """

    name = "two_level_loco"

    def __init__(
        self,
        codec: Codec | None,
        error_sample_interval: int = 0,
        *,
        intra_codec: str | Mapping[str, Any] | None = INTRA_CODEC,
        rotation_block: int | None = None,
        beta: float = 0.8,
        reset_every: int = 0,
        residual_dtype: str = "float32",
        residual_on_host: bool = False,
    ) -> None:
        super().__init__(codec, error_sample_interval, intra_codec=intra_codec, rotation_block=rotation_block)
        self._init_feedback(beta, reset_every, residual_dtype, residual_on_host)

    def _feedback(self, input: torch.Tensor) -> dict[str, Any]:
        assert self.node_split is not None  # set with the group
        if self.node_split.nodes == 1:  # no inter-node hop: nothing to feed back, no residual kept
            return {}
        return {"inter_residual": self._residual_for(input), "inter_beta": self.beta}

    def _residual_rows(self) -> int:
        assert self.node_split is not None
        return self.node_split.nodes  # one partial sum per node: the chunks of this local index

    def _residual_numel(self, input: torch.Tensor) -> int:
        assert self.group is not None and self.node_split is not None
        n = input.numel() // self.group.size()
        block = self.rotation_block
        return self.node_split.nodes * (n if block is None else -(-n // block) * block)

    def _partition(self) -> dict[str, int]:
        # The same ranks split into other nodes give each rank other partial sums to feed back.
        assert self.node_split is not None
        return {**super()._partition(), "residual_nodes": self.node_split.nodes}

    def describe(self) -> str:
        split = self.node_split
        if split is not None and split.nodes == 1:
            return f"{super().describe()}, no error feedback (one node: no inter-node hop)"
        return f"{super().describe()}, {self._feedback_text()} on the inter-node hop"
