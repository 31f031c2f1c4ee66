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
``w8g4``            ``qsdp-w8g4.yaml``: 8-bit weights, 4-bit gradients in Hadamard-rotated groups of 256 rounded
                    to nearest, with LoCo's error feedback (an int8 residual per rank)
``qwd-w4g8``        ``qsdp-w8g8.yaml`` with 4-bit weight differences (SDP4Bit qWD: ``weight_scheme=difference``,
                    symmetric INT4 in groups of 2048), 8-bit gradients
``qwd-w4g4``        ``qwd-w4g4.yaml``: qWD INT4 weights, one-hop 4-bit Hadamard gradients in groups of 128
``sdp4bit``         ``sdp4bit.yaml``: qWD INT4 weights, TLq-HS gradients (INT8 within a node, INT4 across)
=================  ==============================================================================================

More arms, named in ``--arms``: ``baseline-1r`` (plain FSDP2 on one rank, the same global batch by gradient
accumulation), ``w8g4-paper`` (QSDP's W8G4 as the paper states it: ``qsdp-w8g8.yaml`` with 4-bit min-max gradients,
stochastic rounding, no state kept), ``w8g8-nearest`` / ``w8g4-nearest`` (``w8g8`` / ``w8g4-paper`` with 8-bit
weights rounded to nearest in parameter-aligned buckets of 256), the LoCo presets and their variants, and the
ablations of :data:`convergence_arms._ABLATIONS` (one side of a preset alone, or one option changed), each described
in its :class:`~convergence_arms.Arm`. Records written before ``w8g4`` became the LoCo gradients name the paper's
``w8g4`` and the LoCo one ``w8g4-loco``: every reader maps their names (:func:`convergence_report.read_record`).

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

Corpus (built once if missing, on the machine that runs the arms; ``--corpus-kind``, one of
:data:`~convergence_corpus.CORPORA`): ``pysource`` (default), every ``*.py`` file of the installed Python packages and
the standard library (``site.getsitepackages()`` and ``sysconfig``'s ``stdlib``, sorted paths, exact duplicates
dropped); ``csource``, their C, C++ and CUDA sources and headers; ``prose``, English prose about that software: the
distributions' descriptions (``*.dist-info/METADATA``: their READMEs), their documentation files (``*.md``, ``*.rst``,
``*.txt``; no license texts, packaging records, test fixtures or data), the docstrings, comments and messages of
those ``*.py`` files and the comments of the C/C++/CUDA files (the docstrings alone are too few for 2,000 steps on a
torch environment). Each is tokenized with GPT-2 BPE by ``python -m composer_qsdp.recipes.data.build <kind>``; a document
goes to the validation split when the hash of its text falls in ``--val-fraction``.
``<corpus>/manifest.json`` records the exact command, the interpreter, every installed distribution and a SHA-256 over
the files' relative paths and contents, so the same corpus can be rebuilt and checked. The text belongs to those
packages under their own licenses: it stays on the machine and is never committed. The driver refuses to run when the
train split is smaller than ``steps x global batch`` samples, and ``--build-only`` exits 1 with the same message
when the corpus it built (or found) is smaller than the ``--steps``, ``--global-batch`` and ``--seq-len`` given, so
a script chaining ``--build-only && <the run>`` stops before the run.

Resumable: each arm checkpoints every ``--save-interval`` steps and resumes from its newest checkpoint
(Composer ``autoresume``); each launch writes its own metrics file, rewritten after every evaluation, so a launch
killed by ``--time-budget`` or an outer limit loses no evaluation. The arms are stopped ``--stop-grace-s`` before the
budget's end, their ranks signalled directly so that their saves get that long (Composer's launcher would give 30 s).
A rerun continues unfinished arms and skips finished ones. GPU kernels are not bitwise deterministic, so two runs of one arm with the same seed and data still
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
GPT-125M at sequence length 512 took 6.2-11 GiB per process at ``--micro-batch 8`` on an H100 (2026-11-25), and up to
13.1 GiB at ``--micro-batch 16`` on an H200 (2026-11-29). A launch that runs out of GPU memory beside other arms is
queued again without spending a retry, and from then on only as many processes as ran beside it run at once. The
launches get ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` unless it is set
(:func:`e2e_common.launch_env`).

``--matrix`` runs every seed system once (:data:`~convergence_arms.MATRIX_ARMS`): FSDP2 with two seeds, DDP, W8G8,
W8G4, W4G4, qWD-W4G4, the policy ``auto`` and 0/1 Adam on ``--nproc`` processes, and the two-level schemes (SDP4Bit,
TLq-HS, ZeRO++) on 4 processes as 2 virtual nodes of 2 (``ranks_per_node=2``), so their inter-node hop is taken. FSDP
arms are compared with ``baseline``, and with ``baseline-seed2`` in a second gap; DDP arms with ``ddp-baseline``.

While arms run, the results files are rewritten every ``--results-interval-s`` from the arms' metrics files (which
each launch rewrites after every evaluation), so a killed driver loses nothing. ``--status`` (with the run's
arguments) prints each arm's state, last evaluation and checkpoint, and rewrites the results; ``--collect DIR``
also copies the results and one ``arms-logs.tar.gz`` of the arms' logs and metrics into ``DIR``: started detached
(``setsid nohup ... &``), the driver is polled and collected by later commands.

Corpus built elsewhere: ``--build-only --corpus DIR --max-train-tokens N`` builds a capped corpus (e.g. on a CPU
machine; give the run's ``--steps``/``--global-batch``/``--seq-len``, which it must suffice for), and ``--data DIR``
runs on it (its ``manifest.json`` is recorded; it is never rebuilt).

Outputs, in ``--out-dir``, as ``convergence-<name>.csv`` (step, tokens, one validation-loss
column per arm), ``.json`` (curves, the training loss's means over windows of 100 batches, final losses, gaps to the
baseline, QSDP compression and sampled errors, settings, corpus manifest), ``.md`` (the summary table) and ``.png``
(all curves, and the second half zoomed).
``--replot RECORD.json`` redraws the PNG from a record (e.g. where matplotlib is missing on the GPU machine).
``--combine RUN1.json RUN2.json ...`` merges the records of several runs with the same settings and corpus (an arm
finished on a later machine, a repeated baseline that measures the run-to-run spread, seeds run again) into
``<first>-combined.{csv,json,md,png}``, with every arm's gap to every run's baseline; each run of a seed is one sample
of the seed statistics. A combined record among them stands for the runs it holds.

Usage::

    python benchmarks/convergence.py --model 125m                      # the FSDP arms, 2 GPUs each
    python benchmarks/convergence.py --matrix --data DIR --micro-batch 8 --max-ranks 8   # one GPU, shared
    python benchmarks/convergence.py --matrix --data DIR --status      # progress (same arguments)
    python benchmarks/convergence.py --build-only                      # only the corpus (exit 1: too small)
    python benchmarks/convergence.py --time-budget 500                 # stop cleanly; rerun to continue
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e_common as common  # noqa: E402
from convergence_arms import ARMS, DEFAULT_ARMS, MATRIX_ARMS  # noqa: E402
from convergence_corpus import CORPORA, build_corpus, check_corpus, prebuilt_corpus  # noqa: E402
from convergence_plan import Plan, make_plan  # noqa: E402
from convergence_report import (ZERO_ONE_BYTES_TARGET, png_bytes, read_record, write_combined,  # noqa: E402
                                 write_results)
from convergence_runner import arm_progress, run_arms, running_launches  # noqa: E402

from composer_qsdp.shared_gpu import SHARED_GPU_TRANSPORTS  # noqa: E402


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
    parser.add_argument("--shared-gpu-transport", choices=SHARED_GPU_TRANSPORTS, default="gloo",
                        help="how the ranks of an arm that shares GPUs exchange data (the recipes' "
                             "shared_gpu_transport key): gloo (default, through host memory) or samedev (staging "
                             "buffers on the GPU, composer_qsdp.comm.same_device_pg; the same numbers; each such "
                             "arm runs on one GPU, the least used)")
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
    parser.add_argument("--corpus-input", help="build from the files under this directory instead of the "
                                               "installed packages and standard library")
    parser.add_argument("--val-fraction", type=float, default=0.02,
                        help="fraction of files held out for validation (default 0.02)")
    parser.add_argument("--max-documents", type=int, help="build from at most this many files")
    parser.add_argument("--build-only", action="store_true",
                        help="build the corpus (if missing) and stop: exit 0 when it suffices for --steps x "
                             "--global-batch samples of --seq-len tokens, else 1")
    parser.add_argument("--out-dir", help="results directory (default runs/convergence/<name>)")
    parser.add_argument("--time-budget", type=float, help="seconds this command may use: it stops the arms "
                                                          "(they resume later) and writes the results in time")
    parser.add_argument("--min-launch-s", type=float, default=120.0,
                        help="start no launch with less budget left than this before the stop (default 120 s)")
    parser.add_argument("--stop-grace-s", type=float, default=90.0,
                        help="seconds the running arms get to save a checkpoint and exit when stopped; with "
                             "--time-budget they are stopped this long before its end (default 90 s)")
    parser.add_argument("--retries", type=int, default=1,
                        help="relaunches of a failed arm within one run, from its checkpoint (default 1)")
    parser.add_argument("--stagger-s", type=float, default=10.0,
                        help="seconds between two launches that would overlap (default 10)")
    parser.add_argument("--eval-weights", choices=("exact", "quantized", "both"), default="exact",
                        help="the weights the QSDP arms evaluate (algorithms.qsdp.eval_weights; the baseline has no "
                             "QSDP): exact (default: the full-precision weights, as plain FSDP2 evaluates), "
                             "quantized (as training's forward sees them: how runs before this option evaluated), or "
                             "both (a second evaluator, val_quantized, on the same batches: the report's 'final val "
                             "loss, quantized weights' column; evaluations take twice as long)")
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
    parser.add_argument("--header-from", nargs="+", metavar="RECORD_JSON",
                        help="with --status or --collect on another machine: the records' header (device, versions, "
                             "date, git revision, command) is that of these convergence-*.json records of the hosts "
                             "that ran the arms (several: one per session; dates, revisions and commands joined), "
                             "and this command is added as 'tables'")
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
        png = png_bytes(read_record(record_path))
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
    for name in ("num_workers", "retries", "stop_grace_s"):
        if getattr(args, name) < 0:
            raise SystemExit(f"--{name.replace('_', '-')} {getattr(args, name)} is invalid; it must be >= 0")
    if args.header_from and not (args.status or args.collect):
        raise SystemExit("--header-from rewrites the tables of arms another host ran: use it with --status or --collect")
    budget = common.Budget(args.time_budget)
    plan = make_plan(args)
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
        check_corpus(manifest, args.steps, args.global_batch)  # --build-only too: a chained run must not start
        if args.build_only:
            return 0
        # Arms of one directory share every setting and the very same corpus.
        common.check_settings(plan.out_dir, {**plan.settings, "corpus_sha256": manifest["input"]["sha256"]})
        status = run_arms(plan, budget, lambda: write_results(plan, manifest, "running", quiet=True))
        write_results(plan, manifest, status)
    return {"complete": 0, "failed": 1, "incomplete": 3}[status]


if __name__ == "__main__":
    sys.exit(main())
