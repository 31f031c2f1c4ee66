"""docs/presets.md's memory model ("What each preset costs in memory"): the device bytes per GPU that a QSDP
configuration's schemes keep beyond plain FSDP2's own state, as a formula in ``P`` (the parameters of the units a side
runs on), ``g`` (ranks per node) and ``W`` (ranks).

=========================================  ====================================================================
weights ``direct``                         0 (each call's codes are freed after it)
weights ``difference`` (qWD)               ``e P``: one replica of the weights in the all-gather dtype, ``e``
                                           bytes per element (2: bf16, the recipes' mixed precision)
weights ``difference``, sharded_reference  ``e P / g``: each rank keeps its local index's shards, one per node
weights ``difference``, reference_on_host  0: the reference (either of the above) is in host memory
gradients ``flat``, ``two_level``          0
gradients ``loco``                         ``r P``: the residual, ``r`` = 4 (fp32), 2 (bf16), ``1 + 4 / b``
                                           (int8 codes and one fp32 scale per gradient bucket of ``b``)
gradients ``two_level_loco``               ``r P / g`` on several nodes (the inter-node hop's residual), 0 on one
gradients ``*loco``, residual_on_host      0: the residual (either of the above) is in host memory
=========================================  ====================================================================

So ``qwd-w3g3-loco`` adds ``(2 + 1 + 4/256) P`` in bf16, and its lean layout (``grad_scheme=two_level_loco``,
``weight_scheme_options.sharded_reference=true``) ``(3 + 4/256) P / g`` on several nodes. Exact when FSDP2 pads
nothing (each parameter's first dimension a multiple of ``W``) and every rank's chunk of a unit fills whole gradient
buckets; otherwise the schemes keep the padded sizes, a difference of a few elements per parameter.

Not a benchmark itself; ``bench_memory.py`` compares it with measured peaks and ``QSDPHandle.memory_bytes()``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from composer_qsdp.config import QSDPConfig

__all__ = ["SIDES", "SideCost", "extra_bytes", "side_costs"]

#: The two sides of a configuration, as QSDP names them.
SIDES = ("weights", "grads")
#: The schemes that keep nothing between calls.
_STATELESS = {"weights": ("direct",), "grads": ("flat", "two_level")}


@dataclass(frozen=True)
class SideCost:
    """What one side of a configuration keeps per GPU.

    Attributes:
        per_param: bytes per parameter of the units the side runs on.
        formula: the table's expression with the run's numbers (``"2 P / 2"``, ``"(1 + 4/256) P"``, ``"0"``).
    """

    per_param: float
    formula: str


def side_costs(config: QSDPConfig, world_size: int, ranks_per_node: int, gather_bytes: int = 2) -> dict[str, SideCost]:
    """The cost of each side of ``config`` on ``world_size`` ranks in nodes of ``ranks_per_node``.

    Args:
        config: a fixed configuration (``policy="fixed"``) with one scheme per side.
        world_size: ranks ``W`` of the FSDP group.
        ranks_per_node: ranks ``g`` per (virtual) node, dividing ``world_size`` (``world_size``: one node).
        gather_bytes: bytes per element of the weight all-gathers (2: bf16 mixed precision; 4: fp32).

    Raises:
        ValueError: a topology that does not divide, ``policy="auto"`` (its schemes are chosen while it runs),
            ``scheme_overrides`` (units on another scheme than their side's), or a scheme the table does not cover.
    """
    if not 1 <= ranks_per_node <= world_size or world_size % ranks_per_node:
        raise ValueError(f"ranks_per_node={ranks_per_node} is invalid for {world_size} ranks; it must divide them")
    if config.policy != "fixed":
        raise ValueError(f"policy={config.policy!r} chooses its schemes while it runs: the memory model covers "
                         "fixed configurations only")
    for side in SIDES:
        if getattr(config, side).scheme_overrides:
            raise ValueError(f"{side} scheme_overrides put some units on another scheme: the memory model covers "
                             "one scheme per side")
    nodes = world_size // ranks_per_node
    costs = {}
    for side, default in (("weights", "direct"), ("grads", "flat")):
        settings = getattr(config, side)
        scheme = settings.scheme or default
        options = settings.scheme_options
        if settings.bits is None or scheme in _STATELESS[side]:
            costs[side] = SideCost(0.0, "0")
        elif scheme == "difference" and getattr(options, "reference_on_host", False):
            costs[side] = SideCost(0.0, "0 (reference in host memory)")
        elif scheme == "difference":
            sharded = getattr(options, "sharded_reference", False)
            over = ranks_per_node if sharded else 1
            costs[side] = SideCost(gather_bytes / over, f"{gather_bytes} P{_over(over)}")
        elif scheme in ("loco", "two_level_loco") and getattr(options, "residual_on_host", False):
            costs[side] = SideCost(0.0, "0 (residual in host memory)")
        elif scheme in ("loco", "two_level_loco"):
            dtype = getattr(options, "residual_dtype", "float32")
            per_element, text = {"float32": (4.0, "4"), "bfloat16": (2.0, "2"),
                                 "int8": (1 + 4 / settings.bucket_size, f"(1 + 4/{settings.bucket_size})")}[dtype]
            if scheme == "loco":
                costs[side] = SideCost(per_element, f"{text} P")
            elif nodes == 1:  # no inter-node hop, so no residual
                costs[side] = SideCost(0.0, "0 (one node)")
            else:
                costs[side] = SideCost(per_element / ranks_per_node, f"{text} P{_over(ranks_per_node)}")
        else:
            raise ValueError(f"the memory model has no formula for the {side} scheme {scheme!r} (docs/presets.md "
                             "covers direct, difference, flat, two_level, loco and two_level_loco)")
    return costs


def _over(ranks_per_node: int) -> str:
    return f" / {ranks_per_node}" if ranks_per_node > 1 else ""


def extra_bytes(config: QSDPConfig, params: Mapping[str, int], world_size: int, ranks_per_node: int,
                gather_bytes: int = 2) -> dict[str, float]:
    """Predicted bytes per GPU that ``config``'s schemes keep, by side: :func:`side_costs` times ``params[side]``,
    the parameters of the units whose side QSDP quantizes (see :func:`side_costs` for the other arguments)."""
    costs = side_costs(config, world_size, ranks_per_node, gather_bytes)
    return {side: costs[side].per_param * params[side] for side in SIDES}
