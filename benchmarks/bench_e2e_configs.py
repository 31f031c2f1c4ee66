"""The end-to-end benchmark's configurations and networks: each configuration a recipe of the family plus overrides,
with the baseline and the compute-only bound it is compared with and its window of untimed and timed steps
(:class:`Config`, the table :data:`CONFIGS`, the default sweep :data:`DEFAULT_CONFIGS`), and the NCCL environment
of each network (:data:`NETWORKS`). ``bench_e2e.py``'s module docstring says what each configuration measures.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass

from composer_qsdp.auto import AutoOptions
from composer_qsdp.config import QSDPConfig
from composer_qsdp.registry import PRESETS

import e2e_common as common


#: NCCL settings of each network; ``nvlink`` unsets the variables ``socket`` sets.
NETWORKS: dict[str, dict[str, str]] = {
    "nvlink": {},
    "socket": {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_NET": "Socket", "NCCL_SOCKET_IFNAME": "lo"},
}
_NETWORK_VARS = frozenset(NETWORKS["socket"])


def network_env(network: str) -> dict[str, str]:
    """The environment of a launch on ``network``: this process's, with the variables of :data:`NETWORKS` set as
    ``network`` sets them and unset where it does not."""
    env = {k: v for k, v in os.environ.items() if k not in _NETWORK_VARS}
    env.update(NETWORKS[network])
    return env


@dataclass(frozen=True)
class Config:
    """One measured configuration.

    Attributes:
        name: its name in ``--configs`` and the table.
        recipe: file name in the recipe directory.
        overrides: extra ``key=value`` overrides of this configuration.
        single_gpu: runs on one process (the compute-only bound) instead of all.
        description: what it is, for the table's legend.
        baseline: the configuration its tokens/s and wire bytes are compared with.
        bound: its compute-only bound.
        window: ``(warm-up, timed)`` steps of its own instead of ``--warmup``/``--steps``.
    """

    name: str
    recipe: str
    overrides: tuple[str, ...]
    single_gpu: bool
    description: str
    baseline: str = "baseline"
    bound: str = "compute-bound"
    window: tuple[int, int] | None = None
    hpz: bool = False  #: reshard after forward to the (virtual) node: ``fsdp.reshard_after_forward=--ranks-per-node``
    min_warmup: int = 0  #: untimed steps at least (``--warmup`` when larger)


_NO_ERROR_SAMPLING = ("algorithms.qsdp.error_sample_interval=0",)
#: Presets whose gradients take the two-level path, which hpZ (a secondary shard within the node) complements.
_HPZ_PRESETS = ("tlq-hs", "zeropp")
preset_names = QSDPConfig.preset_names
#: Steps after which policy=auto has settled, all untimed: its warm-up, as many steps again to re-check, and, after a
#: re-decision at that boundary, a keyframe step and the first weight-difference step (which compiles its kernels).
AUTO_SETTLED = 2 * AutoOptions().warmup_steps + 2
#: Each layout's changes to a preset that keeps state between calls: (the override of weight differences and what it
#: does, the same for LoCo gradients).
_LAYOUT_CHANGES = {
    "lean": ((common.LEAN_WEIGHTS, "the reference sharded within the node"),
             (common.LEAN_GRADS, "the LoCo residual on the inter-node hop only (two_level_loco)")),
    "host": (("algorithms.qsdp.weight_scheme_options.reference_on_host=true", "the reference in host memory"),
             ("algorithms.qsdp.grad_scheme_options.residual_on_host=true", "the LoCo residual in host memory")),
}


def _layout(base: Config, preset: str, layouts: tuple[str, ...]) -> Config | None:
    """``qsdp-<preset>-lean``, ``-host`` or ``-lean-host`` (``layouts``: keys of :data:`_LAYOUT_CHANGES`) of the
    preset's configuration ``base``, for a preset with weight differences or LoCo gradients (the sides with state
    between calls); None for the others."""
    options = PRESETS.lookup(preset)
    sides = (options.get("weight_scheme") == "difference", options.get("grad_scheme") == "loco")
    if not any(sides):
        return None
    changes = [change for layout in layouts for change, moved in zip(_LAYOUT_CHANGES[layout], sides) if moved]
    lean = " in the lean layout" if "lean" in layouts else ""
    return Config(f"{base.name}-{'-'.join(layouts)}", base.recipe, (*base.overrides, *(o for o, _ in changes)), False,
                  f"{base.description}{lean}: {', '.join(words for _, words in changes)}")


_PRESET_CONFIGS = {preset: Config(f"qsdp-{preset}", "baseline.yaml", (f"algorithms.qsdp.preset={preset}",
                                                                       *_NO_ERROR_SAMPLING), False,
                                  f"QSDP preset {preset}") for preset in preset_names()}
#: The presets with weight differences or LoCo gradients in their memory layouts: the reference sharded within the
#: node and the residual on the inter-node hop only (``-lean``), the reference and the residual in pinned host memory
#: (``-host``), or both (``-lean-host``).
_LAYOUTS = tuple(c for layouts in (("lean",), ("host",), ("lean", "host"))
                 for c in (_layout(base, p, layouts) for p, base in _PRESET_CONFIGS.items()) if c is not None)
LAYOUT_CONFIGS = tuple(c.name for c in _LAYOUTS)
CONFIGS: dict[str, Config] = {c.name: c for c in (
    Config("baseline", "baseline.yaml", (), False,
           "plain Composer FSDP2 in the recipe's mixed precision (paper recipes: bf16 weight all-gathers, fp32 "
           "gradient reduce-scatters)"),
    # Every preset, on the baseline recipe: the same model, batch and schedule, only the communication differs.
    *(config for preset, base in _PRESET_CONFIGS.items() for config in (
        base, *((dataclasses.replace(base, name=f"{base.name}-hpz", hpz=True,
                                     description=f"{base.description} with hpZ (reshard_after_forward = ranks per "
                                                 "node)"),) if preset in _HPZ_PRESETS else ()))),
    *(dataclasses.replace(base, name=f"{base.name}-twin",
                          overrides=(*base.overrides, "algorithms.qsdp.separate_grad_group=true"),
                          description=f"{base.description} with its gradient collectives on a second communicator of "
                                      "the same ranks (separate_grad_group)")
      for base in _PRESET_CONFIGS.values()),
    *(dataclasses.replace(base, name=f"{base.name}-ahead",
                          overrides=(*base.overrides, "algorithms.qsdp.speculative_update=true"),
                          description=f"{base.description} with each unit's next update sent during the backward "
                                      "(speculative_update)")
      for preset, base in _PRESET_CONFIGS.items() if PRESETS.lookup(preset).get("weight_scheme") == "difference"),
    Config("qsdp-auto", "baseline.yaml", ("algorithms.qsdp.policy=auto", *_NO_ERROR_SAMPLING), False,
           "QSDP policy=auto: measures the network and each unit's compute over the untimed steps, then picks "
           "off or 8 bits (its default candidates) per unit and side", min_warmup=AUTO_SETTLED),
    Config("qsdp-auto-3bit", "baseline.yaml", (*common.AUTO_3BIT, *_NO_ERROR_SAMPLING), False,
           "QSDP policy=auto offered the opt-in 3-bit candidates too: 3-bit weight differences (qwd3) and 3-bit "
           "gradients with LoCo's error feedback (g3loco)", min_warmup=AUTO_SETTLED),
    Config("qsdp-auto-4bit", "baseline.yaml", (*common.AUTO_4BIT, *_NO_ERROR_SAMPLING), False,
           "QSDP policy=auto offered the opt-in 4-bit candidates too: 4-bit weight differences (qwd4) and 4-bit "
           "stochastic gradients (g4)", min_warmup=AUTO_SETTLED),
    Config("compute-bound", "baseline.yaml", (), True,
           "baseline recipe on 1 GPU, same micro-batch and per-GPU batch: no inter-GPU traffic; tokens/s x N"),
    Config("compute-bound-layer", "baseline.yaml", (), True,
           "per-layer bound for models whose optimizer state does not fit one GPU: one transformer block's "
           "forward + backward timed on 1 GPU at the run's micro-batch (recomputed forward included with "
           "activation checkpointing) x layers, plus the embedding, head and loss, plus the optimizer step over "
           "1/N of the parameters; tokens/s x N"),
    *_LAYOUTS,
    Config("baseline-pure", "baseline.yaml", ("fsdp.mixed_precision=PURE",), False,
           "plain Composer FSDP2 with bf16 gradient reduce-scatters (fsdp.mixed_precision=PURE)"),
    *(Config(name, recipe, overrides, single, description, "ddp-baseline", "ddp-compute-bound", window)
      for name, recipe, overrides, single, description, window in (
        ("ddp-baseline", "ddp-baseline.yaml", (), False,
         "plain Composer DDP (the recipe's AdamW): every step all-reduces the fp32 gradients", None),
        ("zero-one-adam", "zero-one-adam.yaml",
         ("algorithms.zero_one_adam.var_freeze_step=16", "algorithms.zero_one_adam.local_step_scaler=1",
          "algorithms.zero_one_adam.local_step_clipper=16"), False,
         "0/1 Adam, local steps at interval 16: one 1-bit sync per 16 steps (steps 34-65)", (33, 32)),
        ("zero-one-adam-1bit", "zero-one-adam.yaml",
         ("algorithms.zero_one_adam.var_freeze_step=100000", "algorithms.zero_one_adam.var_update_scaler=1"),
         False, "0/1 Adam between variance updates: a 1-bit sync every step (steps 32-62)", (31, 31)),
        ("ddp-compute-bound", "ddp-baseline.yaml", (), True,
         "ddp-baseline recipe on 1 GPU, same micro-batch and per-GPU batch: no inter-GPU traffic; tokens/s x N",
         None),
    )),
)}
#: The default sweep: plain FSDP2, every preset (one node: no hpZ), policy=auto and the 1-GPU bound.
DEFAULT_CONFIGS = ("baseline", *(f"qsdp-{preset}" for preset in preset_names()), "qsdp-auto", "qsdp-auto-3bit",
                   "compute-bound")
#: The bounds a configuration's "of compute bound" can use, in order of preference.
BOUNDS = ("compute-bound", "compute-bound-layer")


def window(config: Config, args: argparse.Namespace) -> tuple[int, int]:
    """(warm-up, timed) steps of ``config``: its own window, else ``--warmup`` (at least its ``min_warmup``, and with
    ``--profile`` two more: the profiled batch after them and the one that absorbs the profiler's shutdown) and
    ``--steps``."""
    settle = config.min_warmup + (2 if config.min_warmup and args.profile else 0)
    return config.window or (max(args.warmup, settle), args.steps)
