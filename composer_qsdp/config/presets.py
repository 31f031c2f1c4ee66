"""Named presets: the flat options of each ``QSDPConfig`` preset, which ``QSDPConfig.from_preset("w8g4",
exclude=[...])`` builds with flat keyword changes (:mod:`composer_qsdp.config.settings`).

* ``w8g8``: QSDP's headline setting (8-bit weights and gradients, min-max, stochastic rounding, buckets of 1024).
  The default everywhere. Loss: lossless.

* ``w8g4``: 8-bit weights (``w8g8``'s) and 4-bit gradients in Hadamard-rotated groups of 256, rounded to nearest,
  with LoCo's error feedback (the LoCo presets' gradients, below, at 4 bits): half of ``w8g8``'s gradient bytes.
  The weights stay at 8 bits, since a directly quantized 4-bit weight is wrong in every forward (SDP4Bit §3.5,
  Table 3: +12% loss for direct INT4 weights at GPT-125M). It keeps one int8 residual of each unit's unsharded
  gradient per rank (``1 + 4/256`` bytes per parameter). Loss: lossless.
* ``w8g4-paper``: QSDP's W8G4 as the paper states it: 4-bit min-max gradients with stochastic rounding in buckets of
  1024, no state kept. Its gradient noise is unbiased but does not average out entirely. Loss: lossy (+0.27% on
  GPT-350M's ``prose``).
* ``w4g4``: 4-bit weights and gradients with the same codec: the fastest direct setting. Loss: lossy (about
  +9.5%: directly quantized 4-bit weights, SDP4Bit §3.5).
* ``sdp4bit``: SDP4Bit's full setting (Jia et al., NeurIPS 2024): qWD weights (quantized differences against a
  reference every rank keeps, §3.1: symmetric INT4 in groups of 2048, round to nearest) and TLq-HS gradients
  (below). Within one node the gradients take the intra-node INT8 hop only. Loss: unproven (below plain FSDP2's
  seed range on GPT-125M's ``prose`` corpus, -0.33% over three seeds, 2,000 steps; inside it on ``pysource``,
  -0.43% over three seeds; on ``csource`` one seed of three, inside the range; GPT-350M not run).
* ``qwd-w4g4``: qWD weights as ``sdp4bit``, with one-hop 4-bit gradients in groups of 128 (§3.2, Table 3: 128
  suffices) rotated by a Hadamard transform (SDP4Bit's "smoother") and our unbiased stochastic rounding, the best
  4-bit gradient setting of our round-1 measurements: 4 bits on both sides within one node. Loss: unproven.
* ``qwd-w4g2-loco``: qWD weights as ``qwd-w4g4``; 2-bit one-hop gradients, Hadamard-rotated, in groups of 256,
  rounded to nearest, with LoCo's error feedback (Xie et al., "LoCo: Low-Bit Communication Adaptor for
  Large-scale Model Training", 2024: each rank compensates its gradient with a moving average of its past
  compression errors; ``beta`` 0.5, where DeepSpeed's ``err_beta`` default is 0.8). The residual of each unit's
  unsharded gradient per rank is kept as 8-bit codes with one fp32 scale per gradient bucket (``residual_dtype``
  ``int8``: ``1 + 4/256`` bytes per parameter, against 4 in fp32), as LoCo keeps its compensation error. Error
  feedback corrects a biased compressor, so the gradients round to nearest (less error per call than stochastic
  rounding). Loss: lossy (about +2.1%).
* ``qwd-w4g3-loco``: 3-bit gradients, otherwise as ``qwd-w4g2-loco``. Loss: unproven.
* ``qwd-w3g3-loco``: 3-bit weight differences and 3-bit gradients, otherwise as ``qwd-w4g2-loco``. Loss: lossless.
* ``qwd-w3g2-loco``: 3-bit weight differences and 2-bit gradients: the fewest bytes. Loss: lossy (about +1-2%).

  Bytes of the qWD presets, per parameter and optimizer step with ``k`` microbatches per rank: the weight
  differences once (``w + 32/2048`` bits), the gradients ``k`` times (``g + 64/256``; ``qwd-w4g4``: ``4 + 64/128``).
  The run's counters (``qsdp/compression_vs_unquantized``) compare them with the same collectives unquantized, one
  bf16 gather and ``k`` fp32 reduce-scatters (``16 + 32k`` bits); plain FSDP2 also gathers for every microbatch's
  forward and backward (``64k`` bits), which the counters report as ``qsdp/compression_vs_plain_fsdp``.
* ``zeropp``: ZeRO++'s qwZ + qgZ. Weights: symmetric INT8 blocks of 4096 elements, round to nearest (DeepSpeed's
  qwZ quantizer aims at groups of 4k-8k elements). Gradients: the two-level reduce-scatter with symmetric INT4 on
  both hops, blocks of 2048 (DeepSpeed's qgZ uses one group per row of each gradient matrix: the hidden size,
  2048 at GPT-1.3B). ZeRO++'s hpZ is an FSDP setting: ``reshard_after_forward=<ranks per node>`` (see the QSDP
  README). Loss: lossy (+1.77% on GPT-125M's ``prose`` corpus, three seeds, 2,000 steps).
* ``tlq-hs``: SDP4Bit's gradients (§3.2, TLq-HS): the two-level reduce-scatter with symmetric INT8 within the node
  and INT4 across nodes, groups of 128, and a Hadamard rotation of 32-element blocks kept through the local
  reduction. Weights as ``w8g8``; ``sdp4bit`` pairs these gradients with qWD weights. Loss: unproven (inside
  plain FSDP2's seed range on GPT-125M's ``prose`` and ``pysource`` corpora, +0.11% and +0.88% over three seeds
  each, 2,000 steps; on ``csource`` one seed of three, inside the range; GPT-350M not run).

"Loss" is the preset's label in ``docs/presets.md``, from the seed protocol's records in ``benchmarks/RESULTS.md``:
lossless (the mean of three seeds inside or below plain FSDP2's seed range on all six cells: three corpora each at
GPT-125M and GPT-350M), lossy (above it, by about the amount given), or unproven (within plain FSDP2's spread in
fewer seeds or steps than the protocol asks). The page gives the evidence and each label's cells.

Each preset is a constant of this module (``W8G8``, ``QWD_W4G2_LOCO``...) that :data:`composer_qsdp.registry.PRESETS`
names; plain data: this module imports nothing of the package.

Flat options name one field of one side as ``weight_<field>`` / ``grad_<field>`` (the fields of
:class:`~composer_qsdp.config.SideConfig`: ``weight_bits``, ``grad_codec``, ``weight_bucket_size``,
``grad_rounding``, ``weight_codec_options``, ``grad_scheme``, ``weight_scheme_options``,
``grad_bits_overrides``...), ``bucket_size`` for both sides' bucket size (the per-side options win), or a
field of :class:`~composer_qsdp.config.QSDPConfig` (``exclude``, ``module_filter``, ``min_numel``, ``seed``,
``check_finite``, ``error_sample_interval``, ``ranks_per_node``, ``policy``, ``auto_options``, ``eval_weights``,
``separate_grad_group``).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "QWD_W3G2_LOCO", "QWD_W3G3_LOCO", "QWD_W4G2_LOCO", "QWD_W4G3_LOCO", "QWD_W4G4", "SDP4BIT", "TLQ_HS", "W4G4", "W8G4",
    "W8G4_PAPER", "W8G8", "ZEROPP",
]

# SDP4Bit's two halves (§3.1 qWD weights, §3.2 TLq-HS gradients), shared by the presets that use them.
_QWD_W4: dict[str, Any] = {
    "weight_scheme": "difference", "weight_codec": "symmetric", "weight_bits": 4, "weight_bucket_size": 2048,
}
# LoCo's error feedback on one-hop gradients (the "loco" gradient scheme).
_LOCO: dict[str, Any] = {
    "grad_scheme": "loco", "grad_rounding": "nearest", "grad_bucket_size": 256,
    "grad_codec_options": {"hadamard": True}, "grad_scheme_options": {"beta": 0.5, "residual_dtype": "int8"},
}
# Each preset as flat options over the defaults (``QSDPConfig()``), registered by name in
# :data:`composer_qsdp.registry.PRESETS`; :meth:`QSDPConfig.from_preset <composer_qsdp.config.QSDPConfig.from_preset>`
# builds them.
W8G8: dict[str, Any] = {}
W8G4_PAPER: dict[str, Any] = {"grad_bits": 4}
W4G4: dict[str, Any] = {"weight_bits": 4, "grad_bits": 4}
ZEROPP: dict[str, Any] = {
    "weight_codec": "symmetric", "weight_bits": 8, "weight_bucket_size": 4096,
    "grad_codec": "symmetric", "grad_bits": 4, "grad_bucket_size": 2048, "grad_scheme": "two_level",
}
TLQ_HS: dict[str, Any] = {
    "grad_codec": "symmetric", "grad_bits": 4, "grad_bucket_size": 128, "grad_scheme": "two_level",
    "grad_scheme_options": {"intra_codec": {"name": "symmetric", "bits": 8, "bucket_size": 128}, "rotation_block": 32},
}
SDP4BIT: dict[str, Any] = {**_QWD_W4, **TLQ_HS}
QWD_W4G4: dict[str, Any] = {**_QWD_W4, "grad_bits": 4, "grad_bucket_size": 128, "grad_codec_options": {"hadamard": True}}
W8G4: dict[str, Any] = {**_LOCO, "grad_bits": 4}
QWD_W4G2_LOCO: dict[str, Any] = {**_QWD_W4, **_LOCO, "grad_bits": 2}
QWD_W4G3_LOCO: dict[str, Any] = {**_QWD_W4, **_LOCO, "grad_bits": 3}
QWD_W3G3_LOCO: dict[str, Any] = {**_QWD_W4, "weight_bits": 3, **_LOCO, "grad_bits": 3}
QWD_W3G2_LOCO: dict[str, Any] = {**_QWD_W4, "weight_bits": 3, **_LOCO, "grad_bits": 2}
