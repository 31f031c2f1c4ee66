"""Shared plumbing of the end-to-end drivers (``bench_e2e.py``, ``bench_memory.py``, ``convergence.py``): launching
``composer_qsdp.recipes.train`` through Composer's launcher, what a recipe family fixes for every launch (micro-batch,
sequence, vocabulary, gather dtype), the random-token shards and the overrides of a short benchmark launch, time
budgets that end a command cleanly before an outer limit, process-group kills, the record header (device, date, git
revision, command), output files and the fields every driver's plan starts with.

Not a benchmark itself; the drivers import it from this directory.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from provenance import command_line, git_revision

ROOT = Path(__file__).resolve().parents[1]

#: Environment variables worth recording with a measurement (the NCCL transport, the visible devices, the caching
#: allocator's settings).
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL", "CUDA_VISIBLE_DEVICES", "TORCH_SYMM_MEM", "OMP_NUM_THREADS",
                "PYTORCH_CUDA_ALLOC_CONF")

#: Seconds a killed launch gets by default between SIGTERM and SIGKILL: its processes save a checkpoint of the batch
#: they are in (recipes' ``save_on_sigterm``).
KILL_GRACE_S = 40.0
#: The units of the records' bandwidths and sizes: GB (bandwidths, wire bytes) and GiB (memory).
GB = 1e9
GIB = 2**30


def auto_offering(weights: str, grads: str) -> tuple[str, ...]:
    """Recipe overrides running policy=auto offered, besides its defaults (``off`` and ``w8g8``'s sides), the opt-in
    candidates ``weights`` and ``grads``; shared by the benchmark's and the convergence driver's auto runs. YAML reads
    the bare ``off`` as false, which AutoOptions takes as ``"off"``."""
    return ("algorithms.qsdp.policy=auto", f"algorithms.qsdp.auto_options.weight_candidates=[off,w8,{weights}]",
            f"algorithms.qsdp.auto_options.grad_candidates=[off,g8,{grads}]")


#: ``qwd-w3g3-loco``'s sides (3-bit weight differences, 3-bit LoCo gradients).
AUTO_3BIT = auto_offering("qwd3", "g3loco")
#: ``qwd-w4g4``'s weights and ``w8g4-paper``'s gradients (4-bit weight differences, 4-bit stochastic gradients).
AUTO_4BIT = auto_offering("qwd4", "g4")

#: Recipe overrides of the lean layout of a preset with weight differences: the reference sharded within the node,
#: and a LoCo preset's residual on the inter-node hop only; shared by the memory benchmark and the convergence driver.
LEAN_WEIGHTS = "algorithms.qsdp.weight_scheme_options.sharded_reference=true"
LEAN_GRADS = "algorithms.qsdp.grad_scheme=two_level_loco"
# prctl option of <sys/prctl.h>: the signal a child gets when its parent dies.
_PR_SET_PDEATHSIG = 1


@dataclass
class DriverPlan:
    """What the plan of every end-to-end driver holds; each driver's ``Plan`` adds its own fields after these."""

    args: argparse.Namespace  #: the driver's command line
    recipe_dir: Path  #: the recipe family (``baseline.yaml``, ``qsdp-*.yaml``), see :func:`recipe_dir`
    name: str  #: the run's name, part of its output paths
    out_dir: Path  #: where the results and ``settings.json`` go


@dataclass(frozen=True)
class Family:
    """What a recipe family's ``baseline.yaml`` fixes for every launch of a driver.

    Attributes:
        base: the loaded baseline recipe (:class:`composer_qsdp.recipes.train.Recipe`).
        micro: samples per forward/backward and rank: the driver's ``--micro-batch``, else the recipe's.
        seq_len: tokens per sample.
        vocab_size: the model's vocabulary.
        gather_bytes: bytes per element of FSDP's weight all-gathers: 2 (bf16) in the recipes' mixed precision,
            4 in fp32 (``precision: fp32`` or ``fsdp.mixed_precision: FULL``).
    """

    base: Any
    micro: int
    seq_len: int
    vocab_size: int
    gather_bytes: int


def load_family(recipe_dir: Path, micro_batch: int | None) -> Family:
    """The :class:`Family` of ``recipe_dir`` (its ``baseline.yaml``) at ``micro_batch`` (None: the recipe's).

    Raises:
        SystemExit: the recipe does not load, or neither it nor ``micro_batch`` sets a micro-batch.
    """
    from composer_qsdp.recipes.train import RecipeError, load_recipe

    try:
        base = load_recipe(recipe_dir / "baseline.yaml", ["data.remote=null", "data.local=unused"])
    except RecipeError as err:
        raise SystemExit(f"recipe error: {err}") from None
    micro = micro_batch or base.cfg.device_train_microbatch_size
    if not micro:
        raise SystemExit("the baseline recipe sets no device_train_microbatch_size: pass --micro-batch")
    full = base.cfg.precision == "fp32" or (base.cfg.fsdp is not None and base.cfg.fsdp.mixed_precision == "FULL")
    return Family(base, micro, base.model_config.max_seq_len, base.model_config.vocab_size, 4 if full else 2)


def check_launch(name: str, recipe: Path, overrides: Sequence[str], world_size: int) -> Any:
    """Load ``recipe`` with a launch's ``overrides`` at its world size, as every launch of a driver is checked
    before any GPU time is spent; returns the loaded recipe.

    Raises:
        SystemExit: the recipe refuses them, naming the configuration ``name``.
    """
    from composer_qsdp.recipes.train import RecipeError, load_recipe

    try:
        return load_recipe(recipe, list(overrides), world_size=world_size)
    except RecipeError as err:
        raise SystemExit(f"recipe error in {name} ({recipe.name}): {err}") from None


def train_data(data: str | None, out_dir: Path, samples: int, seq_len: int) -> tuple[Path, int | None]:
    """Where a driver's launches read their samples: ``data`` (real MDS shards, checked), else random-token shards
    of ``samples`` samples under ``out_dir``, which :func:`random_token_shards` writes before the first launch.
    Returns the folder and the samples to generate there (None for real shards).

    Raises:
        SystemExit: ``data`` holds no ``train`` split.
    """
    if data:
        found = Path(data).resolve()
        if not (found / "train" / "index.json").is_file():
            raise SystemExit(f"--data {str(found)!r} holds no train/index.json (build shards with "
                             "python -m composer_qsdp.recipes.data.build)")
        return found, None
    return out_dir / f"synthetic-t{seq_len}-n{samples}", samples


def random_token_shards(out: Path, samples: int, seq_len: int, vocab_size: int) -> Path:
    """MDS shards (a ``train`` split) of ``samples`` uniformly random token sequences, in the files of
    :func:`composer_qsdp.recipes.data.write_token_shards`; reused when ``out`` already exists. Seeded: the same
    arguments give the same tokens. Throughput and memory do not depend on the token values."""
    from streaming import MDSWriter

    from composer_qsdp.recipes.data.integrity import SHARD_HASHES
    from composer_qsdp.recipes.data.shards import TOKENS_COLUMN, TRAIN_SPLIT, shards_exist

    if shards_exist(out, (TRAIN_SPLIT,)):
        return out
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    rng = np.random.default_rng(0)
    with MDSWriter(out=str(tmp / "train"), columns={TOKENS_COLUMN: f"ndarray:uint16:{seq_len}"},
                   hashes=list(SHARD_HASHES), size_limit="64mb") as writer:
        for _ in range(samples):
            writer.write({TOKENS_COLUMN: rng.integers(0, vocab_size, seq_len, dtype=np.uint16)})
    tmp.rename(out)
    return out


def short_run_overrides(batches: int, global_batch: int, micro: int, data: Path, metrics_file: Path) -> list[str]:
    """Recipe overrides of a benchmark launch: ``batches`` optimizer steps of ``global_batch`` samples in
    micro-batches of ``micro`` from the local shards ``data``, evaluation, checkpoints, resumption and console
    output off, the metrics file at ``metrics_file``."""
    return [f"max_duration={batches}ba", f"global_train_batch_size={global_batch}",
            f"device_train_microbatch_size={micro}", "data.remote=null", f"data.local={data}", "data.eval_split=null",
            "save_folder=null", "load_path=null", "autoresume=false", "progress_bar=false", "log_to_console=false",
            f"metrics_file={metrics_file}"]


def add_sweep_arguments(parser: argparse.ArgumentParser, driver: str, failed: str = "failed") -> None:
    """The options of a driver that launches one recipe configuration after the other into a resumable results
    directory (``bench_e2e.py``, ``bench_memory.py``): data, results directory, time budget, retries, overrides.
    ``failed`` says which recorded results ``--retry-failed`` reruns."""
    parser.add_argument("--data", help="real MDS token shards (default: random tokens generated in --out-dir)")
    parser.add_argument("--out-dir", help=f"results directory (default runs/{driver}/<family>-<nproc>x)")
    parser.add_argument("--time-budget", type=float, help="seconds this command may use; it stops launching, "
                                                          "kills a launch that would overrun, writes the table")
    parser.add_argument("--min-launch-s", type=float, default=120.0,
                        help="start no launch with less budget left than this (default 120 s)")
    parser.add_argument("--retry-failed", action="store_true", help=f"rerun configurations recorded as {failed}")
    parser.add_argument("-o", "--override", action="append", default=[],
                        help="extra recipe override key=value for every launch (repeatable)")


def pending(path: Path, retry_failed: bool) -> bool:
    """Whether the result recorded at ``path`` is still to run: missing, or not ``ok`` with ``retry_failed``."""
    if not path.is_file():
        return True
    return retry_failed and read_json(path)["status"] != "ok"


class Interrupted(Exception):
    """The driver received SIGTERM or SIGINT (e.g. an outer time limit): stop, keep what is finished."""


def launcher(nproc: int) -> list[str]:
    """Composer's launcher for ``nproc`` local processes: the ``composer`` script beside this interpreter, or
    ``python -m composer.cli`` where wheels were installed without scripts (the GPU machines)."""
    script = Path(sys.executable).parent / "composer"
    base = [str(script)] if script.exists() else [sys.executable, "-m", "composer.cli"]
    return [*base, "-n", str(nproc)]


def speculation_counts(series: Mapping[str, Mapping[int, float]], since: int = 0,
                       until: int | None = None) -> dict[str, int] | None:
    """QSDP's speculative-update counts (the fields of :class:`composer_qsdp.engine.SpeculationStats`, logged
    cumulatively per batch as ``qsdp/speculation/<field>``) over batches ``since + 1 .. until`` (``until`` None: the
    last logged), from ``series`` (metric name -> {batch: value}); None where a count was not logged at ``until``."""
    import dataclasses

    from composer_qsdp.engine import SpeculationStats

    counts = {}
    for field in dataclasses.fields(SpeculationStats):
        values = series.get(f"qsdp/speculation/{field.name}") or {}
        end = max(values, default=None) if until is None else until
        if end not in values:
            return None
        counts[field.name] = int(values[end] - values.get(since, 0))
    return counts


def torchrun(nproc: int) -> list[str]:
    """torch's ``torchrun`` for ``nproc`` local processes, as the throughput benchmark launches them.

    Composer's launcher imports all of Composer before it starts a rank, and the ranks then import it again;
    ``torchrun`` imports torch alone. In the GPT-1.3B launches of ``results/2026-11-27_h200x4_d6bcf73`` (Composer's
    launcher), 15-23 s of each 41-74 s launch lay outside the ranks' start-up and steps. Its ranks get the variables
    Composer's launcher sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
    ``MASTER_PORT``), and ``NODE_RANK=0`` and ``TORCH_NCCL_ASYNC_ERROR_HANDLING=1`` through ``env``, as Composer's
    launcher sets them: once the process group exists, Composer's checkpoint loading reads ``NODE_RANK`` and fails
    where it is unset. Every rank's output goes to the log."""
    return ["env", "NODE_RANK=0", "TORCH_NCCL_ASYNC_ERROR_HANDLING=1", sys.executable, "-m", "torch.distributed.run",
            "--standalone", f"--nproc-per-node={nproc}"]


def train_command(nproc: int, recipe: Path, overrides: Sequence[str],
                  launch: Callable[[int], list[str]] = launcher) -> list[str]:
    """``composer -n nproc -m composer_qsdp.recipes.train recipe key=value ...`` (or another ``launch``)."""
    return [*launch(nproc), "-m", "composer_qsdp.recipes.train", str(recipe), *overrides]


def recorded_env(env: Mapping[str, str]) -> str:
    """The NCCL/device variables of ``env`` as ``K=V`` words (what a measurement's transport depends on)."""
    words = [f"{k}={v}" for k, v in sorted(env.items()) if k.startswith(ENV_PREFIXES)]
    return " ".join(words) or "(none set)"


def header(nproc: int) -> dict[str, str]:
    """Device, software versions, date (UTC), git revision and this process's command line, for a result
    record."""
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        device = f"{nproc} x {props.name} ({props.total_memory / 2**30:.0f} GiB) of {torch.cuda.device_count()} visible"
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    else:
        device, nccl = f"{nproc} CPU processes (gloo), {os.cpu_count()} cores", "n/a"
    return {
        "device": f"{device}, host {socket.gethostname()}",
        "torch": torch.__version__,
        "nccl": nccl,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "git": git_revision(("composer_qsdp", "benchmarks", "yamls")),  # the recipes too
        "command": command_line(),
    }


def header_lines(head: Mapping[str, str]) -> list[str]:
    return [f"- {k}: `{v}`" for k, v in head.items()]


def write_outputs(stem: str, out_dir: Path, files: Mapping[str, str | bytes]) -> list[Path]:
    """Write ``{stem}{suffix}`` for each ``suffix -> content`` into ``out_dir``, each whole then renamed (a reader
    polling the folder never sees half a file). Returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for suffix, content in files.items():
        path, tmp = out_dir / f"{stem}{suffix}", out_dir / f".{stem}{suffix}.tmp"
        tmp.write_bytes(content if isinstance(content, bytes) else content.encode())
        tmp.replace(path)
        written.append(path)
    return written


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def write_json(path: Path, data: Any) -> None:
    """Write-then-rename, so an interrupted driver never leaves a truncated record that looks finished."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def recipe_dir(model: str, path: str | None) -> Path:
    """The recipe family's directory: ``path`` when given, else ``yamls/gpt-<model>/``.

    Raises:
        SystemExit: it does not exist.
    """
    found = Path(path) if path else ROOT / "yamls" / f"gpt-{model}"
    if not found.is_dir():
        raise SystemExit(f"recipe directory {str(found)!r} does not exist (--model {model!r} reads "
                         "yamls/gpt-<model>/; or pass --recipe-dir)")
    return found.resolve()


def check_settings(out_dir: Path, settings: Mapping[str, Any]) -> None:
    """Record ``settings`` in ``out_dir/settings.json``, or check them against the recorded ones: results of one
    directory must come from one set of settings.

    Raises:
        SystemExit: the recorded settings differ; the message names the keys and both values.
    """
    path = out_dir / "settings.json"
    if not path.is_file():
        write_json(path, dict(settings))
        return
    stored = read_json(path)
    differ = differing_keys(stored, settings)
    if differ:
        raise SystemExit(f"{out_dir} holds results of other settings ({', '.join(differ)}: "
                         f"{ {k: stored.get(k) for k in differ} } vs now { {k: settings.get(k) for k in differ} }); "
                         "pass another --out-dir or remove it")


def differing_keys(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """The keys, sorted, whose values differ between ``a`` and ``b`` (a key missing on one side counts as None)."""
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def fmt(value: float | None, spec: str, suffix: str = "") -> str:
    """``value`` formatted with ``spec`` plus ``suffix``, or ``n/a`` for None (a table cell)."""
    return "n/a" if value is None else f"{value:{spec}}{suffix}"


def log_tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


class Budget:
    """Wall-clock seconds this driver may still use (None: unlimited), so that it stops its launches and writes
    its tables before an outer limit kills it.

    Args:
        seconds: the budget from now, or None.
    """

    def __init__(self, seconds: float | None) -> None:
        if seconds is not None and seconds <= 0:
            raise ValueError(f"time budget {seconds!r} s is invalid; it must be > 0 seconds")
        self._end = None if seconds is None else time.monotonic() + seconds

    def remaining(self) -> float | None:
        """Seconds left (never negative), or None without a budget."""
        return None if self._end is None else max(0.0, self._end - time.monotonic())

    def allows(self, seconds: float) -> bool:
        """Whether ``seconds`` still fit."""
        left = self.remaining()
        return left is None or left >= seconds


#: What a launch's log says when a rank ran out of device memory: the allocator's error, or CUDA's own (a context,
#: a library workspace).
OUT_OF_MEMORY = re.compile(r"OutOfMemoryError|CUDA out of memory|CUDA error: out of memory")


def out_of_memory(log_path: Path) -> bool:
    """Whether the launch log at ``log_path`` says a rank ran out of device memory (:data:`OUT_OF_MEMORY`)."""
    return OUT_OF_MEMORY.search(log_path.read_text(errors="replace")) is not None


def launch_env() -> dict[str, str]:
    """This process's environment for training launches, with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``
    unless it sets the variable: processes sharing a GPU cannot use each other's cached blocks, and expandable segments
    keep what each reserves close to what it allocates (without them a `w8g8` GPT-125M rank at micro-batch 16 reserved
    13.3 GB for 9.4 GB allocated: ``results/2026-11-29_h200x2_cf499c3``), so more of them fit. The allocator's layout
    changes no result."""
    env = dict(os.environ)
    env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    return env


def start(command: Sequence[str], log_path: Path, env: Mapping[str, str]) -> subprocess.Popen:
    """Start ``command`` in the repository root, in its own process group (so it can be killed whole),
    stdout and stderr into ``log_path``. On Linux it gets SIGTERM when this process dies, however it dies."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        log.write(f"$ {' '.join(command)}\n{recorded_env(env)}\n\n")
        log.flush()
        return subprocess.Popen(list(command), cwd=ROOT, env=dict(env), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True,
                                preexec_fn=_end_with(os.getpid()) if sys.platform == "linux" else None)


def _end_with(parent: int) -> Callable[[], None]:
    """A ``preexec_fn`` asking Linux to SIGTERM the child when ``parent`` dies: a driver killed outright (SIGKILL at
    a command's time limit on a GPU host) runs no cleanup, and its launches, in sessions of their own, would
    otherwise keep training and holding GPU memory that the next launches then fail to get. Linux signals when the
    *thread* that started the child ends: the drivers start launches from their main thread."""

    def preexec() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the request
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def _signal_group(proc: subprocess.Popen, sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _signal_ranks(proc: subprocess.Popen, sig: signal.Signals) -> None:
    """Send ``sig`` to the processes that launcher ``proc`` started (its ranks), or to its whole group while it has
    started none. Composer's launcher, signalled itself, SIGKILLs its ranks 30 s later: a save under way then (a
    GPT-350M checkpoint with 15 processes writing beside it took longer) is left unfinished, and autoresume refuses
    the folder. Signalled directly, the ranks save and exit, and the launcher, seeing them gone, exits too."""
    import psutil  # Composer's dependency

    try:
        ranks = psutil.Process(proc.pid).children()
    except psutil.NoSuchProcess:
        return
    if not ranks:
        _signal_group(proc, sig)
    for rank in ranks:
        with suppress(psutil.NoSuchProcess):
            rank.send_signal(sig)


def kill(*procs: subprocess.Popen, grace_s: float | None = None) -> None:
    """SIGTERM the ranks of the launches ``procs`` all at once, then SIGKILL each launch's process group still
    alive ``grace_s`` (default :data:`KILL_GRACE_S`) seconds later: stopping several launches takes one grace
    period, not one each (five arms stopped one after another overran a 600 s device call)."""
    alive = [p for p in procs if p.poll() is None]
    for proc in alive:
        _signal_ranks(proc, signal.SIGTERM)
    deadline = time.monotonic() + (KILL_GRACE_S if grace_s is None else grace_s)
    for proc in alive:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()


def run(command: Sequence[str], log_path: Path, env: Mapping[str, str], budget: Budget) -> int | None:
    """Run ``command`` to completion within ``budget``; its exit status, or None when the budget ran out (the
    process group is killed then)."""
    proc = start(command, log_path, env)
    try:
        return proc.wait(budget.remaining())
    except subprocess.TimeoutExpired:
        kill(proc)
        return None
    finally:
        kill(proc)  # also on Interrupted: never leave ranks behind


def sweep_or_stop(sweep: Callable[[], str], synthetic: tuple[Path, int, int, int] | None) -> str:
    """``sweep()``'s status, after writing the random-token shards ``synthetic`` (``random_token_shards``'
    arguments) when the run has no data of its own; ``"incomplete"`` when a signal stops it (inside
    :func:`stop_on_signals`)."""
    try:
        if synthetic is not None:
            random_token_shards(*synthetic)
        return sweep()
    except Interrupted as sig:
        print(f"stopped by {sig}")
        return "incomplete"


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """Turn SIGTERM and SIGINT into :class:`Interrupted` inside the block, so a driver killed by an outer time
    limit still kills its launches and writes what is finished."""

    def handler(signum: int, frame: object) -> None:
        raise Interrupted(signal.Signals(signum).name)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
