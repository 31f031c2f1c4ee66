"""The convergence driver's plan: what the arms of one invocation share (:class:`Plan`: the recipe family, the
corpus, the GPUs and how the arms' ranks use them, the settings that change the numbers) and what each arm's
launches are (processes, micro-batch, back end, recipe overrides), built from the command line by
:func:`make_plan`, which loads every arm's recipe with its overrides before any GPU time is spent.

Placement: with a GPU per rank each arm holds GPUs of its own; when the arms share the GPUs (fewer GPUs than the
widest arm's processes, a ``--max-ranks`` above the GPUs, or ``--shared-gpu true``), an arm with more processes
than GPUs (every arm, with ``--shared-gpu true``) runs its ranks over gloo with the recipes' ``shared_gpu=true``,
and the others keep NCCL, a GPU per rank.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import e2e_common as common
from convergence_arms import ARMS, MATRIX_ARMS, Arm, base_arm, compared_with, lr_sweep_arms, seed_arms


@dataclass
class Plan(common.DriverPlan):
    """Everything the arms of one invocation share."""

    corpus: Path
    gpus: list[str]  #: visible GPU ids, empty on CPU
    shared: bool  #: the arms' ranks share the GPUs over gloo (the recipes' shared_gpu key)
    max_ranks: int  #: processes of all running arms together, at most
    settings: dict[str, Any]
    arms: dict[str, Arm]  #: every arm of the run by name: those of :data:`ARMS`, or their learning-rate variants
    _qsdp: dict[str, bool] = field(default_factory=dict)  #: has_qsdp's answers

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

    def shares_gpus(self, arm: str) -> bool:
        """Whether ``arm``'s ranks share GPUs (over ``--shared-gpu-transport``, gloo by default): in a shared plan,
        with more processes than GPUs or ``--shared-gpu true``; an arm with a GPU per rank keeps NCCL even while
        other arms use those GPUs."""
        return self.shared and (self.args.shared_gpu == "true" or self.nproc(arm) > len(self.gpus))

    def backend(self, arm: str) -> str:
        """The collective back end of ``arm``'s ranks."""
        if self.shares_gpus(arm):
            return self.args.shared_gpu_transport
        return "gloo" if not self.gpus else "nccl"

    def has_qsdp(self, arm: str) -> bool:
        """Whether ``arm``'s recipe, with its overrides, runs the QSDP algorithm (loaded once per arm)."""
        if arm not in self._qsdp:
            from composer_qsdp.recipes.train import load_recipe

            recipe = load_recipe(self.recipe_dir / self.arms[arm].recipe, self.overrides(arm, 0, eval_weights=False),
                                 world_size=self.nproc(arm))
            self._qsdp[arm] = "qsdp" in recipe.algorithm_kwargs
        return self._qsdp[arm]

    def overrides(self, arm: str, segment: int, eval_weights: bool = True) -> list[str]:
        """``arm``'s recipe overrides for its launch ``segment``; ``eval_weights``: with ``--eval-weights`` for a
        QSDP arm (the recipes' default, exact, needs none)."""
        a, d = self.args, self.arm_dir(arm)
        evaluation = ([f"algorithms.qsdp.eval_weights={a.eval_weights}"]
                      if eval_weights and a.eval_weights != "exact" and self.has_qsdp(arm) else [])
        return [f"run_name={arm}", "data.remote=null", f"data.local={self.corpus}", "data.train_split=train",
                "data.eval_split=val", f"model.max_seq_len={a.seq_len}", f"global_train_batch_size={a.global_batch}",
                f"device_train_microbatch_size={self.micro(arm)}", f"max_duration={a.steps}ba",
                f"eval_interval={a.eval_interval}ba", f"eval_subset_num_batches={a.eval_batches}",
                f"device_eval_batch_size={a.eval_batch_size}", f"save_folder={d / 'checkpoints'}",
                f"save_interval={a.save_interval}ba", "save_num_checkpoints_to_keep=1", "autoresume=true",
                "load_path=null", "progress_bar=false", "log_to_console=false", f"data.num_workers={a.num_workers}",
                f"metrics_file={d / f'metrics-{segment:02d}.json'}",
                *([f"shared_gpu={str(self.shares_gpus(arm)).lower()}"] if self.shared else []),
                *([f"shared_gpu_transport={a.shared_gpu_transport}"] if self.shares_gpus(arm) else []),
                *self.arms[arm].overrides,
                *evaluation, *a.override,
                # Last: a swept rate scales what the recipe and every other override would set.
                *([f"optimizer.lr={self.arms[arm].lr!r}"] if self.arms[arm].lr is not None else [])]


def _visible_gpus() -> list[str]:
    if not torch.cuda.is_available():
        return []
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    return [g.strip() for g in listed.split(",") if g.strip()] if listed else \
        [str(i) for i in range(torch.cuda.device_count())]


def make_plan(args: argparse.Namespace) -> Plan:
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
                "shared_gpu": shared,
                # Absent for quantized: the evaluation of every directory written before --eval-weights existed.
                **({"eval_weights": args.eval_weights} if args.eval_weights != "quantized" else {})}
    plan = Plan(args, recipe_dir, name, out_dir, corpus, gpus, shared, max_ranks, settings,
                {arm: ARMS[arm] for arm in args.arms})
    recipes = _check_recipes(plan)
    if args.lr_scales:
        plan.arms = lr_sweep_arms(args.arms, args.lr_scales,
                                   {arm: recipe.optimizer_kwargs.get("lr") for arm, recipe in recipes.items()})
        args.arms = list(plan.arms)
    if args.baseline:
        plan.arms = {name: compared_with(arm, args.baseline) if base_arm(name) != args.baseline else arm
                     for name, arm in plan.arms.items()}
    if args.seeds:
        plan.arms = seed_arms(plan.arms, args.seeds)
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
