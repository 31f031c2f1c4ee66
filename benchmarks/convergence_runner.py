"""The convergence driver's runner: launching, scheduling and resuming the arms of a :class:`~convergence_plan.Plan`,
and where each arm stands.

Each arm's directory holds one ``log-<i>.txt`` and one ``metrics-<i>.json`` per launch (the recipe rewrites its
metrics file after every evaluation), its checkpoints, and ``done.json`` once a launch finished the run; a launch
resumes from the arm's newest checkpoint, so a rerun continues unfinished arms and skips finished ones. Arms start
in ``--arms`` order (the first that fits) while the processes of all running arms fit ``--max-ranks``;
``running.json`` in the results directory names the driver's and its running launches' process ids for another
process (``--status``).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import e2e_common as common
from convergence_plan import Plan

#: The metric every arm is compared on: the validation loss (nats/token) at each evaluation.
VAL_LOSS = "metrics/val/LanguageCrossEntropy"
#: The same evaluation with QSDP's quantized weights: logged by arms run with ``--eval-weights both``.
VAL_QUANTIZED_LOSS = "metrics/val_quantized/LanguageCrossEntropy"
#: The training loss (nats/token) of each batch, averaged over the ranks: on the same data order every arm sees the
#: same batches, so its windowed means compare arms between the evaluations.
TRAIN_LOSS = "loss/train/total"


def _segments(arm_dir: Path) -> list[Path]:
    return sorted(arm_dir.glob("metrics-*.json"))


def recorded_backend(arm_dir: Path) -> str | None:
    """The collective back end the arm's launches logged (the entrypoint's ``dist_backend`` hyperparameter in each
    metrics file): ``"nccl"``, or ``"gloo, then nccl"`` for an arm resumed on another transport; None before one
    logged it."""
    logged = [(common.read_json(path).get("hyperparameters") or {}).get("dist_backend") for path in _segments(arm_dir)]
    backends = list(dict.fromkeys(str(b) for b in logged if b is not None))
    return ", then ".join(backends) or None


def launch_count(arm_dir: Path) -> int:
    """The launches of the arm so far (its logs): the index of its next launch."""
    return len(list(arm_dir.glob("log-*.txt")))


def recorded_eval_weights(arm_dir: Path) -> Any:
    """What the arm's QSDP evaluated (the hyperparameter ``qsdp/eval_weights`` of its latest launch): ``"exact"``,
    ``"quantized"`` or modes by evaluator label (``"val=exact, val_quantized=quantized"``); ``None`` where no launch
    recorded one (no QSDP, no metrics yet, or a run from before the setting existed, whose evaluations gathered the
    quantized weights)."""
    found = None
    for path in _segments(arm_dir):
        found = (common.read_json(path).get("hyperparameters") or {}).get("qsdp/eval_weights", found)
    return found


def merged_metrics(arm_dir: Path) -> dict[str, dict[int, float]]:
    """Metric name -> {batch: value} over an arm's launches; a later launch's value wins (a resumed launch
    redoes the batches after its checkpoint)."""
    merged: dict[str, dict[int, float]] = {}
    for path in _segments(arm_dir):
        for name, series in common.read_json(path)["metrics"].items():
            merged.setdefault(name, {}).update({int(b): float(v) for b, v in series})
    return merged


def _queue(plan: Plan) -> list[str]:
    """The unfinished arms in launch order: ``--arms`` order, which is the priority when the time budget cannot
    finish every arm (the first queued arm that fits the free ranks starts next)."""
    return [arm for arm in plan.args.arms if not _finished(plan, arm)]


def _finished(plan: Plan, arm: str) -> bool:
    """Whether ``arm`` has finished its run: ``done.json``, written here (with the launches so far) when its last
    complete checkpoint is of the final batch, which a launch saves after the final evaluation; a launch stopped
    after that save but before it exited ran the whole run, and another would only start up to train nothing."""
    arm_dir = plan.arm_dir(arm)
    if (arm_dir / "done.json").is_file():
        return True
    batch = _latest_checkpoint(arm_dir)
    if batch is None or batch < plan.args.steps:
        return False
    common.write_json(arm_dir / "done.json", {"segments": launch_count(arm_dir)})
    return True


def _latest_checkpoint(arm_dir: Path) -> int | None:
    """The batch of the arm's last complete checkpoint (the one ``latest-rank0.pt`` names), or None."""
    from composer_qsdp.recipes.checksums import checkpoint_batch

    latest = arm_dir / "checkpoints" / "latest-rank0.pt"
    return checkpoint_batch(Path(os.readlink(latest)).name) if latest.is_symlink() else None


def _restart_after_unfinished_saves(arm_dir: Path) -> list[Path]:
    """Where the arm's last launch failed because none of its checkpoints is known complete (every save of the
    arm was cut short), set them aside (``NAME.incomplete``) so that its next launch starts again from batch 0;
    the checkpoints set aside, else []."""
    from composer_qsdp.recipes.resume import NO_COMPLETE_CHECKPOINT, set_aside_incomplete_checkpoints

    logs = sorted(arm_dir.glob("log-*.txt"))
    if not logs or NO_COMPLETE_CHECKPOINT not in logs[-1].read_text(errors="replace"):
        return []
    return set_aside_incomplete_checkpoints(arm_dir / "checkpoints")


def run_arms(plan: Plan, budget: common.Budget, on_progress: Callable[[], None] = lambda: None) -> str:
    """Run (or continue) every unfinished arm, as many at once as ``plan.max_ranks`` processes allow; calls
    ``on_progress`` about every ``--results-interval-s`` seconds while arms run. Returns ``"complete"``,
    ``"incomplete"`` (budget or signal) or ``"failed"`` (an arm's launch failed; it continues from its checkpoint
    on the next invocation).

    A launch that ran out of GPU memory beside other arms (its log says so) is not the arm's failure but too many
    processes on the GPUs: it is queued again without spending a retry, and from then on at most the processes that
    ran without it run at once. Neither is a launch that found only checkpoints whose saves were cut short: they
    are set aside and the arm starts again. With a time budget, the running arms are stopped ``--stop-grace-s``
    before its end, the time their saves get."""
    queue = _queue(plan)
    running: dict[str, tuple[subprocess.Popen, list[str]]] = {}  # arm -> (its launch, the GPUs it holds)
    free_gpus = [] if plan.shared else list(plan.gpus)
    failures = dict.fromkeys(queue, 0)
    max_ranks = plan.max_ranks
    failed, last_start, last_progress = False, float("-inf"), time.monotonic()
    grace = plan.args.stop_grace_s

    def left() -> float | None:  # seconds until the running arms must be stopped
        remaining = budget.remaining()
        return None if remaining is None else max(0.0, remaining - grace)

    try:
        while queue or running:
            ran = sum(plan.nproc(arm) for arm in running)  # before this round's ends: what a failure ran beside
            for arm, (proc, held) in list(running.items()):
                if proc.poll() is None:
                    continue
                del running[arm]
                _write_running(plan, running)
                free_gpus += held
                beside = ran - plan.nproc(arm)
                if proc.returncode == 0:
                    common.write_json(plan.arm_dir(arm) / "done.json", {"segments": launch_count(plan.arm_dir(arm))})
                    print(f"{arm}: finished", flush=True)
                elif _finished(plan, arm):
                    print(f"{arm}: finished (its launch ended with status {proc.returncode} after saving the final "
                          "batch)", flush=True)
                elif moved := _restart_after_unfinished_saves(plan.arm_dir(arm)):
                    queue.append(arm)
                    print(f"{arm}: every checkpoint's save was cut short ({', '.join(p.name for p in moved)}, set "
                          "aside); it starts again from batch 0", flush=True)
                elif beside and out_of_gpu_memory(plan.arm_dir(arm)):
                    max_ranks = max(min(max_ranks, beside), plan.nproc(arm))  # it can always run alone
                    queue.append(arm)
                    print(f"{arm}: out of GPU memory beside {beside} other processes; at most {max_ranks} run at "
                          f"once from now (give --max-ranks {max_ranks} next time); it continues later from its "
                          f"checkpoint; log in {plan.arm_dir(arm)}", flush=True)
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
            if running and left() == 0:
                print("time budget spent: stopping the running arms (they resume from their checkpoints)")
                return "incomplete"
            if time.monotonic() - last_progress >= plan.args.results_interval_s:
                on_progress()
                last_progress = time.monotonic()
            busy = sum(plan.nproc(arm) for arm in running)
            fits = [arm for arm in queue if busy + plan.nproc(arm) <= max_ranks]
            # Starts are spaced by --stagger-s: every launch's start-up (imports, CUDA contexts, shard reads)
            # competes for the same cores.
            spaced = not running or time.monotonic() - last_start >= plan.args.stagger_s
            if fits and spaced and (left() is None or left() >= plan.args.min_launch_s):
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
                    print(f"time budget nearly spent ({left():.0f} s left before the stop): rerun to continue "
                          f"{', '.join(queue)}")
                    return "incomplete"
                break
            time.sleep(1.0)
    except common.Interrupted as sig:
        print(f"stopped by {sig}: the arms resume from their checkpoints on the next run")
        return "incomplete"
    finally:
        common.kill(*(proc for proc, _ in running.values()), grace_s=grace)
        _write_running(plan, {})
    return "failed" if failed else "complete"


def out_of_gpu_memory(arm_dir: Path) -> bool:
    """Whether the arm's last launch (its newest log) ran out of GPU memory."""
    logs = sorted(arm_dir.glob("log-*.txt"))
    return bool(logs) and common.out_of_memory(logs[-1])


def _least_loaded_gpus(plan: Plan, arm: str, running: dict[str, tuple[subprocess.Popen, list[str]]]) -> list[str]:
    """In a shared plan, the GPUs of ``arm``'s ranks: an arm over NCCL (a GPU per rank) takes those that the
    fewest processes of the ``running`` arms use, so that arms spread over every GPU instead of all putting rank r
    on the r-th; an arm over samedev, which joins the ranks of one GPU, the one least used GPU of several; [] for an
    arm over gloo (its ranks use every GPU, rank r on the (r mod GPUs)-th)."""
    one_gpu = plan.backend(arm) == "samedev" and len(plan.gpus) > 1
    if plan.shares_gpus(arm) and not one_gpu:
        return []
    load = dict.fromkeys(plan.gpus, 0)
    for other, (_, gpus) in running.items():
        used = gpus or plan.gpus
        for rank in range(plan.nproc(other)):
            load[used[rank % len(used)]] += 1
    chosen = sorted(plan.gpus, key=load.__getitem__)[:1 if one_gpu else plan.nproc(arm)]  # ties: the first GPUs
    return sorted(chosen, key=plan.gpus.index)


def _start_arm(plan: Plan, arm: str, gpus: list[str]) -> subprocess.Popen:
    """Start the next launch of ``arm``: on ``gpus`` (one per rank), or on every visible GPU when the ranks share
    them."""
    arm_dir = plan.arm_dir(arm)
    segment = launch_count(arm_dir)
    command = common.train_command(plan.nproc(arm), plan.recipe_dir / plan.arms[arm].recipe,
                                   plan.overrides(arm, segment))
    env = common.launch_env()
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    common.write_json(arm_dir / "arm.json", {"arm": arm, **dataclasses.asdict(plan.arms[arm]),
                                             "nproc": plan.nproc(arm), "micro_batch": plan.micro(arm),
                                             "backend": plan.backend(arm), "settings": plan.settings})
    where = (f"shared GPU{'s' if len(gpus) != 1 else ''}{' ' + ','.join(gpus) if gpus else ''} ({plan.backend(arm)})"
             if plan.shares_gpus(arm) else
             f"GPUs {','.join(gpus)}{', shared with other arms (nccl)' if plan.shared else ''}" if gpus else "CPU")
    print(f"{arm}: launch {segment}, {plan.nproc(arm)} processes on {where}", flush=True)
    return common.start(command, arm_dir / f"log-{segment:02d}.txt", env)


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
    checkpoint = _latest_checkpoint(arm_dir)
    text = logs[-1].read_text(errors="replace") if logs else ""
    lines = [line for line in text.splitlines() if line.strip()]
    tail = lines[-1][-160:] if lines else ""
    if _finished(plan, arm):  # a launch stopped after saving the final batch ran the whole run
        state = "done"
    elif not logs:
        state = "not started"
    elif arm in running_launches(plan):
        state = "running"
    else:
        # A SIGTERM (the driver's budget, a preemption) saves and raises Preempted: that launch stopped, resumable,
        # though Composer's launcher logs a traceback of the same signal.
        from composer_qsdp.recipes.failures import PREEMPTED_MARK
        state = "failed" if "Traceback" in text and PREEMPTED_MARK not in text else "stopped"
    return {"arm": arm, "state": state, "ranks": plan.nproc(arm), "launches": len(logs),
            "last_eval": list(curve[-1]) if curve else None, "checkpoint": checkpoint, "log_tail": tail}
