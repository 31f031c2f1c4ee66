"""Convergence: validation-loss curves of the same GPT, data order, seed and hyperparameters under plain FSDP2 and
under each QSDP setting (and, when named, under plain DDP and 0/1 Adam), on a corpus large enough that no run sees
a sample twice.

Arms (``--arms``, the FSDP ones by default), each a recipe of the family (``--model 125m`` reads
``yamls/gpt-125m/``) plus overrides:

=================  ==============================================================================================
``baseline``        ``baseline.yaml``: plain Composer FSDP2
``w8g8``            ``qsdp-w8g8.yaml``: 8-bit min-max weights and gradients, stochastic rounding, buckets of 1024
``w4g4``            ``qsdp-w4g4.yaml``: 4-bit min-max weights and gradients
``w4g4-learned``    ``qsdp-w4g4.yaml`` with ``weight_codec=learned grad_codec=learned``: learned levels (QSDP
                    Algorithm 1) on both sides
``w4g4-hadamard``   ``qsdp-w4g4.yaml`` with ``grad_codec_options={hadamard: true}``: min-max gradients rotated by a
                    Walsh-Hadamard transform per bucket (SDP4Bit)
``w8g4``            ``qsdp-w8g4.yaml``: 8-bit weights, 4-bit gradients
``qwd-w4g8``        ``qsdp-w8g8.yaml`` with 4-bit weight differences (SDP4Bit qWD: ``weight_scheme=difference``,
                    symmetric INT4 in groups of 2048), 8-bit gradients
``qwd-w4g4``        ``qwd-w4g4.yaml``: qWD INT4 weights, one-hop 4-bit Hadamard gradients in groups of 128
``sdp4bit``         ``sdp4bit.yaml``: qWD INT4 weights, TLq-HS gradients (INT8 within a node, INT4 across)
=================  ==============================================================================================

More arms, named in ``--arms``: ``baseline-1r`` (plain FSDP2 on one rank, the same global batch by gradient
accumulation), ``w8g8-nearest`` / ``w8g4-nearest`` (8-bit weights rounded to nearest in parameter-aligned buckets of
256), the LoCo presets and their variants, and the ablations of :data:`_ABLATIONS` (one side of a preset alone, or
one option changed), each described in its :class:`Arm`.

Plain data parallelism (only when named in ``--arms``), each compared with ``ddp-baseline`` (``-4r``: 4 ranks,
with ``ddp-baseline-4r``):

===================================  ==============================================================================
``ddp-baseline``                      ``ddp-baseline.yaml``: Composer DDP with the recipe's AdamW (an fp32 all-reduce
                                      every step)
``zero-one-adam``                     ``zero-one-adam.yaml``: 0/1 Adam, the variance updated at every step until
                                      0.25dur through 8-bit all-reduces, then frozen; local steps whose interval
                                      doubles every 0.25dur up to 4 (2 from 0.5dur, 4 from 0.75dur); ``-4r``: on
                                      4 ranks
``zero-one-adam-4r-sync``             the recipe on 4 ranks without local steps (a 1-bit sync every step after
                                      the freeze)
``zero-one-adam-local2``              the interval doubling every 0.15dur up to 2 (from 0.4dur); ``-local4``: up
                                      to 4 (from 0.55dur); ``-rescale``: ``-local4`` with ``variance_rescale``
                                      (the frozen variance follows the synchronized squared gradients per
                                      bucket); ``-4r`` after any: on 4 ranks
``zero-one-adam-deepspeed``           DeepSpeed's schedule: sparse exact variance updates until the warm-up ends,
                                      local steps up to 8; ablations of it: ``-1bit`` (no local steps),
                                      ``-fp32`` (no compression), ``-densev`` (every step until the freeze updates
                                      the variance), ``-exact`` (never frozen: AdamW through the optimizer)
===================================  ==============================================================================

``--plan`` checks the arms' recipes and prints, for each 0/1 Adam arm, its schedule over ``--steps`` steps and the
byte ratio against DDP's fp32 all-reduce it is expected to reach, then exits (nothing is built or run).

``--lr-scales S ...`` sweeps the learning rate: every arm runs as arms ``NAME@lr<S>x`` (e.g. ``zero-one-adam@lr2x``)
at ``S`` times the ``optimizer.lr`` its recipe, its overrides and ``-o`` set, applied after every other override
(``S`` = 1 trains with exactly the recipe's rate), each compared with its baseline at the same scale
(``zero-one-adam@lr2x`` with ``ddp-baseline@lr2x``). The records, CSV, PNG and table name the rate, and the table adds
the sweep: per arm, each scale's final loss, the best scale among the arms that finished (marked at the sweep's
edge), and that best loss's gap to the best of its baseline (whether a lead survives tuning each arm's rate).

The table gives each arm's gap to its own baseline and, for the arms that count their bytes, the bytes this rank
sent over the whole run and how many times fewer than the baseline's collectives would have sent (QSDP: its
training batches against the same collectives unquantized, evaluations apart; 0/1 Adam: the whole run against
DDP's fp32 all-reduce at every step).

Every arm runs the recipe with the same shortened schedule: ``--steps`` batches (the cosine decay ends there) of
``--global-batch`` samples of ``--seq-len`` tokens, the recipe's seed (so the same initial weights and the same
shuffled sample order, on the same number of processes), evaluation every ``--eval-interval`` steps on the same
first ``--eval-batches`` batches of the held-out split.

Corpus (built once if missing, on the machine that runs the arms; ``--corpus-kind``, one of :data:`CORPORA`):
``pysource`` (default), every ``*.py`` file of the installed Python packages and the standard library
(``site.getsitepackages()`` and ``sysconfig``'s ``stdlib``, sorted paths, exact duplicates dropped); ``csource``, their
C, C++ and CUDA sources and headers; ``docstrings``, the docstrings of those ``*.py`` files (English prose about
code). Each is tokenized with GPT-2 BPE by ``python -m composer_qsdp.recipes.data.build <kind>``; a document goes to
the validation split when the hash of its text falls in ``--val-fraction``. ``<corpus>/manifest.json`` records the exact command, the interpreter, every
installed distribution and a SHA-256 over the files' relative paths and contents, so the same corpus can be
rebuilt and checked. The text belongs to those packages under their own licenses: it stays on the machine and is
never committed. The driver refuses to run when the train split is smaller than ``steps x global batch`` samples.

Resumable: each arm checkpoints every ``--save-interval`` steps and resumes from its newest checkpoint
(Composer ``autoresume``); each launch writes its own metrics file, rewritten after every evaluation, so a launch
killed by ``--time-budget`` or an outer limit loses no evaluation. A rerun continues unfinished arms and skips
finished ones. GPU kernels are not bitwise deterministic, so two runs of one arm with the same seed and data still
end at slightly different losses; ``baseline-seed2`` (another seed: other initial weights and data order) measures
the noise band every gap is read against.

Scheduling: arms start in ``--arms`` order (the first that fits) while the processes of all running arms fit
``--max-ranks``. With a GPU per rank, each arm holds ``nproc`` GPUs of its own (``CUDA_VISIBLE_DEVICES``). With
fewer GPUs than the widest arm's processes, a ``--max-ranks`` above the GPUs, or ``--shared-gpu true``, the arms
share every visible GPU: an arm with more processes than GPUs (every arm, with ``--shared-gpu true``) runs with the
recipes' ``shared_gpu=true``, its ranks sharing the GPUs over gloo (``composer_qsdp.shared_gpu``), which computes
what a GPU per rank would; an arm with at most one process per GPU keeps NCCL, a GPU per rank, on the GPUs that
the fewest processes of the running arms use (so 2-rank arms on 4 GPUs alternate between the two pairs), beside the
other arms' processes. Step times of such runs say nothing about a network. ``--max-ranks`` is the memory budget:
GPT-125M at sequence length 512 took 6.2-11 GiB per process at ``--micro-batch 8`` on an H100 (2026-11-25).

``--matrix`` runs every seed system once (:data:`MATRIX_ARMS`): FSDP2 with two seeds, DDP, W8G8, W8G4, W4G4,
qWD-W4G4, the policy ``auto`` and 0/1 Adam on ``--nproc`` processes, and the two-level schemes (SDP4Bit, TLq-HS,
ZeRO++) on 4 processes as 2 virtual nodes of 2 (``ranks_per_node=2``), so their inter-node hop is taken. FSDP arms
are compared with ``baseline``, and with ``baseline-seed2`` in a second gap; DDP arms with ``ddp-baseline``.

While arms run, the results files are rewritten every ``--results-interval-s`` from the arms' metrics files (which
each launch rewrites after every evaluation), so a killed driver loses nothing. ``--status`` (with the run's
arguments) prints each arm's state, last evaluation and checkpoint, and rewrites the results; ``--collect DIR``
also copies the results and one ``arms-logs.tar.gz`` of the arms' logs and metrics into ``DIR``: started detached
(``setsid nohup ... &``), the driver is polled and collected by later commands.

Corpus built elsewhere: ``--build-only --corpus DIR --max-train-tokens N`` builds a capped corpus (e.g. on a CPU
machine), and ``--data DIR`` runs on it (its ``manifest.json`` is recorded; it is never rebuilt).

Outputs, in ``--out-dir``, as ``convergence-<name>.csv`` (step, tokens, one validation-loss
column per arm), ``.json`` (curves, final losses, gaps to the baseline, QSDP compression and sampled errors,
settings, corpus manifest), ``.md`` (the summary table) and ``.png`` (all curves, and the second half zoomed).
``--replot RECORD.json`` redraws the PNG from a record (e.g. where matplotlib is missing on the GPU machine).
``--combine RUN1.json RUN2.json ...`` merges the records of several runs with the same settings and corpus (an arm
finished on a later machine, a repeated baseline that measures the run-to-run spread) into
``<first>-combined.{csv,json,md,png}``, with every arm's gap to every run's baseline.

Usage::

    python benchmarks/convergence.py --model 125m                      # the FSDP arms, 2 GPUs each
    python benchmarks/convergence.py --matrix --data DIR --micro-batch 8 --max-ranks 8   # one GPU, shared
    python benchmarks/convergence.py --matrix --data DIR --status      # progress (same arguments)
    python benchmarks/convergence.py --build-only                      # only the corpus
    python benchmarks/convergence.py --time-budget 500                 # stop cleanly; rerun to continue
"""

from __future__ import annotations

import argparse
import collections
import csv
import dataclasses
import hashlib
import importlib.metadata
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e_common as common  # noqa: E402
import seed_stats  # noqa: E402

VAL_LOSS = "metrics/val/LanguageCrossEntropy"
W8G8_TARGET_PCT = 1.0  # the project's target: W8G8 final validation loss within 1% of plain FSDP


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
    "w8g4": Arm("qsdp-w8g4.yaml", (), "QSDP W8G4, min-max, stochastic rounding"),
    "w8g8-nearest": Arm("qsdp-w8g8.yaml", W8_NEAREST, "QSDP W8G8 with 8-bit weights rounded to nearest in "
                        "parameter-aligned buckets of 256; gradients as w8g8"),
    "w8g4-nearest": Arm("qsdp-w8g4.yaml", W8_NEAREST, "QSDP W8G4 with 8-bit weights rounded to nearest in "
                        "parameter-aligned buckets of 256; gradients as w8g4"),
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
    "policy-auto-loco": Arm("baseline.yaml", common.AUTO_LOCO,
                            "policy=auto that may also pick the opt-in 3-bit candidates: 3-bit weight differences "
                            "(qwd3) and 3-bit LoCo gradients (g3loco)"),
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

Q = "algorithms.qsdp."
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
    "w8-hadamard-only": ("qsdp-w8g8.yaml", (f"{Q}weight_codec_options.hadamard=true", f"{Q}grad_bits=null"),
                         "8-bit stochastic weights rotated by a Hadamard transform per bucket"),
    "w8-random-shift-only": ("qsdp-w8g8.yaml", (f"{Q}weight_codec=random_shift", f"{Q}grad_bits=null"),
                             "8-bit weights by QSDP's random-shift lattice quantizer (its analysis)"),
    # gradients alone (weights unquantized)
    "g8-only": ("qsdp-w8g8.yaml", (f"{Q}weight_bits=null",), "w8g8's 8-bit stochastic gradients alone"),
    "g4-only": ("qsdp-w8g4.yaml", (f"{Q}weight_bits=null",), "w8g4's 4-bit stochastic gradients alone"),
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
ZERO_ONE_TARGET_PCT = 1.0  # issue 13: 0/1 Adam's final validation loss within 1% of DDP AdamW
ZERO_ONE_BYTES_TARGET = 10.0  # ... with at least 10x fewer bytes sent per rank than DDP's fp32 all-reduce
#: The 0/1 Adam arms whose target line the summary prints (the ablations attribute a gap and have none).
ZERO_ONE_TARGET_ARMS = ("zero-one-adam", "zero-one-adam-4r", "zero-one-adam-4r-sync", "zero-one-adam-local2",
                        "zero-one-adam-local2-4r", "zero-one-adam-local4", "zero-one-adam-local4-4r",
                        "zero-one-adam-rescale", "zero-one-adam-rescale-4r")


#: Joins an arm's name and its learning-rate scale: ``zero-one-adam@lr2x`` is ``zero-one-adam`` at twice the lr.
LR_MARK = "@lr"


def lr_arm_name(arm: str, scale: float) -> str:
    """The name of ``arm`` at ``scale`` times its recipe's learning rate, e.g. ``ddp-baseline@lr0.5x``."""
    return f"{arm}{LR_MARK}{scale:g}x"


def base_arm(name: str) -> str:
    """The arm of :data:`ARMS` that ``name`` (an arm, its :func:`lr_arm_name` or its :func:`seed_arm_name`) runs."""
    return name.split(LR_MARK, 1)[0].split(SEED_MARK, 1)[0]


#: Joins an arm's name and its seed: ``w8g8@s18`` is ``w8g8`` with the recipe's ``seed`` set to 18.
SEED_MARK = "@s"


def seed_arm_name(arm: str, seed: int) -> str:
    """The name of ``arm`` (or its learning-rate variant) run with recipe seed ``seed``, e.g. ``w8g8@s18``."""
    return f"{arm}{SEED_MARK}{seed}"


def arm_seed(name: str) -> int | None:
    """The seed of a :func:`seed_arm_name`, None for an arm without one."""
    _, mark, seed = name.rpartition(SEED_MARK)
    return int(seed) if mark and seed.isdigit() else None


def lr_scaled(arm: Arm, recipe_lr: float, scale: float) -> Arm:
    """``arm`` at ``scale`` times ``recipe_lr``, compared with its baseline at the same scale."""
    lr = recipe_lr * scale
    return dataclasses.replace(arm, description=f"{arm.description}; lr {lr:.3g} ({scale:g}x the recipe's)",
                               baseline=lr_arm_name(arm.baseline, scale), lr=lr, lr_scale=scale)


# ----------------------------------------------------------------------------------------------------- corpus
def split_samples(corpus: Path, split: str) -> int:
    """Samples in one split of an MDS shard directory (from its ``index.json``)."""
    index = common.read_json(corpus / split / "index.json")
    return sum(shard["samples"] for shard in index["shards"])


#: ``--corpus-kind``: the offline corpora of the protocol, three kinds of text, with what each build reads.
CORPORA: dict[str, str] = {
    "pysource": "every *.py file of the installed Python packages and the standard library",
    "csource": "every C, C++ and CUDA source and header file of the installed Python packages",
    "docstrings": "the docstrings of every *.py file of the installed Python packages and the standard library "
                  "(English prose about code)",
}


def source_fingerprint(kind: str, roots: list[str] | None) -> dict[str, Any]:
    """Files, bytes and a SHA-256 over (path relative to its root, SHA-256 of the content) of every file the
    ``kind`` build reads, in its order: equal fingerprints mean equal input text."""
    from composer_qsdp.recipes.data import default_python_source_roots, source_files
    from composer_qsdp.recipes.data.sources import C_SOURCE_PATTERNS

    if roots is None:
        roots = default_python_source_roots()
    dirs = sorted(Path(r).resolve() for r in roots)
    digest, total = hashlib.sha256(), 0
    files = source_files(C_SOURCE_PATTERNS if kind == "csource" else ("*.py",), dirs)
    for path in files:
        data = path.read_bytes()
        total += len(data)
        root = next(d for d in dirs if path.is_relative_to(d))
        digest.update(f"{path.relative_to(root)}\0".encode() + hashlib.sha256(data).digest())
    return {"roots": [str(d) for d in dirs], "files": len(files), "bytes": total, "sha256": digest.hexdigest()}


def build_corpus(corpus: Path, seq_len: int, val_fraction: float, inputs: str | None,
                 max_documents: int | None, max_train_tokens: int | None = None,
                 kind: str = "pysource") -> dict[str, Any]:
    """Build the ``kind`` shards (:data:`CORPORA`) at ``corpus`` unless present; returns its manifest (written
    beside them).

    Raises:
        SystemExit: the build failed (its log is named), an existing corpus was built from another kind or with
            another ``val_fraction``, or ``corpus`` exists without the manifest this function writes.
    """
    manifest_path = corpus / "manifest.json"
    if manifest_path.is_file():
        manifest = common.read_json(manifest_path)
        built = manifest.get("kind", "pysource")
        if manifest["val_fraction"] != val_fraction or manifest["seq_len"] != seq_len or built != kind:
            raise SystemExit(f"corpus {corpus} was built from {built} with val_fraction={manifest['val_fraction']}, "
                             f"seq_len={manifest['seq_len']}; pass those, or another --corpus")
        return manifest
    if corpus.exists():
        raise SystemExit(f"{corpus} exists but has no manifest.json (not built by this driver, or its build was "
                         "interrupted): remove it, or pass another --corpus")
    command = [sys.executable, "-m", "composer_qsdp.recipes.data.build", kind, str(corpus), "--seq-len",
               str(seq_len), "--val-fraction", str(val_fraction)]
    command += ["--input", inputs] if inputs else []
    command += ["--max-documents", str(max_documents)] if max_documents else []
    command += ["--max-train-tokens", str(max_train_tokens)] if max_train_tokens else []
    log = corpus.with_name(corpus.name + ".build.log")
    print(f"building the corpus: {' '.join(command)} (log: {log})", flush=True)
    t0 = time.monotonic()
    if common.run(command, log, os.environ, common.Budget(None)) != 0:
        raise SystemExit(f"corpus build failed; see {log}:\n{common.log_tail(log, 2000)}")
    manifest = {
        "kind": kind,
        "source": f"{kind}: {CORPORA[kind]} (sorted paths, exact duplicates dropped), GPT-2 BPE, documents split by "
                  "text hash",
        "command": " ".join(["python", *command[1:]]),
        "python": platform.python_version(),
        "seq_len": seq_len,
        "val_fraction": val_fraction,
        "max_documents": max_documents,
        "max_train_tokens": max_train_tokens,
        "input": source_fingerprint(kind, None if inputs is None else [inputs]),
        "samples": {split: split_samples(corpus, split) for split in ("train", "val")},
        "build_seconds": round(time.monotonic() - t0, 1),
        "distributions": sorted({f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions()
                                 if d.metadata["Name"]}),
        "license": "the text of the installed packages, under their own licenses: kept on this machine, "
                   "never committed",
    }
    manifest["tokens"] = {split: n * seq_len for split, n in manifest["samples"].items()}
    common.write_json(manifest_path, manifest)
    return manifest


def prebuilt_corpus(corpus: Path, seq_len: int) -> dict[str, Any]:
    """The manifest of shards built elsewhere by this driver (``--build-only``, then carried: ``--data``).

    Raises:
        SystemExit: no ``manifest.json`` or ``train``/``val`` index there, or shards of another sequence length.
    """
    manifest_path = corpus / "manifest.json"
    missing = [p for p in (manifest_path, corpus / "train" / "index.json", corpus / "val" / "index.json")
               if not p.is_file()]
    if missing:
        raise SystemExit(f"--data {corpus}: {', '.join(map(str, missing))} missing; build the corpus with "
                         "'python benchmarks/convergence.py --build-only --corpus DIR' and carry the whole DIR")
    manifest = common.read_json(manifest_path)
    if manifest["seq_len"] != seq_len:
        raise SystemExit(f"--data {corpus} holds samples of {manifest['seq_len']} tokens; pass --seq-len "
                         f"{manifest['seq_len']} or another corpus")
    return manifest


# ------------------------------------------------------------------------------------------------------- plan
@dataclass
class Plan(common.DriverPlan):
    """Everything the arms of one invocation share."""

    corpus: Path
    gpus: list[str]  #: visible GPU ids, empty on CPU
    shared: bool  #: the arms' ranks share the GPUs over gloo (the recipes' shared_gpu key)
    max_ranks: int  #: processes of all running arms together, at most
    settings: dict[str, Any]
    arms: dict[str, Arm]  #: every arm of the run by name: those of :data:`ARMS`, or their learning-rate variants

    @property
    def tokens_per_step(self) -> int:
        return self.args.global_batch * self.args.seq_len

    def nproc(self, arm: str) -> int:
        """Processes (ranks) of ``arm``."""
        return self.arms[arm].nproc or self.args.nproc

    def micro(self, arm: str) -> int:
        """Samples per forward/backward and process of ``arm``: ``--micro-batch``, at most its per-process batch."""
        per_rank = self.args.global_batch // self.nproc(arm)
        return min(self.args.micro_batch or per_rank, per_rank)

    def arm_dir(self, arm: str) -> Path:
        return self.out_dir / arm

    def gloo(self, arm: str) -> bool:
        """Whether ``arm``'s ranks share GPUs over gloo: in a shared plan, with more processes than GPUs or
        ``--shared-gpu true``; an arm with a GPU per rank keeps NCCL even while other arms use those GPUs."""
        return self.shared and (self.args.shared_gpu == "true" or self.nproc(arm) > len(self.gpus))

    def backend(self, arm: str) -> str:
        """The collective back end of ``arm``'s ranks."""
        return "gloo" if self.gloo(arm) or not self.gpus else "nccl"

    def overrides(self, arm: str, segment: int) -> list[str]:
        a, d = self.args, self.arm_dir(arm)
        return [f"run_name={arm}", "data.remote=null", f"data.local={self.corpus}", "data.train_split=train",
                "data.eval_split=val", f"model.max_seq_len={a.seq_len}", f"global_train_batch_size={a.global_batch}",
                f"device_train_microbatch_size={self.micro(arm)}", f"max_duration={a.steps}ba",
                f"eval_interval={a.eval_interval}ba", f"eval_subset_num_batches={a.eval_batches}",
                f"device_eval_batch_size={a.eval_batch_size}", f"save_folder={d / 'checkpoints'}",
                f"save_interval={a.save_interval}ba", "save_num_checkpoints_to_keep=1", "autoresume=true",
                "load_path=null", "progress_bar=false", "log_to_console=false", f"data.num_workers={a.num_workers}",
                f"metrics_file={d / f'metrics-{segment:02d}.json'}",
                *([f"shared_gpu={str(self.gloo(arm)).lower()}"] if self.shared else []), *self.arms[arm].overrides,
                *a.override,
                # Last: a swept rate scales what the recipe and every other override would set.
                *([f"optimizer.lr={self.arms[arm].lr!r}"] if self.arms[arm].lr is not None else [])]


def _visible_gpus() -> list[str]:
    if not torch.cuda.is_available():
        return []
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    return [g.strip() for g in listed.split(",") if g.strip()] if listed else \
        [str(i) for i in range(torch.cuda.device_count())]


def _plan(args: argparse.Namespace) -> Plan:
    args.arms = list(MATRIX_ARMS if args.matrix else dict.fromkeys(args.arms))
    recipe_dir = common.recipe_dir(args.model, args.recipe_dir)
    name = f"{recipe_dir.name}-t{args.seq_len}-b{args.global_batch}-s{args.steps}"
    out_dir = Path(args.out_dir or common.ROOT / "runs" / "convergence" / name).resolve()
    corpus = Path(args.data or args.corpus or
                  common.ROOT / "data" / f"{args.corpus_kind}-gpt2-t{args.seq_len}").resolve()
    nprocs = {arm: ARMS[arm].nproc or args.nproc for arm in args.arms}
    for arm, n in nprocs.items():
        if args.global_batch % n:
            raise SystemExit(f"--global-batch {args.global_batch} is not a multiple of arm {arm}'s {n} processes")
    if len(set(nprocs.values())) > 1 and args.eval_batches != -1:
        raise SystemExit(f"arms of {' and '.join(map(str, sorted(set(nprocs.values()))))} processes evaluate "
                         f"--eval-batches {args.eval_batches} batches per process, i.e. different held-out samples; "
                         "pass --eval-batches -1 (the whole val split, the same samples at every world size)")
    gpus = _visible_gpus()
    widest = max(nprocs.values())
    # Arms share the GPUs when one arm is wider than the GPUs or more processes than GPUs may run at once.
    oversubscribed = len(gpus) < widest or (args.max_ranks or 0) > len(gpus)
    shared = bool(gpus) and (args.shared_gpu == "true" or (args.shared_gpu == "auto" and oversubscribed))
    if gpus and not shared and len(gpus) < widest:
        raise SystemExit(f"--shared-gpu false: an arm of {widest} processes needs {widest} GPUs, {len(gpus)} visible")
    max_ranks = args.max_ranks or (len(gpus) if gpus and not shared else widest)
    if max_ranks < widest or (gpus and not shared and max_ranks > len(gpus)):
        raise SystemExit(f"--max-ranks {max_ranks} is invalid; it must be >= {widest} (the widest arm's processes)"
                         + (f" and <= {len(gpus)} (the GPUs, with --shared-gpu false)" if gpus and not shared
                            else ""))
    # What changes the numbers: two directories (or invocations) of different settings must not be mixed.
    settings = {"recipe_dir": str(recipe_dir), "steps": args.steps, "seq_len": args.seq_len,
                "global_batch": args.global_batch, "micro_batch": args.micro_batch, "nproc": args.nproc,
                "eval_interval": args.eval_interval, "eval_batches": args.eval_batches,
                "eval_batch_size": args.eval_batch_size, "corpus": str(corpus), "overrides": list(args.override),
                "shared_gpu": shared}
    plan = Plan(args, recipe_dir, name, out_dir, corpus, gpus, shared, max_ranks, settings,
                {arm: ARMS[arm] for arm in args.arms})
    recipes = _check_recipes(plan)
    if args.lr_scales:
        plan.arms = _lr_sweep_arms(args.arms, args.lr_scales,
                                   {arm: recipe.optimizer_kwargs.get("lr") for arm, recipe in recipes.items()})
        args.arms = list(plan.arms)
    if args.baseline:
        plan.arms = {name: _compared_with(arm, args.baseline) if base_arm(name) != args.baseline else arm
                     for name, arm in plan.arms.items()}
    if args.seeds:
        plan.arms = _seed_arms(plan.arms, args.seeds)
        args.arms = list(plan.arms)
    if args.lr_scales or args.seeds:
        _check_recipes(plan)
    return plan


def _check_recipes(plan: Plan) -> dict[str, Any]:
    """Every arm's recipe, loaded with its overrides at its world size: checked before any GPU time is spent.

    Raises:
        SystemExit: naming the arm and its recipe's error.
    """
    from composer_qsdp.recipes.train import RecipeError, load_recipe

    recipes = {}
    for arm, spec in plan.arms.items():
        try:
            recipes[arm] = load_recipe(plan.recipe_dir / spec.recipe, plan.overrides(arm, 0),
                                       world_size=plan.nproc(arm))
        except RecipeError as err:
            raise SystemExit(f"recipe error in arm {arm} ({spec.recipe}): {err}") from None
    return recipes


def _lr_sweep_arms(arms: list[str], scales: list[float], recipe_lrs: dict[str, float | None]) -> dict[str, Arm]:
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


def _compared_with(arm: Arm, baseline: str) -> Arm:
    """``--baseline``: ``arm`` compared with ``baseline`` (at the arm's learning-rate scale) where it was compared
    with plain FSDP2's ``baseline``; arms with another baseline (DDP's) keep theirs."""
    if base_arm(arm.baseline) != "baseline":
        return arm
    scaled = baseline if arm.lr_scale is None else lr_arm_name(baseline, arm.lr_scale)
    return dataclasses.replace(arm, baseline=scaled)


def _seed_arms(arms: dict[str, Arm], seeds: list[int]) -> dict[str, Arm]:
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


def print_zero_one_plans(plan: Plan) -> int:
    """``--plan``: each 0/1 Adam arm's schedule over ``--steps`` and its expected byte ratio against DDP's fp32
    all-reduce (the plan the algorithm logs at the start of a run), from the model's shapes on the meta device."""
    from composer_qsdp.recipes.loader import build_algorithm
    from composer_qsdp.recipes.models import ComposerGPT, HFCausalLMConfig
    from composer_qsdp.recipes.train import load_recipe

    for arm in plan.args.arms:
        recipe = load_recipe(plan.recipe_dir / plan.arms[arm].recipe, plan.overrides(arm, 0),
                             world_size=plan.nproc(arm))
        kwargs = recipe.algorithm_kwargs.get("zero_one_adam")
        if kwargs is None:
            print(f"{arm}: no 0/1 Adam")
            continue
        if isinstance(recipe.model_config, HFCausalLMConfig):
            print(f"{arm}: a Hugging Face model: no plan without its weights")
            continue
        with torch.device("meta"):
            params = [p for p in ComposerGPT(recipe.model_config).parameters() if p.requires_grad]
        schedule, ratio = build_algorithm("zero_one_adam", kwargs).plan(params, plan.args.steps)
        print(f"{arm} ({plan.nproc(arm)} ranks): {schedule}; {ratio:.2f}x fewer bytes than DDP's fp32 all-reduce"
              f"{'' if ratio >= ZERO_ONE_BYTES_TARGET else f' (below the {ZERO_ONE_BYTES_TARGET:g}x target)'}")
    return 0


def _check_corpus(plan: Plan, manifest: dict[str, Any]) -> None:
    need = plan.args.steps * plan.args.global_batch
    have = manifest["samples"]["train"]
    if have < need:
        raise SystemExit(f"the corpus has {have} train samples but {plan.args.steps} steps x {plan.args.global_batch} "
                         f"= {need} are needed so that no sample repeats; lower --steps/--global-batch/--seq-len or "
                         "give more text (--corpus-input)")
    if manifest["samples"]["val"] == 0:
        raise SystemExit("the corpus has no validation samples; raise --val-fraction")


# ------------------------------------------------------------------------------------------------ running arms
def _segments(arm_dir: Path) -> list[Path]:
    return sorted(arm_dir.glob("metrics-*.json"))


def _next_segment(arm_dir: Path) -> int:
    return len(list(arm_dir.glob("log-*.txt")))


def _queue(plan: Plan) -> list[str]:
    """The unfinished arms in launch order: ``--arms`` order, which is the priority when the time budget cannot
    finish every arm (the first queued arm that fits the free ranks starts next)."""
    return [arm for arm in plan.args.arms if not (plan.arm_dir(arm) / "done.json").is_file()]


def run_arms(plan: Plan, budget: common.Budget, on_progress: Callable[[], None] = lambda: None) -> str:
    """Run (or continue) every unfinished arm, as many at once as ``plan.max_ranks`` processes allow; calls
    ``on_progress`` about every ``--results-interval-s`` seconds while arms run. Returns ``"complete"``,
    ``"incomplete"`` (budget or signal) or ``"failed"`` (an arm's launch failed; it continues from its checkpoint
    on the next invocation)."""
    queue = _queue(plan)
    running: dict[str, tuple[subprocess.Popen, list[str]]] = {}  # arm -> (its launch, the GPUs it holds)
    free_gpus = [] if plan.shared else list(plan.gpus)
    failures = dict.fromkeys(queue, 0)
    failed, last_start, last_progress = False, float("-inf"), time.monotonic()
    try:
        while queue or running:
            for arm, (proc, held) in list(running.items()):
                if proc.poll() is None:
                    continue
                del running[arm]
                _write_running(plan, running)
                free_gpus += held
                if proc.returncode == 0:
                    common.write_json(plan.arm_dir(arm) / "done.json", {"segments": _next_segment(plan.arm_dir(arm))})
                    print(f"{arm}: finished", flush=True)
                elif failures[arm] < plan.args.retries:
                    # A launch can fail for reasons outside the arm (a port taken by a concurrent job, a node
                    # hiccup): continue from the checkpoint, after the other queued arms.
                    failures[arm] += 1
                    queue.append(arm)
                    print(f"{arm}: launch failed (status {proc.returncode}); retrying later "
                          f"({failures[arm]} of {plan.args.retries}); log in {plan.arm_dir(arm)}", flush=True)
                else:
                    failed = True
                    print(f"{arm}: launch failed (status {proc.returncode}); log in {plan.arm_dir(arm)}", flush=True)
            if running and budget.remaining() == 0:
                print("time budget spent: stopping the running arms (they resume from their checkpoints)")
                return "incomplete"
            if time.monotonic() - last_progress >= plan.args.results_interval_s:
                on_progress()
                last_progress = time.monotonic()
            busy = sum(plan.nproc(arm) for arm in running)
            fits = [arm for arm in queue if busy + plan.nproc(arm) <= plan.max_ranks]
            # Starts are spaced by --stagger-s: every launch's start-up (imports, CUDA contexts, shard reads)
            # competes for the same cores.
            spaced = not running or time.monotonic() - last_start >= plan.args.stagger_s
            if fits and spaced and budget.allows(plan.args.min_launch_s):
                arm = fits[0]
                queue.remove(arm)
                held = (_least_loaded_gpus(plan, arm, running) if plan.shared else
                        [] if not plan.gpus else free_gpus[:plan.nproc(arm)])
                free_gpus = [] if plan.shared else free_gpus[len(held):]
                running[arm] = (_start_arm(plan, arm, held), held)
                _write_running(plan, running)
                last_start = time.monotonic()
                continue
            if not running:
                if queue:
                    print(f"time budget nearly spent ({budget.remaining():.0f} s left): rerun to continue "
                          f"{', '.join(queue)}")
                    return "incomplete"
                break
            time.sleep(1.0)
    except common.Interrupted as sig:
        print(f"stopped by {sig}: the arms resume from their checkpoints on the next run")
        return "incomplete"
    finally:
        common.kill(*(proc for proc, _ in running.values()))
        _write_running(plan, {})
    return "failed" if failed else "complete"


def _least_loaded_gpus(plan: Plan, arm: str, running: dict[str, tuple[subprocess.Popen, list[str]]]) -> list[str]:
    """In a shared plan, the GPUs of ``arm``'s ranks: an arm over NCCL (a GPU per rank) takes those that the
    fewest processes of the ``running`` arms use, so that arms spread over every GPU instead of all putting rank r
    on the r-th; [] for an arm over gloo (its ranks use every GPU, rank r on the (r mod GPUs)-th)."""
    if plan.gloo(arm):
        return []
    load = dict.fromkeys(plan.gpus, 0)
    for other, (_, gpus) in running.items():
        used = gpus or plan.gpus
        for rank in range(plan.nproc(other)):
            load[used[rank % len(used)]] += 1
    chosen = sorted(plan.gpus, key=load.__getitem__)[:plan.nproc(arm)]  # stable: ties go to the first GPUs
    return sorted(chosen, key=plan.gpus.index)


def _start_arm(plan: Plan, arm: str, gpus: list[str]) -> subprocess.Popen:
    """Start the next launch of ``arm``: on ``gpus`` (one per rank), or on every visible GPU when the ranks share
    them."""
    arm_dir = plan.arm_dir(arm)
    segment = _next_segment(arm_dir)
    command = common.train_command(plan.nproc(arm), plan.recipe_dir / plan.arms[arm].recipe,
                                   plan.overrides(arm, segment))
    env = dict(os.environ)
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    common.write_json(arm_dir / "arm.json", {"arm": arm, **dataclasses.asdict(plan.arms[arm]),
                                             "nproc": plan.nproc(arm), "micro_batch": plan.micro(arm),
                                             "backend": plan.backend(arm), "settings": plan.settings})
    where = (f"GPUs {','.join(gpus)}{', shared with other arms (nccl)' if plan.shared else ''}" if gpus else
             "shared GPUs (gloo)" if plan.gloo(arm) else "CPU")
    print(f"{arm}: launch {segment}, {plan.nproc(arm)} processes on {where}", flush=True)
    return common.start(command, arm_dir / f"log-{segment:02d}.txt", env)


# ------------------------------------------------------------------------------------------------- collecting
def merged_metrics(arm_dir: Path) -> dict[str, dict[int, float]]:
    """Metric name -> {batch: value} over an arm's launches; a later launch's value wins (a resumed launch
    redoes the batches after its checkpoint)."""
    merged: dict[str, dict[int, float]] = {}
    for path in _segments(arm_dir):
        for name, series in common.read_json(path)["metrics"].items():
            merged.setdefault(name, {}).update({int(b): float(v) for b, v in series})
    return merged


def _mean(series: dict[int, float] | None) -> float | None:
    return statistics.fmean(series.values()) if series else None


def _training_ratio(metrics: dict[str, dict[int, float]],
                    name: str = "qsdp/compression_vs_unquantized") -> float | None:
    """QSDP's bytes over all training batches against a baseline, from the per-batch ratio ``name`` (the same
    collectives unquantized, or ``qsdp/compression_vs_plain_fsdp``: plain FSDP2): the sum of each batch's baseline
    bytes (its ratio times its bytes sent) over the sum of its bytes sent (a ratio of sums, so a batch that sends
    little, e.g. the one after a qWD evaluation, weighs what its bytes weigh). None where the run did not log it."""
    ratios = metrics.get(name)
    if not ratios:
        return None
    sides = [metrics.get(f"qsdp/{side}/bytes_sent", {}) for side in ("weights", "grads")]
    sent = {b: sum(side.get(b, 0.0) for side in sides) for b in ratios}
    total = sum(sent.values())
    return sum(ratios[b] * sent[b] for b in ratios) / total if total else None


def summarize(plan: Plan) -> dict[str, Any]:
    """Per arm: its validation curve, final loss, gap to its baseline's loss at the same step, the bytes it sent
    and their compression, QSDP's sampled errors, the median step time."""
    arms: dict[str, Any] = {}
    for arm in plan.args.arms:
        metrics = merged_metrics(plan.arm_dir(arm))
        curve = sorted(metrics.get(VAL_LOSS, {}).items())
        wall = sorted(metrics.get("time/train", {}).items())
        step_times = [(t1 - t0) * 3600.0 for (b0, t0), (b1, t1) in zip(wall, wall[1:]) if b1 == b0 + 1]
        arms[arm] = {
            "description": plan.arms[arm].description,
            "overrides": list(plan.arms[arm].overrides),
            "lr": plan.arms[arm].lr,
            "lr_scale": plan.arms[arm].lr_scale,
            "nproc": plan.nproc(arm),
            "micro_batch": plan.micro(arm),
            "backend": plan.backend(arm),
            "complete": (plan.arm_dir(arm) / "done.json").is_file(),
            "launches": _next_segment(plan.arm_dir(arm)),
            "curve": [[step, loss] for step, loss in curve],
            "final_step": curve[-1][0] if curve else None,
            "final_val_loss": curve[-1][1] if curve else None,
            # QSDP's over its training batches; 0/1 Adam logs the run's cumulative ratio, so its last value is the run's.
            "compression_vs_unquantized": (_training_ratio(metrics)
                                           or _last(metrics.get("zero_one_adam/compression_vs_fp32_allreduce"))),
            # Against plain FSDP2 on the same stack (every microbatch's gathers, the backward re-gather included).
            "compression_vs_plain_fsdp": _training_ratio(metrics, "qsdp/compression_vs_plain_fsdp"),
            "total_bytes_sent": (_last(metrics.get("qsdp/total_bytes_sent"))
                                 or _last(metrics.get("zero_one_adam/total_bytes_sent"))),
            "rel_error": {side: _mean(metrics.get(f"qsdp/{side}/rel_error")) for side in ("weights", "grads")},
            "step_time_s_median": statistics.median(step_times) if step_times else None,
        }
    for arm, record in arms.items():
        base = arms.get(plan.arms[arm].baseline)
        record["baseline"] = plan.arms[arm].baseline
        record["gap_vs_baseline_pct"] = _gap_pct(record, dict(base["curve"])) if base else None
        seed2 = arms.get("baseline-seed2")
        if plan.arms[arm].baseline == "baseline" and seed2 is not None:
            record["gap_vs_baseline_seed2_pct"] = _gap_pct(record, dict(seed2["curve"]))
    return arms


def seed_groups(arms: dict[str, Any], steps: int) -> dict[str, dict[str, Any]]:
    """``--seeds``: each arm's seeds against its baseline's seeds (:func:`seed_stats.compare`), by the arm's name
    without its seed; {} for a run without seeds. In a combined record an arm found in several runs (labelled
    ``@run<i>``) takes part under no seed."""
    curves: dict[str, dict[int, dict[int, float]]] = {}
    baselines: dict[str, str] = {}
    for name, r in arms.items():
        seed = arm_seed(name)
        if seed is None or arm_seed(r.get("baseline") or "") is None:
            continue
        group = name[:name.rindex(SEED_MARK)]
        curves.setdefault(group, {})[seed] = dict(r["curve"])
        baselines[group] = r["baseline"][:r["baseline"].rindex(SEED_MARK)]
    groups = {}
    for group, baseline in baselines.items():
        result = seed_stats.compare(curves[group], curves.get(baseline, {}), steps) if group != baseline else None
        groups[group] = {"baseline": baseline, "seeds": sorted(curves[group]),
                         "comparison": result.to_json() if result else None}
    return groups


def _mean_std(mean: float, std: float | None) -> str:
    return f"{mean:.4f}" if std is None else f"{mean:.4f} ({std:.4f})"


def _seed_lines(groups: dict[str, dict[str, Any]]) -> list[str]:
    rows = [(group, g, g["comparison"]) for group, g in groups.items() if g["comparison"]]
    if not rows:
        return []
    lines = ["", f"Seeds: each arm's final losses against its baseline's at the last step every seed of both reached; "
                 f"lossless when the arm's mean lies inside the baseline's seed range with >= {seed_stats.MIN_SEEDS} "
                 "complete seeds a side.", "",
             *_table_head(["arm", "vs", "step", "seeds", "mean (std)", "baseline mean (std)", "baseline range",
                           "gap of means", "paired gap", "Welch 95% CI (p)", "verdict"])]
    for group, g, c in rows:
        ci = "n/a" if c["ci95_pct"] is None else \
            f"{c['ci95_pct'][0]:+.2f}% .. {c['ci95_pct'][1]:+.2f}% (p {c['p_value']:.2f})"
        paired = "n/a" if c["paired_gap_pct"] is None else f"{c['paired_gap_pct']:+.2f}%"
        lines.append(f"| {group} | {g['baseline']} | {c['step']} | {len(c['arm_losses'])} vs "
                     f"{len(c['baseline_losses'])} | {_mean_std(c['arm_mean'], c['arm_std'])} | "
                     f"{_mean_std(c['baseline_mean'], c['baseline_std'])} | {c['baseline_range'][0]:.4f} .. "
                     f"{c['baseline_range'][1]:.4f} | {c['gap_pct']:+.2f}% | {paired} | {ci} | {c['verdict']} |")
    return lines


def noise_band_pct(arms: dict[str, Any]) -> float | None:
    """|gap| (%) between the two FSDP2 baselines' final validation losses (seeds 17 and 18) at the same step: what
    two runs of one system differ by; None unless both reached the same final step."""
    if "baseline" not in arms or "baseline-seed2" not in arms:
        return None
    gap = _gap_pct(arms["baseline-seed2"], dict(arms["baseline"]["curve"]))
    return None if gap is None else abs(gap)


def _last(series: dict[int, float] | None) -> float | None:
    return series[max(series)] if series else None


def _gap_pct(arm: dict[str, Any], baseline_curve: dict[int, float]) -> float | None:
    """The gap (%) of an arm's final validation loss to the baseline's at the same step; None where the baseline
    has no evaluation at that step."""
    step = arm["final_step"]
    if step not in baseline_curve:
        return None
    return 100.0 * (arm["final_val_loss"] - baseline_curve[step]) / baseline_curve[step]


def csv_text(tokens_per_step: int, arms: dict[str, Any]) -> str:
    """``step,tokens,<arm>...``: validation loss (nats/token) of each arm at each evaluation step; empty where
    an arm has no evaluation (yet)."""
    curves = {arm: dict(r["curve"]) for arm, r in arms.items()}
    steps = sorted({s for c in curves.values() for s in c})
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["step", "tokens", *arms])
    for step in steps:
        writer.writerow([step, step * tokens_per_step,
                         *(f"{curves[a][step]:.6f}" if step in curves[a] else "" for a in arms)])
    return buf.getvalue()


def markdown(plan: Plan, head: dict[str, str], manifest: dict[str, Any], arms: dict[str, Any],
             status: str) -> str:
    a = plan.args
    m = manifest
    lines = [f"### convergence: {plan.recipe_dir.name} on {head['device']}", "", *common.header_lines(head),
             f"- settings: {a.steps} steps x {a.global_batch} samples x {a.seq_len} tokens = "
             f"{a.steps * plan.tokens_per_step:,} tokens per arm; {_ranks_text(plan, arms)}; evaluation every "
             f"{a.eval_interval} steps on "
             + ("the whole held-out split" if a.eval_batches == -1 else
                f"{a.eval_batches} batches x {a.eval_batch_size} samples per process of the held-out split"),
             f"- corpus: `{m['command']}`: {m['input']['files']} files, {m['input']['bytes'] / 1e6:.1f} MB of "
             f"{m.get('kind', 'pysource')} text -> {m['tokens']['train']:,} train / {m['tokens']['val']:,} val tokens; input sha256 "
             f"`{m['input']['sha256'][:16]}`",
             f"- status: {status}", "", *_table_head(["arm", "ranks", *_arm_columns()])]
    lines += [_arm_row(arm, r, str(r["nproc"])) for arm, r in arms.items()]
    band = noise_band_pct(arms)
    if band is not None:
        gaps = {arm: r["gap_vs_baseline_seed2_pct"] for arm, r in arms.items()
                if r.get("gap_vs_baseline_seed2_pct") is not None and arm != "baseline-seed2"}
        lines += ["", f"Noise band: the FSDP2 baselines of seeds 17 and 18 end {band:.2f}% apart; an FSDP arm's gap "
                      "within that band is not a measured difference. Gaps to baseline-seed2: "
                      + ", ".join(f"{arm} {gap:+.2f}%" for arm, gap in gaps.items())]
    gap = arms.get("w8g8", {}).get("gap_vs_baseline_pct")
    lines += _w8g8_target({} if gap is None else {"": gap})
    for arm, r in arms.items():
        if base_arm(arm) in ZERO_ONE_TARGET_ARMS:
            lines += _zero_one_target(arm, r)
    lines += _lr_sweep_lines(lr_sweep(arms, a.steps))
    lines += _seed_lines(seed_groups(arms, a.steps))
    return "\n".join(lines) + "\n"


def lr_sweep(arms: dict[str, Any], steps: int) -> dict[str, Any]:
    """The learning-rate sweep (``--lr-scales``) by arm: each scale's learning rate and final validation loss,
    the best scale among those that finished all ``steps`` (``best_at_edge``: the smallest or largest swept, so the
    best rate may lie beyond), and the best loss's gap (%) to the best of the arm's baseline (so whether one arm's
    lead over another survives tuning each one's rate); {} without a sweep."""
    sweep: dict[str, Any] = {}
    for label, r in arms.items():
        if r.get("lr_scale") is None:
            continue
        entry = sweep.setdefault(base_arm(label), {"baseline": base_arm(r["baseline"]), "scales": {}})
        entry["scales"][f"{r['lr_scale']:g}"] = {"lr": r["lr"], "final_step": r["final_step"],
                                                  "final_val_loss": r["final_val_loss"],
                                                  "finished": r["final_step"] == steps}
    for entry in sweep.values():
        done = {scale: s["final_val_loss"] for scale, s in entry["scales"].items() if s["finished"]}
        entry["best_scale"] = min(done, key=done.get) if done else None
        entry["best_val_loss"] = done[entry["best_scale"]] if done else None
        swept = sorted(entry["scales"], key=float)
        entry["best_at_edge"] = len(swept) > 1 and entry["best_scale"] in (swept[0], swept[-1])
    for arm, entry in sweep.items():
        base = sweep.get(entry["baseline"], {}).get("best_val_loss")
        own = entry["best_val_loss"]
        entry["best_vs_baseline_best_pct"] = (None if arm == entry["baseline"] or base is None or own is None
                                              else 100.0 * (own - base) / base)
    return sweep


def _lr_sweep_lines(sweep: dict[str, Any]) -> list[str]:
    """The sweep's table: per arm, each scale's final loss (its lr), the best scale and its gap to the baseline's
    best; nothing without a sweep."""
    if not sweep:
        return []
    scales = list(dict.fromkeys(scale for entry in sweep.values() for scale in entry["scales"]))
    lines = ["", "Learning-rate sweep: final validation loss (lr) per multiple of the recipe's lr; best among the "
                 "arms that finished every step:", "",
             *_table_head(["arm", *(f"{scale}x" for scale in scales), "best", "best vs its baseline's best"])]
    for arm, entry in sweep.items():
        cells = [f"{common.fmt(s['final_val_loss'], '.4f')} ({s['lr']:.3g}){'' if s['finished'] else ' (partial)'}"
                 if (s := entry["scales"].get(scale)) else "" for scale in scales]
        best = ("n/a" if entry["best_scale"] is None else
                f"{entry['best_scale']}x{' (edge of the sweep)' if entry['best_at_edge'] else ''}")
        gap = "" if arm == entry["baseline"] else common.fmt(entry["best_vs_baseline_best_pct"], "+.2f", "%")
        lines.append(f"| {' | '.join([arm, *cells, best, gap])} |")
    return lines


def _ranks_text(plan: Plan, arms: dict[str, Any]) -> str:
    """Processes and micro-batches of the arms, and where their ranks ran."""
    by_n: dict[tuple[int, int], list[str]] = {}
    for arm, r in arms.items():
        by_n.setdefault((r["nproc"], r["micro_batch"]), []).append(arm)
    groups = "; ".join(f"{n} processes, micro-batch {m}: {', '.join(names)}" for (n, m), names in by_n.items())
    gloo = [arm for arm in arms if plan.gloo(arm)]
    where = (f"ranks sharing {len(plan.gpus)} GPU(s); over gloo (shared_gpu: the numerics of a GPU per rank): "
             f"{', '.join(gloo) or 'none'}; the others over NCCL, a GPU per rank; step times are not network "
             "measurements" if plan.shared else
             "a GPU per rank" if plan.gpus else "CPU processes (gloo)")
    return f"{groups}; {where}, at most {plan.max_ranks} processes at once"


def _arm_columns(gap: str = "vs baseline") -> list[str]:
    """The titles of ``_arm_row``'s columns after its leading cells; ``gap`` titles the gap to the baseline."""
    return ["final step", "final val loss", gap, "compression vs unquantized", "compression vs plain FSDP2",
            "GB sent per rank", "rel. error w / g",
            "step time (ms, median; arms may share GPUs)", "description"]


def _table_head(columns: list[str]) -> list[str]:
    """A markdown table's title row and rule."""
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def _arm_row(label: str, r: dict[str, Any], *extra: str) -> str:
    """A table row of one arm's record: ``label``, the ``extra`` cells, then the columns of ``_arm_columns``."""
    fmt = common.fmt
    err = r["rel_error"]
    step = "n/a" if r["final_step"] is None else f"{r['final_step']}{'' if r['complete'] else ' (partial)'}"
    step_ms = None if r["step_time_s_median"] is None else r["step_time_s_median"] * 1e3
    return (f"| {' | '.join([label, *extra])} | {step} | {fmt(r['final_val_loss'], '.4f')} "
            f"| {fmt(r['gap_vs_baseline_pct'], '+.2f', '%')} "
            f"| {fmt(r['compression_vs_unquantized'], '.2f', 'x')} "
            f"| {fmt(r.get('compression_vs_plain_fsdp'), '.2f', 'x')} "
            f"| {fmt(None if r.get('total_bytes_sent') is None else r['total_bytes_sent'] / 1e9, '.3f')} "
            f"| {fmt(err['weights'], '.3f')} / "
            f"{fmt(err['grads'], '.3f')} | {fmt(step_ms, '.0f')} | {r['description']} |")


def _w8g8_target(gaps_pct: dict[str, float]) -> list[str]:
    """The W8G8 target's lines: its gap to each baseline, by label ("" for its own run's only baseline)."""
    if not gaps_pct:
        return []
    verdicts = "; ".join(f"{f'vs {label}: ' if label else ''}{gap:+.2f}% "
                         f"({'met' if abs(gap) <= W8G8_TARGET_PCT else 'NOT met'}; W8G8 ended "
                         f"{'below' if gap < 0 else 'above'} the baseline)" for label, gap in gaps_pct.items())
    return ["", f"Target (measured, never asserted): W8G8 final validation loss within {W8G8_TARGET_PCT:.0f}% of "
                f"plain FSDP: {verdicts}"]


def _zero_one_target(arm: str, r: dict[str, Any] | None) -> list[str]:
    """The 0/1 Adam target's line of ``arm``: its final gap to DDP AdamW and its byte saving over the run."""
    if not r or r["gap_vs_baseline_pct"] is None:
        return []
    gap, ratio = r["gap_vs_baseline_pct"], r["compression_vs_unquantized"]
    loss = "met" if abs(gap) <= ZERO_ONE_TARGET_PCT else "NOT met"
    saved = "n/a" if ratio is None else f"{ratio:.1f}x ({'met' if ratio >= ZERO_ONE_BYTES_TARGET else 'NOT met'})"
    name = "0/1 Adam" if arm == "zero-one-adam" else f"0/1 Adam ({arm})"
    return ["", f"Target (measured, never asserted): {name} final validation loss within {ZERO_ONE_TARGET_PCT:.0f}% "
                f"of DDP AdamW: {gap:+.2f}% ({loss}); bytes sent per rank at least {ZERO_ONE_BYTES_TARGET:.0f}x fewer "
                f"than DDP's fp32 all-reduce: {saved}"]


def png_bytes(record: dict[str, Any]) -> bytes | None:
    """All arms' validation-loss curves (left) and their second half zoomed (right), as PNG; None without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no PNG; redraw it elsewhere with --replot <the .json record>")
        return None
    fig = _figure(record, plt)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _figure(record: dict[str, Any], plt: Any) -> Any:
    """The figure of :func:`png_bytes`. Each arm keeps one color in both panels: an arm that stopped before the
    zoomed half is missing there, and the color cycle would otherwise shift every later arm's color."""
    s = record["settings"]
    arms = list(record["arms"])
    palette = plt.get_cmap("tab10" if len(arms) <= 10 else "tab20").colors
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for ax, start in zip(axes, (0, s["steps"] // 2)):
        for i, (arm, r) in enumerate(record["arms"].items()):
            points = [(step, loss) for step, loss in r["curve"] if step >= start]
            if points:
                ax.plot(*zip(*points), marker=".", label=arm, color=palette[i % len(palette)])
        ax.set_xlabel(f"step ({s['global_batch']} x {s['seq_len']} tokens each)")
        ax.set_ylabel("validation loss (nats/token)")
        ax.grid(alpha=0.3)
    axes[0].set_title("validation loss")
    axes[1].set_title(f"from step {s['steps'] // 2}")
    axes[0].legend()
    tokens = s["steps"] * s["global_batch"] * s["seq_len"]
    fig.suptitle(f"{Path(s['recipe_dir']).name}: same seed, data order and hyperparameters; "
                 f"{tokens:,} tokens per arm ({record['header']['git']})")
    return fig


def write_results(plan: Plan, manifest: dict[str, Any], status: str, quiet: bool = False) -> dict[str, Any]:
    """Summarize every arm's metrics files into ``convergence-<name>`` .csv/.json/.md/.png in the results
    directory (printing the table unless ``quiet``: the progress writes while arms run); returns the record."""
    head = common.header(min(len(plan.gpus), plan.max_ranks) if plan.gpus else plan.max_ranks)
    if plan.shared:
        head["device"] += (f"; arms share the GPU(s), at most {plan.max_ranks} processes at once; arms with more "
                           "processes than GPUs over gloo (shared_gpu)")
    arms = summarize(plan)
    record = {"header": head, "settings": {**plan.settings, "max_ranks": plan.max_ranks}, "status": status,
              "corpus": manifest, "arms": arms, "noise_band_pct": noise_band_pct(arms),
              "lr_sweep": lr_sweep(arms, plan.args.steps), "seed_groups": seed_groups(arms, plan.args.steps)}
    md = markdown(plan, head, manifest, arms, status)
    _write_record(f"convergence-{plan.name}", plan.out_dir, record, csv_text(plan.tokens_per_step, arms), md)
    if not quiet:
        print(md)
    return record


def _write_record(stem: str, out_dir: Path, record: dict[str, Any], csv_body: str, md: str) -> list[Path]:
    """``stem`` .csv, .json, .md and (with matplotlib) .png into ``out_dir``; the paths written."""
    files: dict[str, str | bytes] = {".csv": csv_body, ".json": json.dumps(record, indent=1), ".md": md}
    png = png_bytes(record)
    if png is not None:
        files[".png"] = png
    return common.write_outputs(stem, out_dir, files)


# ----------------------------------------------------------------------------------------------- status, collect
def _write_running(plan: Plan, running: dict[str, tuple[subprocess.Popen, list[str]]]) -> None:
    """Record the driver's and its running launches' process ids for ``--status`` (another process)."""
    common.write_json(plan.out_dir / "running.json",
                      {"driver": os.getpid(), "launches": {arm: proc.pid for arm, (proc, _) in running.items()}})


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def running_launches(plan: Plan) -> dict[str, int]:
    """Arm -> launcher process id of the launches the driver recorded as running and that are still alive."""
    path = plan.out_dir / "running.json"
    if not path.is_file():
        return {}
    return {arm: pid for arm, pid in common.read_json(path)["launches"].items() if _alive(pid)}


def arm_progress(plan: Plan, arm: str) -> dict[str, Any]:
    """Where ``arm`` stands, from its directory: state (done / running / stopped / failed / not started), last
    evaluation, last checkpoint, launches, and its newest log's last line."""
    arm_dir = plan.arm_dir(arm)
    curve = sorted(merged_metrics(arm_dir).get(VAL_LOSS, {}).items()) if arm_dir.is_dir() else []
    logs = sorted(arm_dir.glob("log-*.txt"))
    latest = arm_dir / "checkpoints" / "latest-rank0.pt"
    checkpoint = os.readlink(latest).rsplit("ba", 1)[-1].split("-")[0] if latest.is_symlink() else None
    text = logs[-1].read_text(errors="replace") if logs else ""
    lines = [line for line in text.splitlines() if line.strip()]
    tail = lines[-1][-160:] if lines else ""
    if (arm_dir / "done.json").is_file():
        state = "done"
    elif not logs:
        state = "not started"
    elif arm in running_launches(plan):
        state = "running"
    else:
        # A SIGTERM (the driver's budget, a preemption) saves and raises Preempted: that launch stopped, resumable.
        state = "failed" if "Traceback" in text and "Preempted: " not in text else "stopped"
    return {"arm": arm, "state": state, "ranks": plan.nproc(arm), "launches": len(logs),
            "last_eval": list(curve[-1]) if curve else None, "checkpoint": checkpoint, "log_tail": tail}


def report_progress(plan: Plan, collect_dir: Path | None) -> int:
    """``--status`` / ``--collect``: print each arm's progress, rewrite the results from what the arms logged so far
    and, for ``--collect``, copy them with one archive of the arms' logs and metrics into ``collect_dir``;
    returns 0 when every arm is done, else 3."""
    progress = [arm_progress(plan, arm) for arm in plan.args.arms]
    for p in progress:
        last = "no evaluation yet" if p["last_eval"] is None else f"val loss {p['last_eval'][1]:.4f} at step " \
                                                                  f"{p['last_eval'][0]}"
        print(f"{p['arm']:16s} {p['state']:11s} {p['ranks']} ranks, {p['launches']} launch(es), {last}, checkpoint "
              f"{p['checkpoint'] or '-'} of {plan.args.steps}\n{'':17s}{p['log_tail']}")
    manifest_path = plan.corpus / "manifest.json"
    if manifest_path.is_file():
        done = all(p["state"] == "done" for p in progress)
        status = "complete" if done else "running" if running_launches(plan) else "incomplete"
        record = write_results(plan, common.read_json(manifest_path), status, quiet=True)
        print(f"\nresults: {plan.out_dir}/convergence-{plan.name}.{{csv,md,json,png}}; noise band "
              f"{common.fmt(record['noise_band_pct'], '.2f', '%')}")
    if collect_dir is not None:
        import shutil
        import tarfile

        collect_dir.mkdir(parents=True, exist_ok=True)
        for path in plan.out_dir.glob(f"convergence-{plan.name}.*"):
            shutil.copy2(path, collect_dir / path.name)
        common.write_json(collect_dir / "progress.json", progress)
        with tarfile.open(collect_dir / "arms-logs.tar.gz", "w:gz") as tar:
            for arm in plan.args.arms:
                for path in sorted(plan.arm_dir(arm).glob("*")):
                    if path.is_file():
                        tar.add(path, arcname=f"{arm}/{path.name}")
        print(f"collected into {collect_dir}: {', '.join(sorted(p.name for p in collect_dir.iterdir()))}")
    return 0 if all(p["state"] == "done" for p in progress) else 3


# ---------------------------------------------------------------------------------------------------- combine
def combine_records(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One record from several runs of the same settings and corpus, e.g. an arm finished on a later machine, or
    a second baseline run that measures the run-to-run spread (GPU kernels are not bitwise deterministic).

    An arm that stopped early in one run and finished in another is taken from the finished one (a later run
    that completed it supersedes the partial one). An arm name then found in one run keeps its name; one found in
    several becomes ``<arm>@run<i>`` (1-based, in the order given). Each arm keeps its gap to its own run's
    baseline (``gap_vs_baseline_pct``) and gains ``gap_vs_baselines_pct``: its gap to every run's baseline at its
    final step, by baseline label. Raises ``ValueError`` naming the first setting or corpus fingerprint that
    differs between runs."""
    if len(records) < 2:
        raise ValueError(f"combining needs at least 2 records, got {len(records)}")
    combined = [i for i, record in enumerate(records, start=1) if "runs" in record]
    if combined:
        raise ValueError(f"record {combined[0]} is itself a combined record: pass the runs' own records it names")
    first = records[0]
    for i, record in enumerate(records[1:], start=2):
        # How many processes ran at once changes the step times, not an arm's numerics; nor does the transport:
        # ranks sharing GPUs over gloo compute what NCCL ranks do, up to the order of a reduction's sums.
        differ = [k for k in common.differing_keys(first["settings"], record["settings"])
                  if k not in ("max_ranks", "shared_gpu")]
        if differ:
            key = differ[0]
            raise ValueError(f"run {i} differs from run 1 in setting {key!r}: "
                             f"{record['settings'].get(key)!r} != {first['settings'].get(key)!r}")
        if record["corpus"]["input"]["sha256"] != first["corpus"]["input"]["sha256"]:
            raise ValueError(f"run {i} used another corpus (input sha256 {record['corpus']['input']['sha256'][:16]}"
                             f" != {first['corpus']['input']['sha256'][:16]})")
    finished = {arm for record in records for arm, r in record["arms"].items() if r["complete"]}
    kept = [{arm: r for arm, r in record["arms"].items() if r["complete"] or arm not in finished}
            for record in records]
    counts = collections.Counter(arm for record_arms in kept for arm in record_arms)
    arms: dict[str, Any] = {}
    for i, record_arms in enumerate(kept, start=1):
        for arm, r in record_arms.items():
            arms[arm if counts[arm] == 1 else f"{arm}@run{i}"] = {**r, "arm": arm, "run": i}
    baselines = {label: dict(r["curve"]) for label, r in arms.items() if r["arm"] in FSDP_BASELINES}
    for r in arms.values():
        gaps = {label: _gap_pct(r, curve) for label, curve in baselines.items()}
        r["gap_vs_baselines_pct"] = {label: gap for label, gap in gaps.items() if gap is not None}
    runs = [{**record["header"], "shared_gpu": record["settings"].get("shared_gpu")} for record in records]
    return {"header": {"git": " + ".join(dict.fromkeys(h["git"] for h in runs))}, "runs": runs,
            "settings": first["settings"], "corpus": first["corpus"],
            "status": "complete" if all(r["status"] == "complete" for r in records) else "incomplete", "arms": arms,
            "seed_groups": seed_groups(arms, first["settings"]["steps"])}


def combined_markdown(record: dict[str, Any]) -> str:
    """The summary table of a combined record: the runs, each arm with its run and its gap to every baseline."""
    s = record["settings"]
    labels = [label for label, r in record["arms"].items() if r["arm"] in FSDP_BASELINES]
    lines = [f"### convergence: {Path(s['recipe_dir']).name}, {len(record['runs'])} runs combined", ""]
    transport = {True: ", ranks sharing GPUs over gloo", False: ", NCCL, a GPU per rank", None: ""}
    lines += [f"- run {i}: {h['date']}, git `{h['git']}`, {h['device']}{transport[h.get('shared_gpu')]}: "
              f"`{h['command']}`" for i, h in enumerate(record["runs"], start=1)]
    lines += [f"- settings: {s['steps']} steps x {s['global_batch']} samples x {s['seq_len']} tokens per arm, the "
              f"same seed and data order in every run; corpus input sha256 "
              f"`{record['corpus']['input']['sha256'][:16]}`", f"- status: {record['status']}", "",
              *_table_head(["arm", "run", *(f"vs {label}" for label in labels),
                            *_arm_columns("vs its run's baseline")])]
    for label, r in record["arms"].items():
        gaps = [common.fmt(r["gap_vs_baselines_pct"].get(b), "+.2f", "%") for b in labels]
        lines.append(_arm_row(label, r, str(r["run"]), *gaps))
    finals = [record["arms"][b]["final_val_loss"] for b in labels]
    if len(labels) > 1 and None not in finals:
        lines += ["", f"Baseline run-to-run spread: {100.0 * (max(finals) - min(finals)) / min(finals):.2f}% "
                      f"between the final losses of {', '.join(labels)}."]
    lines += _w8g8_target(record["arms"].get("w8g8", {}).get("gap_vs_baselines_pct", {}))
    lines += _seed_lines(record.get("seed_groups", {}))
    return "\n".join(lines) + "\n"


def write_combined(paths: list[Path], out_dir: Path | None) -> dict[str, Any]:
    """Combine the ``convergence-*.json`` records at ``paths`` and write ``<first stem>-combined`` .csv, .json,
    .md and .png (when matplotlib is there) into ``out_dir`` (default: the first record's directory)."""
    record = combine_records([common.read_json(path) for path in paths])
    s = record["settings"]
    md = combined_markdown(record)
    written = _write_record(f"{paths[0].stem}-combined", out_dir or paths[0].parent, record,
                            csv_text(s["global_batch"] * s["seq_len"], record["arms"]), md)
    print(md + "\n".join(f"wrote {path}" for path in written))
    return record


# ------------------------------------------------------------------------------------------------------- main
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="See the module docstring and benchmarks/README.md.")
    parser.add_argument("--model", default="125m", help="recipe family: reads yamls/gpt-<model>/ (default 125m)")
    parser.add_argument("--recipe-dir", help="directory with baseline.yaml, qsdp-w8g8.yaml, qsdp-w4g4.yaml")
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(DEFAULT_ARMS),
                        help=f"arms to run (default: {' '.join(DEFAULT_ARMS)})")
    parser.add_argument("--matrix", action="store_true",
                        help=f"run the matrix of every seed system instead: {' '.join(MATRIX_ARMS)}")
    parser.add_argument("--lr-scales", type=float, nargs="+", metavar="SCALE",
                        help="a learning-rate sweep: run every arm as arms NAME@lr<SCALE>x at SCALE times the lr its "
                             "recipe sets (1: exactly the recipe's), each compared with its baseline at the same "
                             "scale, e.g. --lr-scales 0.5 1 2")
    parser.add_argument("--seeds", type=int, nargs="+", metavar="SEED",
                        help="run every arm once per recipe seed (initial weights and data order) as arms "
                             "NAME@s<SEED>, each compared with its baseline of the same seed; the table adds each "
                             "arm's mean, spread and gap to the baseline's seeds, e.g. --seeds 17 18 19")
    parser.add_argument("--baseline", choices=list(ARMS),
                        help="the plain FSDP2 arm every QSDP arm is compared with (default baseline), e.g. "
                             "baseline-1r: one rank with the same global batch by gradient accumulation")
    parser.add_argument("--steps", type=int, default=2000, help="optimizer steps per arm (default 2000)")
    parser.add_argument("--seq-len", type=int, default=512, help="tokens per sample (default 512)")
    parser.add_argument("--global-batch", type=int, default=32, help="samples per step, all processes (default 32)")
    parser.add_argument("--micro-batch", type=int, help="samples per forward/backward per process (default: the "
                                                        "per-process batch, no accumulation)")
    parser.add_argument("--eval-interval", type=int, default=100, help="steps between evaluations (default 100)")
    parser.add_argument("--eval-batches", type=int, default=8,
                        help="batches per evaluation and process (default 8); -1: the whole val split (needed when "
                             "arms run on different numbers of processes)")
    parser.add_argument("--eval-batch-size", type=int, default=32, help="samples per evaluation batch (default 32)")
    parser.add_argument("--save-interval", type=int, default=500, help="steps between checkpoints (default 500)")
    parser.add_argument("--nproc", type=int, default=2,
                        help="processes per arm (default 2); the -2x2 arms always run 4")
    parser.add_argument("--max-ranks", type=int,
                        help="processes of all running arms together, at most: arms start while they fit (default: "
                             "the visible GPUs with a GPU per rank, else the widest arm's processes)")
    parser.add_argument("--shared-gpu", choices=("auto", "true", "false"), default="auto",
                        help="arms share the GPUs: auto (default) when an arm has more processes than there are GPUs "
                             "or --max-ranks exceeds the GPUs; arms wider than the GPUs (every arm, with true) then "
                             "run over gloo (the recipes' shared_gpu key), the others over NCCL, a GPU per rank")
    parser.add_argument("--results-interval-s", type=float, default=60.0,
                        help="rewrite the results files from the arms' metrics this often while arms run (default "
                             "60 s; the metrics files themselves are rewritten after every evaluation)")
    parser.add_argument("--num-workers", type=int, default=2,
                        help="data loader workers per process (default 2; the recipes' 8 are for big batches)")
    parser.add_argument("--corpus-kind", choices=list(CORPORA), default="pysource",
                        help="the text the corpus is built from when missing: "
                             + "; ".join(f"{k}: {v}" for k, v in CORPORA.items()) + " (default pysource)")
    parser.add_argument("--corpus", help="shard directory (default data/<corpus-kind>-gpt2-t<seq-len>; built if "
                                         "missing)")
    parser.add_argument("--data", help="shards built elsewhere by --build-only (with their manifest.json), e.g. "
                                       "carried to a GPU machine; never rebuilt")
    parser.add_argument("--max-train-tokens", type=int,
                        help="build: stop once the train split holds this many tokens (a corpus small enough to carry)")
    parser.add_argument("--corpus-input", help="build from the *.py files under this directory instead of the "
                                               "installed packages and standard library")
    parser.add_argument("--val-fraction", type=float, default=0.02,
                        help="fraction of files held out for validation (default 0.02)")
    parser.add_argument("--max-documents", type=int, help="build from at most this many files")
    parser.add_argument("--build-only", action="store_true", help="build the corpus (if missing) and stop")
    parser.add_argument("--out-dir", help="results directory (default runs/convergence/<name>)")
    parser.add_argument("--time-budget", type=float, help="seconds this command may use: it stops the arms "
                                                          "(they resume later) and writes the results in time")
    parser.add_argument("--min-launch-s", type=float, default=120.0,
                        help="start no launch with less budget left than this (default 120 s)")
    parser.add_argument("--retries", type=int, default=1,
                        help="relaunches of a failed arm within one run, from its checkpoint (default 1)")
    parser.add_argument("--stagger-s", type=float, default=10.0,
                        help="seconds between two launches that would overlap (default 10)")
    parser.add_argument("-o", "--override", action="append", default=[],
                        help="extra recipe override key=value for every arm (repeatable)")
    parser.add_argument("--plan", action="store_true",
                        help="only check the arms' recipes and print each 0/1 Adam arm's schedule over --steps and "
                             "its expected byte ratio against DDP's fp32 all-reduce; builds and runs nothing")
    parser.add_argument("--status", action="store_true",
                        help="only print each arm's progress (last evaluation, checkpoint, launches, state) from the "
                             "results directory, and rewrite the results files; with the run's own arguments")
    parser.add_argument("--collect", metavar="DIR",
                        help="like --status, then copy the results (csv, md, png, json) and the arms' logs and "
                             "metrics (one .tar.gz) into DIR")
    parser.add_argument("--replot", metavar="RECORD_JSON", help="only redraw the PNG of a convergence-*.json record "
                                                                "(written beside it)")
    parser.add_argument("--combine", nargs="+", metavar="RECORD_JSON",
                        help="only combine the convergence-*.json records of several runs with the same settings "
                             "(e.g. a second baseline run, or an arm finished later) into <first>-combined.* in "
                             "--out-dir (default: beside the first record)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Build the corpus, run the arms, write the results; 0 complete, 1 some launch failed, 3 incomplete."""
    args = _parser().parse_args(argv)
    if args.replot:
        record_path = Path(args.replot)
        png = png_bytes(common.read_json(record_path))
        if png is None:
            return 2
        record_path.with_suffix(".png").write_bytes(png)
        print(f"wrote {record_path.with_suffix('.png')}")
        return 0
    if args.combine:
        try:
            write_combined([Path(p) for p in args.combine], Path(args.out_dir) if args.out_dir else None)
        except ValueError as err:
            raise SystemExit(f"--combine: {err}") from None
        return 0
    if args.eval_batches < 1 and args.eval_batches != -1:
        raise SystemExit(f"--eval-batches {args.eval_batches} is invalid; it must be >= 1, or -1 for the whole split")
    for name in ("steps", "seq_len", "global_batch", "eval_interval", "eval_batch_size",
                 "save_interval", "nproc", "max_ranks", "micro_batch", "results_interval_s"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} {getattr(args, name)} is invalid; it must be >= 1")
    for name in ("num_workers", "retries"):
        if getattr(args, name) < 0:
            raise SystemExit(f"--{name.replace('_', '-')} {getattr(args, name)} is invalid; it must be >= 0")
    budget = common.Budget(args.time_budget)
    plan = _plan(args)
    if args.plan:
        return print_zero_one_plans(plan)
    if args.status or args.collect:
        return report_progress(plan, Path(args.collect) if args.collect else None)
    with common.stop_on_signals():
        try:
            manifest = (prebuilt_corpus(plan.corpus, args.seq_len) if args.data else
                        build_corpus(plan.corpus, args.seq_len, args.val_fraction, args.corpus_input,
                                     args.max_documents, args.max_train_tokens, args.corpus_kind))
        except common.Interrupted as sig:
            print(f"stopped by {sig} while building the corpus; rerun to build it")
            return 3
        print(f"corpus {plan.corpus}: {manifest['tokens']['train']:,} train / {manifest['tokens']['val']:,} val "
              "tokens", flush=True)
        if args.build_only:
            return 0
        _check_corpus(plan, manifest)
        # Arms of one directory share every setting and the very same corpus.
        common.check_settings(plan.out_dir, {**plan.settings, "corpus_sha256": manifest["input"]["sha256"]})
        status = run_arms(plan, budget, lambda: write_results(plan, manifest, "running", quiet=True))
        write_results(plan, manifest, status)
    return {"complete": 0, "failed": 1, "incomplete": 3}[status]


if __name__ == "__main__":
    sys.exit(main())
