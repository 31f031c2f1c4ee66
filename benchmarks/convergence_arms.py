"""The convergence driver's arms: each a recipe of the family plus overrides, the baseline its final loss is compared
with and its processes (:class:`Arm`, the table :data:`ARMS`), the named sets of them (:data:`DEFAULT_ARMS`,
:data:`MATRIX_ARMS`), and the variants a run derives from them: at a multiple of the recipe's learning rate
(``NAME@lr<S>x``), with another recipe seed (``NAME@s<SEED>``), compared with another plain FSDP2 baseline; and the
names records written before the arms were renamed give them (:data:`RENAMED_ARMS`, :func:`current_name`).

Nothing here reads a recipe or starts a process: ``convergence.py --arms`` names these arms, and its module
docstring says what each one measures.
"""

from __future__ import annotations

import collections
import dataclasses
from dataclasses import dataclass
from typing import Optional

import e2e_common as common


@dataclass(frozen=True)
class Arm:
    """One convergence arm: a recipe of the family plus overrides.

    Attributes:
        recipe: file name in the recipe directory.
        overrides: ``key=value`` recipe overrides.
        description: what it is, for the table.
        baseline: the arm its final loss is compared with.
        nproc: its processes (ranks); None: ``--nproc``.
        lr: the learning rate it trains with (``optimizer.lr``, applied after every other override); None: the
            recipe's.
        lr_scale: ``lr`` as a multiple of the recipe's (``--lr-scales``); None for an arm at the recipe's rate.
    """

    recipe: str
    overrides: tuple[str, ...]
    description: str
    baseline: str = "baseline"
    nproc: Optional[int] = None
    lr: Optional[float] = None
    lr_scale: Optional[float] = None


#: 0/1 Adam on DeepSpeed's schedule (the recipes' until the dense 8-bit variance phase replaced it): the variance
#: updated with exact fp32 all-reduces at doubling intervals (16 per interval) until the end of the warm-up, then
#: local steps whose interval doubles every 0.05 of the run up to 8. The ablation arms below start from it.
DEEPSPEED = ("algorithms.zero_one_adam.var_freeze_step=${scheduler.t_warmup}",
             "algorithms.zero_one_adam.var_update_scaler=16", "algorithms.zero_one_adam.variance_codec=null",
             "algorithms.zero_one_adam.local_step_scaler=0.05dur", "algorithms.zero_one_adam.local_step_clipper=8")
#: The recipes' local steps until the 4-rank runs: up to 2, the interval doubling every 0.15dur (2 from 0.4dur).
LOCAL2 = ("algorithms.zero_one_adam.local_step_clipper=2", "algorithms.zero_one_adam.local_step_scaler=0.15dur")
#: Up to 4, the interval doubling every 0.15dur (4 from 0.55dur: 13.28x).
LOCAL4 = ("algorithms.zero_one_adam.local_step_clipper=4", "algorithms.zero_one_adam.local_step_scaler=0.15dur")
#: That with the frozen variance rescaled per bucket by the synchronized squared gradients.
RESCALE = (*LOCAL4, "algorithms.zero_one_adam.variance_rescale=true")

#: The LoCo residual as 8-bit codes (``residual_dtype``, the LoCo presets' own; their other scheme options stay).
INT8_RESIDUAL = "algorithms.qsdp.grad_scheme_options.residual_dtype=int8"

#: 8-bit weights rounded to nearest in buckets of 256 that never straddle two parameters (issue 50's candidate for
#: a lossless default): a lower error per gather than stochastic rounding in buckets of 1024, at 2% more bytes.
W8_NEAREST = ("algorithms.qsdp.weight_rounding=nearest", "algorithms.qsdp.weight_bucket_size=256",
              "algorithms.qsdp.weight_scheme_options.align_buckets=true")

Q = "algorithms.qsdp."

#: QSDP's W8G4 as the paper states it (the ``w8g4-paper`` preset) over ``qsdp-w8g8.yaml``: its 8-bit weights, and
#: 4-bit min-max gradients with stochastic rounding in buckets of 1024, no state kept. The arms of the paper's 4-bit
#: gradients start from it, not from ``qsdp-w8g4.yaml``, whose preset ``w8g4`` has been the LoCo gradients since
#: issue 50, so that what they run does not move with the preset.
W8G4_PAPER = (f"{Q}grad_bits=4",)

ARMS: dict[str, Arm] = {
    "baseline": Arm("baseline.yaml", (), "plain Composer FSDP2"),
    "baseline-1r": Arm("baseline.yaml", (), "plain Composer FSDP2 on one rank: the same global batch by gradient "
                       "accumulation, the mathematics of the 2-rank baseline without its communication", nproc=1),
    "w8g8": Arm("qsdp-w8g8.yaml", (), "QSDP W8G8, min-max, stochastic rounding"),
    "w4g4": Arm("qsdp-w4g4.yaml", (), "QSDP W4G4, min-max, stochastic rounding"),
    "w4g4-learned": Arm("qsdp-w4g4.yaml", ("algorithms.qsdp.weight_codec=learned",
                                           "algorithms.qsdp.grad_codec=learned"),
                        "QSDP W4G4, learned levels on weights and gradients"),
    "w4g4-hadamard": Arm("qsdp-w4g4.yaml", ("algorithms.qsdp.grad_codec_options.hadamard=true",),
                         "QSDP W4G4, min-max, Hadamard-rotated gradients"),
    "w8g4": Arm("qsdp-w8g4.yaml", (), "QSDP W8G4: 8-bit weights as w8g8, 4-bit gradients in Hadamard-rotated "
                "groups of 256 rounded to nearest, with LoCo's error feedback (beta 0.5) from an int8 residual of "
                "each rank's unsharded gradient"),
    "w8g4-paper": Arm("qsdp-w8g8.yaml", W8G4_PAPER, "QSDP W8G4 as the paper states it: 8-bit weights, 4-bit "
                      "gradients, min-max, stochastic rounding, buckets of 1024, no state kept"),
    "w8g8-nearest": Arm("qsdp-w8g8.yaml", W8_NEAREST, "QSDP W8G8 with 8-bit weights rounded to nearest in "
                        "parameter-aligned buckets of 256; gradients as w8g8"),
    "w8g4-nearest": Arm("qsdp-w8g8.yaml", (*W8G4_PAPER, *W8_NEAREST), "QSDP W8G4 (the paper's) with 8-bit weights "
                        "rounded to nearest in parameter-aligned buckets of 256; gradients as w8g4-paper"),
    "qwd-w4g8": Arm("qsdp-w8g8.yaml", ("algorithms.qsdp.weight_scheme=difference", "algorithms.qsdp.weight_bits=4",
                                       "algorithms.qsdp.weight_codec=symmetric",
                                       "algorithms.qsdp.weight_bucket_size=2048"),
                    "4-bit weight differences (SDP4Bit qWD: symmetric INT4, groups of 2048), 8-bit gradients"),
    "qwd-w4g4": Arm("qwd-w4g4.yaml", (), "qWD INT4 weights, one-hop 4-bit Hadamard gradients in groups of 128"),
    "sdp4bit": Arm("sdp4bit.yaml", (), "SDP4Bit: qWD INT4 weights, TLq-HS gradients (INT8 within a node)"),
    "baseline-seed2": Arm("baseline.yaml", ("seed=18",), "plain Composer FSDP2, seed 18 (other initial weights and "
                                                         "data order): the run-to-run noise band"),
    "policy-auto": Arm("baseline.yaml", ("algorithms.qsdp.policy=auto",),
                       "QSDP's bandwidth-aware policy (policy=auto) picks bits / qWD per unit and side"),
    "policy-auto-3bit": Arm("baseline.yaml", common.AUTO_3BIT,
                            "policy=auto offered the opt-in 3-bit candidates too: 3-bit weight differences (qwd3) "
                            "and 3-bit gradients with LoCo's error feedback (g3loco)"),
    "policy-auto-4bit": Arm("baseline.yaml", common.AUTO_4BIT,
                            "policy=auto offered the opt-in 4-bit candidates too: 4-bit weight differences (qwd4) "
                            "and 4-bit stochastic gradients (g4)"),
    "sdp4bit-2x2": Arm("sdp4bit.yaml", ("algorithms.qsdp.ranks_per_node=2",),
                       "SDP4Bit on 4 ranks as 2 nodes x 2: the INT4 inter-node hop is taken", nproc=4),
    "tlq-hs-2x2": Arm("baseline.yaml", ("algorithms.qsdp.preset=tlq-hs", "algorithms.qsdp.ranks_per_node=2"),
                      "SDP4Bit's TLq-HS gradients (INT8 intra, INT4 inter-node), W8 weights; 4 ranks as 2 nodes x 2",
                      nproc=4),
    "zeropp-2x2": Arm("zeropp.yaml", ("algorithms.qsdp.ranks_per_node=2",),
                      "ZeRO++ qwZ (INT8 blocks of 4096) + qgZ (INT4, two hops); 4 ranks as 2 nodes x 2", nproc=4),
    "qwd-w4g2-loco": Arm("qwd-w4g2-loco.yaml", (), "qWD INT4 weights, 2-bit Hadamard gradients with LoCo error "
                                                   "feedback (nearest rounding, beta 0.5)"),
    "qwd-w3g3-loco": Arm("qwd-w3g3-loco.yaml", (), "qWD INT3 weights, 3-bit Hadamard gradients with LoCo error "
                                                   "feedback"),
    "qwd-w3g2-loco": Arm("qwd-w3g2-loco.yaml", (), "qWD INT3 weights, 2-bit Hadamard gradients with LoCo error "
                                                   "feedback"),
    "qwd-w4g3-loco": Arm("qwd-w4g3-loco.yaml", (), "qWD INT4 weights, 3-bit Hadamard gradients with LoCo error "
                                                   "feedback"),
    "qwd-w3g3-loco-lean-2x2": Arm("qwd-w3g3-loco.yaml", (common.LEAN_WEIGHTS, common.LEAN_GRADS,
                                                        "algorithms.qsdp.ranks_per_node=2"),
                                  "qwd-w3g3-loco in the lean layout (bench_memory's): the reference sharded within the "
                                  "node, LoCo's feedback on the inter-node hop's 3-bit gradients, 8-bit stochastic "
                                  "ones within the node; 4 ranks as 2 nodes x 2", nproc=4),
    "w8g4-lean-2x2": Arm("qsdp-w8g4.yaml", (common.LEAN_GRADS, "algorithms.qsdp.ranks_per_node=2"),
                         "w8g4 in the lean layout (bench_memory's): LoCo's feedback on the inter-node hop's 4-bit "
                         "gradients, 8-bit stochastic ones within the node; 4 ranks as 2 nodes x 2", nproc=4),
    "qwd-w3g3-loco-ahead": Arm("qwd-w3g3-loco.yaml", ("algorithms.qsdp.speculative_update=true",),
                               "qwd-w3g3-loco with each unit's next update sent during the backward "
                               "(speculative_update): the same training bit for bit, its metrics give the hit rate"),
    "qwd-w3g3-loco-seed2": Arm("qwd-w3g3-loco.yaml", ("seed=18",),
                               "qwd-w3g3-loco with seed 18, baseline-seed2's initial weights and data order"),
    "qwd-w3g2-loco-seed2": Arm("qwd-w3g2-loco.yaml", ("seed=18",),
                               "qwd-w3g2-loco with seed 18, baseline-seed2's initial weights and data order"),
    "qwd-w4g3-loco-int8": Arm("qwd-w4g3-loco.yaml", (INT8_RESIDUAL,),
                              "qwd-w4g3-loco with its LoCo residual stored as 8-bit codes (one fp32 scale per "
                              "bucket of 256), named explicitly"),
    "qwd-w4g3-loco-fp32": Arm("qwd-w4g3-loco.yaml", ("algorithms.qsdp.grad_scheme_options.residual_dtype=float32",),
                              "qwd-w4g3-loco with its LoCo residual in fp32 (the scheme's exact recursion)"),
    "qwd-w4g3-loco-int8-seed2": Arm("qwd-w4g3-loco.yaml", (INT8_RESIDUAL, "seed=18"),
                                    "qwd-w4g3-loco-int8 with seed 18, baseline-seed2's initial weights and data order"),
    "qwd-w3g2-loco-int8": Arm("qwd-w3g2-loco.yaml", (INT8_RESIDUAL,),
                              "qwd-w3g2-loco with its LoCo residual stored as 8-bit codes"),
    "qwd-w4g3-loco-bf16": Arm("qwd-w4g3-loco.yaml", ("algorithms.qsdp.grad_scheme_options.residual_dtype=bfloat16",),
                              "qwd-w4g3-loco with its LoCo residual stored in bf16"),
    "qwd-w3g4-loco": Arm("qwd-w3g3-loco.yaml", ("algorithms.qsdp.grad_bits=4",),
                         "qwd-w3g3-loco with 4-bit gradients (LoCo error feedback): which side the 3 bits cost"),
    "qwd-w4g2-nofb": Arm("qwd-w4g4.yaml", ("algorithms.qsdp.grad_bits=2", "algorithms.qsdp.grad_bucket_size=256"),
                         "qwd-w4g2-loco's bytes without error feedback (2-bit stochastic gradients): the control"),
    "ddp-baseline": Arm("ddp-baseline.yaml", (), "plain Composer DDP, the recipe's AdamW", "ddp-baseline"),
    "ddp-baseline-4r": Arm("ddp-baseline.yaml", (), "plain Composer DDP, the recipe's AdamW, 4 ranks", "ddp-baseline-4r",
                           nproc=4),
    "zero-one-adam": Arm("zero-one-adam.yaml", (), "0/1 Adam under DDP (the recipe: dense 8-bit variance phase "
                         "until 0.25dur, then local steps up to 4, reached at 0.75dur)", "ddp-baseline"),
    "zero-one-adam-4r": Arm("zero-one-adam.yaml", (), "0/1 Adam under DDP, 4 ranks", "ddp-baseline-4r", nproc=4),
    "zero-one-adam-local2": Arm("zero-one-adam.yaml", LOCAL2, "0/1 Adam, local steps up to 2 (from 0.4dur)",
                                "ddp-baseline"),
    "zero-one-adam-local2-4r": Arm("zero-one-adam.yaml", LOCAL2, "0/1 Adam, local steps up to 2 (from 0.4dur), "
                                   "4 ranks", "ddp-baseline-4r", nproc=4),
    "zero-one-adam-local4": Arm("zero-one-adam.yaml", LOCAL4, "0/1 Adam, local steps up to 4 from 0.55dur",
                                "ddp-baseline"),
    "zero-one-adam-local4-4r": Arm("zero-one-adam.yaml", LOCAL4, "0/1 Adam, local steps up to 4 from 0.55dur, "
                                   "4 ranks", "ddp-baseline-4r", nproc=4),
    "zero-one-adam-rescale": Arm("zero-one-adam.yaml", RESCALE, "0/1 Adam, local steps up to 4, the frozen variance "
                                 "rescaled per bucket", "ddp-baseline"),
    "zero-one-adam-rescale-4r": Arm("zero-one-adam.yaml", RESCALE, "0/1 Adam, local steps up to 4, the frozen "
                                    "variance rescaled per bucket, 4 ranks", "ddp-baseline-4r", nproc=4),
    "zero-one-adam-4r-sync": Arm("zero-one-adam.yaml", ("algorithms.zero_one_adam.local_step_clipper=1",),
                                 "the recipe without local steps (a 1-bit sync every step after the freeze), "
                                 "4 ranks", "ddp-baseline-4r", nproc=4),
    "zero-one-adam-deepspeed": Arm("zero-one-adam.yaml", DEEPSPEED, "0/1 Adam on DeepSpeed's schedule (sparse exact "
                                   "variance updates, freeze at the warm-up end, local steps up to 8)", "ddp-baseline"),
    "zero-one-adam-1bit": Arm("zero-one-adam.yaml", (*DEEPSPEED, "algorithms.zero_one_adam.local_step_clipper=1"),
                              "DeepSpeed's schedule without local steps (a 1-bit sync every step)", "ddp-baseline"),
    "zero-one-adam-fp32": Arm("zero-one-adam.yaml", (*DEEPSPEED, "algorithms.zero_one_adam.codec=null"),
                              "DeepSpeed's schedule without compression (variance freezing and local steps only)",
                              "ddp-baseline"),
    "zero-one-adam-densev": Arm("zero-one-adam.yaml", (*DEEPSPEED, "algorithms.zero_one_adam.var_update_scaler=100000"),
                                "DeepSpeed's schedule with the variance updated (exact fp32 all-reduce) at every step "
                                "until the freeze", "ddp-baseline"),
    "zero-one-adam-exact": Arm("zero-one-adam.yaml", (*DEEPSPEED, "algorithms.zero_one_adam.var_update_scaler=100000",
                                                      "algorithms.zero_one_adam.var_freeze_step=1.0dur"),
                               "0/1 Adam that never freezes: an exact fp32 all-reduce and variance update every step "
                               "(AdamW with the step bound and the optimizer's clipping)", "ddp-baseline"),
}


#: Sides that ablate a preset one choice at a time (issues 46 and 50): each arm keeps one side of a preset and
#: leaves the other unquantized, or changes one option of a LoCo preset, so a gap can be charged to a side and a
#: choice. Each entry: recipe, overrides, what it isolates.
_ABLATIONS: dict[str, tuple[str, tuple[str, ...], str]] = {
    # 8-bit weights alone: rounding, bucket, rotation, QSDP's random-shift quantizer (gradients unquantized)
    "w8-only": ("qsdp-w8g8.yaml", (f"{Q}grad_bits=null",), "w8g8's weights alone (stochastic, buckets of 1024)"),
    "w8-nearest-only": ("qsdp-w8g8.yaml", (*W8_NEAREST, f"{Q}grad_bits=null"),
                        "w8g8-nearest's weights alone (nearest, aligned buckets of 256)"),
    "w8-nearest-b1024-only": ("qsdp-w8g8.yaml", (f"{Q}weight_rounding=nearest", f"{Q}grad_bits=null"),
                              "8-bit weights rounded to nearest in buckets of 1024: the rounding alone"),
    "w8-b256-only": ("qsdp-w8g8.yaml", (f"{Q}weight_bucket_size=256", f"{Q}weight_scheme_options.align_buckets=true",
                                        f"{Q}grad_bits=null"),
                     "8-bit stochastic weights in aligned buckets of 256: the bucket alone"),
    # Aligned: in buckets that run across parameters a LayerNorm's gains rotate into one coefficient that sets the
    # step of the whole bucket (5.6x the weight error at GPT-125M's init). Aligned buckets hide that only while the
    # gains are all 1: once training spreads them, their own rotated buckets carry it (weight error 0.030 in training).
    "w8-hadamard-only": ("qsdp-w8g8.yaml", (f"{Q}weight_codec_options.hadamard=true",
                                            f"{Q}weight_scheme_options.align_buckets=true", f"{Q}grad_bits=null"),
                         "8-bit stochastic weights rotated by a Hadamard transform per bucket, buckets of 1024 "
                         "aligned to parameters"),
    "w8-random-shift-only": ("qsdp-w8g8.yaml", (f"{Q}weight_codec=random_shift", f"{Q}grad_bits=null"),
                             "8-bit weights by QSDP's random-shift lattice quantizer (its analysis)"),
    # gradients alone (weights unquantized)
    "g8-only": ("qsdp-w8g8.yaml", (f"{Q}weight_bits=null",), "w8g8's 8-bit stochastic gradients alone"),
    "g4-only": ("qsdp-w8g8.yaml", (*W8G4_PAPER, f"{Q}weight_bits=null"),
                "w8g4-paper's 4-bit stochastic gradients alone"),
    # w8g4-paper with less gradient error per step (issue 50: it ends +0.27% on GPT-350M's prose, w8g8 -0.24%): the
    # same 8-bit weights, 4-bit gradients within 10% of its bytes. The other candidate, the LoCo presets' gradients
    # at 4 bits (error feedback across steps), won and is the arm w8g4.
    "w8g4-paper-h128": ("qsdp-w8g8.yaml", (*W8G4_PAPER, f"{Q}grad_bucket_size=128",
                                           f"{Q}grad_codec_options.hadamard=true"),
                        "w8g4-paper with its 4-bit stochastic gradients Hadamard-rotated in groups of 128 (qwd-w4g4's "
                        "gradients): 11% more gradient bytes, no state kept"),
    # the LoCo presets' sides: qWD weights with unquantized gradients, LoCo gradients with unquantized weights
    "qwd3-only": ("qwd-w3g3-loco.yaml", (f"{Q}grad_bits=null", f"{Q}grad_scheme=flat", f"{Q}grad_scheme_options={{}}"),
                  "qwd-w3g3-loco's 3-bit weight differences alone"),
    "qwd4-only": ("qwd-w4g3-loco.yaml", (f"{Q}grad_bits=null", f"{Q}grad_scheme=flat", f"{Q}grad_scheme_options={{}}"),
                  "qwd-w4g3-loco's 4-bit weight differences alone"),
    **{f"g{bits}loco-only": ("qwd-w4g3-loco.yaml", (f"{Q}weight_bits=null", f"{Q}weight_scheme=direct",
                                                    f"{Q}grad_bits={bits}"),
                             f"{bits}-bit LoCo gradients (as the presets') alone")
       for bits in (2, 3, 4)},
    # one option of qwd-w3g3-loco at a time
    "qwd-w3g3-loco-fp32": ("qwd-w3g3-loco.yaml", (f"{Q}grad_scheme_options.residual_dtype=float32",),
                           "qwd-w3g3-loco with an fp32 residual"),
    "qwd-w3g3-loco-bf16": ("qwd-w3g3-loco.yaml", (f"{Q}grad_scheme_options.residual_dtype=bfloat16",),
                           "qwd-w3g3-loco with a bf16 residual"),
    "qwd-w3g3-loco-beta0": ("qwd-w3g3-loco.yaml", (f"{Q}grad_scheme_options.beta=0.0",),
                            "qwd-w3g3-loco with classic error feedback (beta 0)"),
    "qwd-w3g3-loco-beta0.8": ("qwd-w3g3-loco.yaml", (f"{Q}grad_scheme_options.beta=0.8",),
                              "qwd-w3g3-loco with DeepSpeed's err_beta 0.8"),
    "qwd-w3g3-loco-stochastic": ("qwd-w3g3-loco.yaml", (f"{Q}grad_rounding=stochastic",),
                                 "qwd-w3g3-loco with stochastic gradient rounding"),
    "qwd-w3g3-loco-g128": ("qwd-w3g3-loco.yaml", (f"{Q}grad_bucket_size=128",),
                           "qwd-w3g3-loco with gradient groups of 128"),
    "qwd-w3g3-loco-nohadamard": ("qwd-w3g3-loco.yaml", (f"{Q}grad_codec_options.hadamard=false",),
                                 "qwd-w3g3-loco without the gradients' Hadamard rotation"),
}
ARMS.update({name: Arm(recipe, overrides, description) for name, (recipe, overrides, description) in _ABLATIONS.items()})

#: The plain FSDP2 runs (two seeds): a combined record gives every arm's gap to each of them.
FSDP_BASELINES = ("baseline", "baseline-seed2")
#: The arms run when ``--arms`` is not given: the FSDP ones.
DEFAULT_ARMS = ("baseline", "w8g8", "w4g4", "w4g4-learned", "w4g4-hadamard", "w8g4", "qwd-w4g8", "qwd-w4g4",
                "sdp4bit")
#: ``--matrix``: every seed system once (issue 22), FSDP2 with two seeds for the noise band.
MATRIX_ARMS = ("baseline", "baseline-seed2", "ddp-baseline", "w8g8", "w8g4", "w4g4", "qwd-w4g4", "sdp4bit-2x2",
               "tlq-hs-2x2", "zeropp-2x2", "policy-auto", "zero-one-adam")


#: Joins an arm's name and its learning-rate scale: ``zero-one-adam@lr2x`` is ``zero-one-adam`` at twice the lr.
LR_MARK = "@lr"


def lr_arm_name(arm: str, scale: float) -> str:
    """The name of ``arm`` at ``scale`` times its recipe's learning rate, e.g. ``ddp-baseline@lr0.5x``."""
    return f"{arm}{LR_MARK}{scale:g}x"


def base_arm(name: str) -> str:
    """The arm of :data:`ARMS` that ``name`` (an arm, its :func:`lr_arm_name`, its :func:`seed_arm_name`, or a
    combined record's :func:`run_arm_name` of any of them) runs."""
    return name.split(LR_MARK, 1)[0].split(SEED_MARK, 1)[0].split(RUN_MARK, 1)[0]


#: Joins an arm's name and its seed: ``w8g8@s18`` is ``w8g8`` with the recipe's ``seed`` set to 18.
SEED_MARK = "@s"


def seed_arm_name(arm: str, seed: int) -> str:
    """The name of ``arm`` (or its learning-rate variant) run with recipe seed ``seed``, e.g. ``w8g8@s18``."""
    return f"{arm}{SEED_MARK}{seed}"


def arm_seed(name: str) -> int | None:
    """The seed of a :func:`seed_arm_name`, None for an arm without one."""
    _, mark, seed = name.rpartition(SEED_MARK)
    return int(seed) if mark and seed.isdigit() else None


def seedless_name(name: str) -> str:
    """``name`` without the seed of a :func:`seed_arm_name` (``w8g8@lr2x`` for ``w8g8@lr2x@s18``); ``name`` itself
    for an arm without one."""
    return name[:name.rindex(SEED_MARK)] if arm_seed(name) is not None else name


#: Joins an arm's name (with its variants) and the run of a combined record that ran it, where several runs hold
#: that name: ``w8g8@s18@run2`` is run 2's ``w8g8@s18``.
RUN_MARK = "@run"


def run_arm_name(name: str, run: int) -> str:
    """The label of run ``run``'s ``name`` (1-based) in a combined record, e.g. ``w8g8@s18@run2``."""
    return f"{name}{RUN_MARK}{run}"


#: The arms that records without ``arm_names`` (written before :data:`ARM_NAMES`) name otherwise, old name to new,
#: mapped at once, not chained: the arm ``w8g4`` ran the paper's stochastic 4-bit gradients until the LoCo ones (the
#: arm ``w8g4-loco``) became the ``w8g4`` preset.
RENAMED_ARMS = {"w8g4": "w8g4-paper", "w8g4-h128": "w8g4-paper-h128", "w8g4-loco": "w8g4"}
#: A record's ``arm_names``: its arms are named as :data:`ARMS` names them since :data:`RENAMED_ARMS`.
ARM_NAMES = 2


def current_name(name: str) -> str:
    """``name`` (an arm or its variant, as :func:`base_arm` reads it) from a record without ``arm_names``, as its arm
    is named now: its arm part through :data:`RENAMED_ARMS`, its marks kept (``w8g4-loco@s18@run9`` is
    ``w8g4@s18@run9``)."""
    arm = base_arm(name)
    return RENAMED_ARMS.get(arm, arm) + name[len(arm):]


def lr_scaled(arm: Arm, recipe_lr: float, scale: float) -> Arm:
    """``arm`` at ``scale`` times ``recipe_lr``, compared with its baseline at the same scale."""
    lr = recipe_lr * scale
    return dataclasses.replace(arm, description=f"{arm.description}; lr {lr:.3g} ({scale:g}x the recipe's)",
                               baseline=lr_arm_name(arm.baseline, scale), lr=lr, lr_scale=scale)


def lr_sweep_arms(arms: list[str], scales: list[float], recipe_lrs: dict[str, float | None]) -> dict[str, Arm]:
    """``--lr-scales``: each of ``arms`` at each of ``scales`` times the learning rate its recipe (with its
    overrides and ``-o``) trains with, ``recipe_lrs[arm]``; arm-major, in the order given. A scale of 1 trains with
    exactly the recipe's rate, so that arm is the unscaled one under another name.

    Raises:
        SystemExit: a scale that is not positive, two scales of one name, or an arm whose recipe sets no
            ``optimizer.lr``.
    """
    bad = [scale for scale in scales if not scale > 0]
    if bad:
        raise SystemExit(f"--lr-scales {bad[0]:g} is invalid; every scale must be > 0 (1: the recipe's rate)")
    names = collections.Counter(f"{scale:g}" for scale in dict.fromkeys(scales))
    if max(names.values()) > 1:
        raise SystemExit(f"--lr-scales {' '.join(map(repr, scales))}: two scales share the name "
                         f"{LR_MARK}{names.most_common(1)[0][0]}x; give scales that differ in 6 significant digits")
    unset = [arm for arm in arms if recipe_lrs[arm] is None]
    if unset:
        raise SystemExit(f"--lr-scales: arm {unset[0]}'s recipe sets no optimizer.lr to scale")
    return {lr_arm_name(arm, scale): lr_scaled(ARMS[arm], recipe_lrs[arm], scale)
            for arm in arms for scale in dict.fromkeys(scales)}


def compared_with(arm: Arm, baseline: str) -> Arm:
    """``--baseline``: ``arm`` compared with ``baseline`` (at the arm's learning-rate scale) where it was compared
    with plain FSDP2's ``baseline``; arms with another baseline (DDP's) keep theirs."""
    if base_arm(arm.baseline) != "baseline":
        return arm
    scaled = baseline if arm.lr_scale is None else lr_arm_name(baseline, arm.lr_scale)
    return dataclasses.replace(arm, baseline=scaled)


def seed_arms(arms: dict[str, Arm], seeds: list[int]) -> dict[str, Arm]:
    """``--seeds``: each arm once per seed (the recipe's ``seed``: initial weights and data order), as arms
    ``NAME@s<SEED>``, each compared with its baseline of the same seed; seed-major, so that a run stopped early has
    whole seeds of every arm rather than every seed of the first arms.

    Raises:
        SystemExit: a seed given twice, or outside ``[0, 2**32)``.
    """
    if len(set(seeds)) != len(seeds) or not all(0 <= seed < 2**32 for seed in seeds):
        raise SystemExit(f"--seeds {' '.join(map(str, seeds))} is invalid; give distinct integers in [0, 2**32)")
    return {seed_arm_name(name, seed): dataclasses.replace(
                arm, overrides=(*arm.overrides, f"seed={seed}"), baseline=seed_arm_name(arm.baseline, seed),
                description=f"{arm.description}; seed {seed}")
            for seed in seeds for name, arm in arms.items()}
