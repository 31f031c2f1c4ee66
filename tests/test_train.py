"""The training entrypoint: a tiny recipe on 1 process (in-process) and 2 processes (the real ``composer``
launcher): the loss falls, checkpoints are written, resuming reproduces the uninterrupted losses, Composer's
loggers receive QSDP's metrics; a Hugging Face GPT-2 from the recipe; bad recipes (llm-foundry's spellings among
them) stop before anything is built, with a message naming the key; ``--help`` lists every key at once."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
import sysconfig
import typing
from pathlib import Path

import pytest
import torch
from torch.distributed.fsdp import FSDPModule

import composer_qsdp.recipes.data
import composer_qsdp.fsdp2
import composer_qsdp.recipes.models
import e2e_common  # benchmarks/ (tests/conftest.py): Composer's launcher command
from composer_qsdp.recipes.data import write_token_shards
from composer_qsdp.recipes.data.sources import python_source_documents
from composer_qsdp.recipes.models import GPTConfig, hf_causal_lm_config
from composer_qsdp.recipes.loader import ALGORITHMS, CALLBACKS, LOGGERS, TrainRecipe
from composer_qsdp.recipes.train import RecipeError, load_recipe, main, train

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "yamls" / "cpu" / "gpt-tiny-baseline.yaml"
QSDP_RECIPE = ROOT / "yamls" / "cpu" / "gpt-tiny-qsdp.yaml"
HF_RECIPE = ROOT / "yamls" / "cpu" / "hf-gpt2-tiny-qsdp.yaml"
SEQ_LEN = 32


@pytest.fixture(scope="module")
def corpus_shards(tmp_path_factory) -> Path:
    """The standard library's ``email`` package source (about 30 files, capped at 100K train tokens) as 32-token
    samples: a real corpus on every machine, the GPU machines included, which lack the demo extra's gensim."""
    out = tmp_path_factory.mktemp("corpus") / f"email-gpt2-t{SEQ_LEN}"
    email_package = Path(sysconfig.get_paths()["stdlib"]) / "email"
    write_token_shards(python_source_documents(0.3, [email_package]), out, SEQ_LEN, max_train_tokens=100_000)
    return out


def tiny_overrides(shards: Path, run_dir: Path, *extra: str) -> list[str]:
    """Shrink the CPU recipe to a few quick steps on the test shards."""
    return [f"data.local={shards}", f"model.max_seq_len={SEQ_LEN}", "global_train_batch_size=8",
            "device_eval_batch_size=4", "eval_subset_num_batches=1", "progress_bar=false",
            "scheduler.t_warmup=2ba", f"metrics_file={run_dir / 'metrics.json'}", *extra]


def train_losses(run_dir: Path) -> dict[int, float]:
    series = json.loads((run_dir / "metrics.json").read_text())["metrics"]["loss/train/total"]
    return {batch: loss for batch, loss in series}


def launch(nproc: int, recipe: Path, overrides: list[str], timeout: int = 400) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(e2e_common.train_command(nproc, recipe, overrides),
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


# ------------------------------------------------------------------------------------------- one process
def test_one_process_trains_checkpoints_and_resumes_exactly(corpus_shards, tmp_path, capsys):
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    common = ["max_duration=16ba", "eval_interval=8ba"]
    assert main([str(BASELINE), *tiny_overrides(corpus_shards, full, *common, f"save_folder={full / 'ckpt'}",
                                                "save_interval=8ba")]) == 0
    # The start-up phases, in order, printed and logged; they add up to the total.
    assert re.search(r"^start-up [0-9.]+ s: recipe [0-9.]+ s, imports [0-9.]+ s, process group [0-9.]+ s, data "
                     r"[0-9.]+ s, model [0-9.]+ s, trainer [0-9.]+ s$", capsys.readouterr().out, re.MULTILINE)
    startup = {k: v for k, v in json.loads((full / "metrics.json").read_text())["hyperparameters"].items()
               if k.startswith("startup/")}
    phases = ["recipe", "imports", "process_group", "data", "model", "trainer"]
    assert list(startup) == [f"startup/{p}_s" for p in phases] + ["startup/total_s"]
    assert startup["startup/total_s"] == pytest.approx(sum(startup[f"startup/{p}_s"] for p in phases), abs=0.05)
    losses = train_losses(full)
    assert sorted(losses) == list(range(16))
    first, last = sum(losses[b] for b in range(4)) / 4, sum(losses[b] for b in range(12, 16)) / 4
    assert last < first - 0.5, f"loss did not fall: {first:.3f} -> {last:.3f}"
    assert (full / "ckpt" / "ep0-ba8").is_dir() and (full / "ckpt" / "ep0-ba16").is_dir()
    metrics = json.loads((full / "metrics.json").read_text())["metrics"]
    assert "metrics/val/LanguagePerplexity" in metrics

    assert main([str(BASELINE), *tiny_overrides(corpus_shards, resumed, *common,
                                                f"load_path={full / 'ckpt' / 'ep0-ba8'}")]) == 0
    resumed_losses = train_losses(resumed)
    assert sorted(resumed_losses) == list(range(8, 16))
    assert resumed_losses == {b: losses[b] for b in range(8, 16)}  # same weights, optimizer, data position


def test_deterministic_mode_switches_the_deterministic_kernels_on(corpus_shards, tmp_path, monkeypatch):
    """``deterministic_mode`` turns on Composer's deterministic mode before any CUDA work (on a GPU a seed's run then
    repeats bit for bit: ``test_gpu_deterministic_mode_repeats_a_qsdp_run_bit_for_bit``); on the CPU, whose kernels
    are deterministic anyway, it trains the same losses."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)  # restored after the test
    common = ["max_duration=4ba", "eval_interval=4ba"]
    plain, deterministic = tmp_path / "plain", tmp_path / "deterministic"
    assert main([str(BASELINE), *tiny_overrides(corpus_shards, plain, *common)]) == 0
    assert not torch.are_deterministic_algorithms_enabled()
    cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    try:
        assert main([str(BASELINE), *tiny_overrides(corpus_shards, deterministic, *common,
                                                    "deterministic_mode=true")]) == 0
        assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    finally:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn
    assert train_losses(deterministic) == train_losses(plain)


# ------------------------------------------------------------------------------------------ two processes
def test_two_processes_through_the_launcher(corpus_shards, tmp_path):
    result = launch(2, QSDP_RECIPE, tiny_overrides(corpus_shards, tmp_path, "max_duration=12ba", "eval_interval=12ba",
                                                   f"save_folder={tmp_path / 'ckpt'}", "save_interval=12ba",
                                                   f"loggers.file.filename={tmp_path}/log-rank{{rank}}.txt"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    losses = train_losses(tmp_path)
    assert sum(losses[b] for b in range(9, 12)) / 3 < sum(losses[b] for b in range(3)) / 3 - 0.3
    # FSDP2 sharded checkpoint: one DCP file per rank.
    assert sorted(p.name for p in (tmp_path / "ckpt" / "ep0-ba12").glob("*.distcp")) == ["__0_0.distcp",
                                                                                         "__1_0.distcp"]
    # Its checksum manifest, the ranks hashing in turn: every file of the folder.
    manifest = json.loads((tmp_path / "ckpt" / "ep0-ba12" / "checksums.json").read_text())["files"]
    assert sorted(manifest) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    summary = json.loads((tmp_path / "metrics.json").read_text())["communication"]["QSDP"]
    assert 0 < summary["total"]["sent"] < summary["total"]["bf16"]
    assert "QSDP communication" in result.stdout
    # Composer's FileLogger, from the recipe's loggers section: QSDP's per-batch gradient bytes add up to its report
    # (gradients move in training only; the weights' total also holds the evaluation's gathers).
    logged = re.findall(r"\[metric\]\[batch=(\d+)\]: qsdp/grads/bytes_sent: (\d+)",
                        (tmp_path / "log-rank0.txt").read_text())
    assert sorted(int(b) for b, _ in logged) == list(range(1, 13))
    assert sum(int(v) for _, v in logged) == summary["grads"]["sent"]


@pytest.mark.slow  # a check of the seed protocol's one-rank baseline (benchmarks/README.md), about 100 s on 2 cores
def test_one_rank_with_accumulation_trains_what_two_ranks_train(corpus_shards, tmp_path):
    """The convergence driver's ``baseline-1r`` arm: plain FSDP2 on one rank, the global batch in two micro-batches,
    reads the same samples per step as two ranks of one micro-batch each and averages the same gradients, so every
    step's loss and the held-out loss equal the 2-rank run's up to fp32 summation order (another data order or
    initialization moves them by far more than the tolerance: a different seed changes the first loss itself)."""
    common = ["max_duration=6ba", "eval_interval=6ba", "device_train_microbatch_size=4", "eval_subset_num_batches=-1"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert main([str(BASELINE), *tiny_overrides(corpus_shards, one, *common)]) == 0
    result = launch(2, BASELINE, tiny_overrides(corpus_shards, two, *common))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    metrics = [json.loads((d / "metrics.json").read_text())["metrics"] for d in (one, two)]
    losses = [dict(m["loss/train/total"]) for m in metrics]
    assert sorted(losses[0]) == sorted(losses[1]) == list(range(6))
    assert losses[0][5] < losses[0][0] - 0.3  # it trained
    for batch, loss in losses[0].items():
        assert loss == pytest.approx(losses[1][batch], rel=1e-5), batch
    (step, val), = metrics[0]["metrics/val/LanguageCrossEntropy"]
    assert step == 6 and metrics[1]["metrics/val/LanguageCrossEntropy"] == [[6, pytest.approx(val, rel=1e-5)]]


def test_hugging_face_gpt2_in_one_process(corpus_shards, tmp_path):
    """A transformers GPT-2 (random weights) from the recipe's model section: one FSDP2 unit per GPT2Block plus
    the root, batches with labels, Composer's evaluation."""
    recipe = load_recipe(HF_RECIPE, tiny_overrides(corpus_shards, tmp_path, "max_duration=4ba", "eval_interval=4ba",
                                                   "model.config.n_layer=3"))
    # Without QSDP: in one process FSDP2 sends nothing for it to quantize (the next test runs it on two).
    trainer = train(dataclasses.replace(recipe, algorithm_kwargs={}))
    units = [type(m).__name__ for m in trainer.state.model.modules() if isinstance(m, FSDPModule)]
    assert sorted(units) == ["FSDPGPT2Block"] * 3 + ["FSDPGPT2LMHeadModel"]
    metrics = json.loads((tmp_path / "metrics.json").read_text())["metrics"]
    assert sorted(b for b, _ in metrics["loss/train/total"]) == [0, 1, 2, 3]
    (batch, cross_entropy), = metrics["metrics/val/LanguageCrossEntropy"]
    assert batch == 4 and 9 < cross_entropy < 11.5  # ~ln(50257) = 10.8 for random weights


@pytest.mark.slow  # 40 s; the HF model in-process: tests/recipes/models/test_hf_model.py
def test_hugging_face_gpt2_with_qsdp_on_two_processes(corpus_shards, tmp_path):
    """The Hugging Face recipe as shipped (QSDP W8G8) through Composer's launcher; one FSDP unit per GPT2Block."""
    result = launch(2, HF_RECIPE, tiny_overrides(corpus_shards, tmp_path, "max_duration=10ba", "eval_interval=10ba",
                                                 "model.config.n_layer=3",
                                                 f"loggers.file.filename={tmp_path}/log-rank{{rank}}.txt"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    losses = train_losses(tmp_path)
    assert sorted(losses) == list(range(10))
    assert sum(losses[b] for b in range(7, 10)) / 3 < sum(losses[b] for b in range(3)) / 3 - 0.3
    # 3 blocks + the model's embeddings, head and final norm as the root unit.
    assert "[hyperparameter]: qsdp/fsdp_units: 4" in (tmp_path / "log-rank0.txt").read_text()
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    grads = metrics["communication"]["QSDP"]["grads"]
    assert grads["calls"] == 4 * 10 and 0 < grads["sent"] < grads["bf16"]
    assert "metrics/val/LanguagePerplexity" in metrics["metrics"]


@pytest.mark.slow
def test_two_processes_qsdp_resume_reproduces_losses(corpus_shards, tmp_path):
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    common = ["max_duration=10ba", "eval_interval=10ba"]
    result = launch(2, QSDP_RECIPE, tiny_overrides(corpus_shards, full, *common, f"save_folder={full / 'ckpt'}",
                                                   "save_interval=5ba"))
    assert result.returncode == 0, result.stderr[-3000:]
    result = launch(2, QSDP_RECIPE, tiny_overrides(corpus_shards, resumed, *common,
                                                   f"load_path={full / 'ckpt' / 'ep0-ba5'}"))
    assert result.returncode == 0, result.stderr[-3000:]
    losses, resumed_losses = train_losses(full), train_losses(resumed)
    assert resumed_losses == {b: losses[b] for b in range(5, 10)}


# ------------------------------------------------------------------------------------------- bad recipes
@pytest.mark.parametrize("overrides, message", [
    (["optimzer.lr=1"], "unknown recipe key 'optimzer'"),
    (["optimizer.lrr=1"], "recipe key 'optimizer.lrr' is unknown; did you mean 'lr'?; 'optimizer' takes: lr, betas"),
    (["global_train_batch_size=lots"], "recipe key 'global_train_batch_size' has the wrong type"),
    (["precision=amp_bf16"], "recipe key 'precision' = 'amp_bf16' is invalid; Composer trains on CPU in fp32"),
    (["device=tpu"], "recipe key 'device' = 'tpu' is invalid; allowed: cpu, gpu"),
    (["model.n_heads=5"], "recipe section 'model' is invalid: GPTConfig.n_heads=5 does not divide"),
    (["model.preset=7b"], "unknown GPT preset '7b'"),
    (["model.width=5"], "unknown GPT config field"),
    (["max_duration=10"], "recipe key 'max_duration' = '10' is not a duration"),
    (["scheduler.t_warmup=soon"], "recipe key 'scheduler.t_warmup' = 'soon' is not a duration"),
    (["device_train_microbatch_size=3"], "'device_train_microbatch_size' = 3 is invalid; it must divide"),
    (["optimizer.betas=[0.9]"], "recipe key 'optimizer.betas' = [0.9] is invalid"),
    (["optimizer.lr=-1"], "recipe key 'optimizer.lr' = -1.0 is invalid"),
    (["optimizer.lr=inf"], "recipe key 'optimizer.lr' = inf is invalid; it must be a finite number > 0"),
    (["fsdp.mixed_precision=HALF"], "recipe key 'fsdp.mixed_precision' = 'HALF' is invalid; allowed: DEFAULT"),
    (["algorithms.sparsify.ratio=0.5"], "recipe key 'algorithms.sparsify' = 'sparsify' is invalid; known algorithms"),
    (["fsdp=null", "algorithms.qsdp.weight_bits=8"], "needs an 'fsdp' section"),
    (["autoresume=true"], "autoresume needs save_folder and run_name"),
    (["max_duration"], "must have the form key=value"),
    # Durations: positive, and in a unit Composer can train for (issue 16: these failed after distributed setup).
    (["max_duration=-5ba"], "recipe key 'max_duration' = '-5ba' is invalid; it must be > 0"),
    (["max_duration=0ba"], "recipe key 'max_duration' = '0ba' is invalid; it must be > 0"),
    (["max_duration=0.5dur"], "'max_duration' = '0.5dur' is invalid; its unit must be one of ep, iter, ba, sp, tok"),
    (["eval_interval=0ba"], "recipe key 'eval_interval' = '0ba' is invalid; it must be > 0"),
    (["scheduler.t_warmup=-1ba"], "recipe key 'scheduler.t_warmup' = '-1ba' is invalid; it must be >= 0"),
    # The one seed range (validate.SEED_BITS): Composer's, and QSDP's own seed's.
    (["seed=-1"], "recipe key 'seed' = -1 is invalid; it must be an integer in [0, 2**32)"),
    (["seed=4294967296"], "recipe key 'seed' = 4294967296 is invalid; it must be an integer in [0, 2**32)"),
    # The collectives' timeout (issue 16: a stalled rank must end the run): finite, positive seconds.
    (["dist_timeout=0"], "recipe key 'dist_timeout' = 0.0 is invalid; it must be a finite number of seconds > 0"),
    (["dist_timeout=-3"], "recipe key 'dist_timeout' = -3.0 is invalid; it must be a finite number of seconds > 0"),
    (["dist_timeout=nan"], "recipe key 'dist_timeout' = nan is invalid; it must be a finite number of seconds > 0"),
    (["dist_timeout=inf"], "recipe key 'dist_timeout' = inf is invalid; it must be a finite number of seconds > 0"),
    (["dist_timeout=soon"], "recipe key 'dist_timeout' has the wrong type"),
    # Misspellings and llm-foundry's spellings without a same-meaning key here.
    (["optimzer.lr=1"], "unknown recipe key 'optimzer'; did you mean 'optimizer'?"),
    (["data.locl=x"], "unknown recipe key 'data.locl'; did you mean 'local'?; 'data' takes: local, remote"),
    (["train_loader.name=text"], "unknown recipe key 'train_loader' (llm-foundry's spelling); here: data: MDS"),
    (["max_seq_len=64"], "unknown recipe key 'max_seq_len' (llm-foundry's spelling); here: model.max_seq_len"),
    (["fsdp.sharding_strategy=FULL_SHARD"], "here: fsdp.reshard_after_forward (true: FULL_SHARD"),
    (["algorithms.gradient_clipping.clipping_threshold=1"], "here: grad_clip_norm"),
    (["algorithms.qsdpp.weight_bits=8"], "known algorithms: qsdp, zero_one_adam; did you mean 'qsdp'?"),
    (["optimizer.name=sgdd"], "recipe key 'optimizer.name' = 'sgdd' is invalid: no optimizer of that name; did you "
                              "mean 'sgd'?; known: adadelta"),
    (["scheduler.name=cosine_warmup"], "did you mean 'cosine_with_warmup'?"),
    (["model.name=hf_causl_lm"], "'model.name' = 'hf_causl_lm' is invalid; did you mean 'hf_causal_lm'?"),
    (["model.n_layer=2"], "unknown GPT config field(s) n_layer; did you mean 'n_layers'?"),
    # Loggers and callbacks: Composer's classes by name, their arguments checked against the class.
    (["loggers.wandbb.project=x"], "recipe key 'loggers.wandbb': no logger named 'wandbb'; did you mean 'wandb'?"),
    (["callbacks.speed_monitor.windw_size=3"], "'callbacks.speed_monitor.windw_size' is unknown; did you mean "
                                               "'window_size'?"),
    (["callbacks.lr_monitor=3"], "recipe key 'callbacks.lr_monitor' = 3 is invalid; give its keyword arguments"),
])
def test_bad_recipe_names_the_key(overrides, message):
    with pytest.raises(RecipeError) as err:
        load_recipe(BASELINE, overrides)
    assert message in str(err.value)


def test_any_composer_logger_or_callback_by_name_or_path(tmp_path):
    """Names beyond this package's table resolve to Composer's own public classes (class name or snake case), and
    a 'module:Class' path to any class; the arguments are checked against the class either way."""
    from composer.callbacks import EarlyStopper, NaNMonitor
    from composer.loggers import InMemoryLogger

    from composer_qsdp.recipes.loader import component_class

    (tmp_path / "open.yaml").write_text(f"""
base: {BASELINE}
loggers: {{InMemoryLogger: {{}}}}
callbacks:
  early_stopper: {{monitor: LanguageCrossEntropy, dataloader_label: val}}
  "composer.callbacks:NaNMonitor": {{}}
""")
    recipe = load_recipe(tmp_path / "open.yaml")
    assert recipe.logger_kwargs == {"InMemoryLogger": {}}
    assert recipe.callback_kwargs["early_stopper"] == {"monitor": "LanguageCrossEntropy", "dataloader_label": "val"}
    classes = {name: component_class("callbacks", name) for name in recipe.callback_kwargs}
    assert classes == {"speed_monitor": classes["speed_monitor"], "lr_monitor": classes["lr_monitor"],
                       "early_stopper": EarlyStopper, "composer.callbacks:NaNMonitor": NaNMonitor}
    assert component_class("loggers", "InMemoryLogger") is InMemoryLogger
    with pytest.raises(RecipeError, match="'callbacks.early_stopper.monitr' is unknown; did you mean 'monitor'"):
        load_recipe(tmp_path / "open.yaml", ["callbacks.early_stopper.monitr=x"])
    with pytest.raises(RecipeError, match=r"cannot import 'composer.callbacks:NoSuch' \('module:Class'\)"):
        component_class("callbacks", "composer.callbacks:NoSuch")


@pytest.mark.parametrize("progress_bar,log_to_console,terminal,expected", [
    (None, None, True, (True, False)),    # the recipe default on a terminal: the bar
    (None, None, False, (False, True)),   # in a log file or a notebook: metric lines, no ANSI redraws
    (True, None, False, (True, False)),   # an explicit choice wins
    (False, False, True, (False, False)),
])
def test_progress_bar_only_on_a_terminal_by_default(progress_bar, log_to_console, terminal, expected):
    from composer_qsdp.recipes.train import console_output

    assert console_output(progress_bar, log_to_console, terminal) == expected
    defaults = load_recipe(BASELINE).cfg
    assert (defaults.progress_bar, defaults.log_to_console) == (None, None)


def test_every_named_optimizer_and_schedule_keeps_the_recipe_defaults(tmp_path):
    """The recipe's own names build their class with the recipe's defaults for the keys a section leaves out (the
    paper's Adam settings, a 100-batch warm-up to 0.1 x lr), and with the section's keys where it gives them."""
    from composer.core import Time

    from composer_qsdp.recipes.loader import OPTIMIZERS, SCHEDULERS, build_optimizer, build_scheduler, load_class

    (tmp_path / "bare.yaml").write_text("model: {preset: tiny}\ndata: {local: x}\nmax_duration: 8ba\n"
                                        "global_train_batch_size: 8\noptimizer: {lr: 0.1}\n")
    for name, builder in OPTIMIZERS.items():
        recipe = load_recipe(tmp_path / "bare.yaml", [f"optimizer.name={name}"])
        optimizer = build_optimizer(recipe, [torch.nn.Parameter(torch.zeros(2))])
        assert type(optimizer) is load_class(builder.target), name
        assert (optimizer.defaults["lr"], optimizer.defaults["betas"], optimizer.defaults["eps"],
                optimizer.defaults["weight_decay"]) == (0.1, (0.9, 0.95), 1e-8, 0.0), name
        given = load_recipe(tmp_path / "bare.yaml", [f"optimizer.name={name}", "optimizer.betas=[0.8,0.9]"])
        assert build_optimizer(given, [torch.nn.Parameter(torch.zeros(2))]).defaults["betas"] == (0.8, 0.9), name
    for name, builder in SCHEDULERS.items():
        schedule = build_scheduler(load_recipe(tmp_path / "bare.yaml", [f"scheduler.name={name}"]))
        assert type(schedule) is load_class(builder.target), name
        assert (schedule.t_warmup, schedule.alpha_f) == (Time(100, "ba"), 0.1), name


def test_logger_without_its_package_names_the_extra():
    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here")
    with pytest.raises(RecipeError, match=re.escape("'loggers.wandb' needs the wandb package: pip install "
                                                    "'mosaicml[wandb]'")):
        load_recipe(BASELINE, ["loggers.wandb.project=qsdp"])


def test_llm_foundry_spellings_with_the_same_meaning_are_accepted(tmp_path):
    (tmp_path / "foundry.yaml").write_text(f"""
base: {BASELINE}
fsdp_config: {{mixed_precision: FULL, activation_checkpointing: true}}
optimizer: {{name: decoupled_adamw, lr: 1.0e-3}}
scheduler: {{name: cosine_with_warmup, t_warmup: 5ba}}
loggers: {{file: {{filename: log.txt}}}}
callbacks: {{memory_monitor: {{}}, lr_monitor: false}}
""")
    recipe = load_recipe(tmp_path / "foundry.yaml", ["fsdp_config.reshard_after_forward=false"])
    fsdp = recipe.cfg.fsdp
    assert (fsdp.mixed_precision, fsdp.activation_checkpointing, fsdp.reshard_after_forward) == ("FULL", True, False)
    assert recipe.cfg.optimizer.lr == 1e-3 and recipe.cfg.scheduler.t_warmup == "5ba"
    assert recipe.logger_kwargs == {"file": {"filename": "log.txt"}}
    # The base recipe's callbacks, minus the one turned off, plus the new one (defaults).
    assert recipe.callback_kwargs == {"speed_monitor": {"window_size": 10}, "memory_monitor": {}}
    (tmp_path / "both.yaml").write_text(f"base: {BASELINE}\nfsdp_config: {{}}\nfsdp: {{}}\n")
    with pytest.raises(RecipeError, match="sets both 'fsdp_config' .llm-foundry's spelling. and 'fsdp'"):
        load_recipe(tmp_path / "both.yaml")


def test_help_lists_every_key_without_importing_torch():
    code = ("import sys\nfrom composer_qsdp.recipes.train import main\nstatus = main(['--help'])\n"
            "print('HEAVY', [m for m in ('torch', 'composer', 'transformers') if m in sys.modules], status)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.rstrip().endswith("HEAVY [] 0")
    listed = set(re.findall(r"^  ([\w.]+):", out, re.MULTILINE))

    def keys(cls: type, prefix: str = "") -> set[str]:
        found = set()
        for f in dataclasses.fields(cls):
            found.add(prefix + f.name)
            section = [a for a in (f.type, *typing.get_args(typing.get_type_hints(cls)[f.name]))
                       if dataclasses.is_dataclass(a)]
            if section:
                found |= keys(section[0], f"{prefix}{f.name}.")
        return found

    assert keys(TrainRecipe) <= listed
    assert {f"model.{f.name}" for f in dataclasses.fields(GPTConfig)} <= listed
    assert {f"model.{p}" for p in inspect.signature(hf_causal_lm_config).parameters} <= listed
    assert {"model.name", "model.init_device", "model.preset", *LOGGERS, *CALLBACKS, *ALGORITHMS} <= listed
    assert "  seed: int = 17\n" in out and "  optimizer.lr: float (required)\n" in out


def test_missing_keys_and_base_loops(tmp_path):
    (tmp_path / "partial.yaml").write_text("model: {preset: tiny}\ndata: {local: x}\n")
    with pytest.raises(RecipeError) as err:  # both missing-key problems in one error
        load_recipe(tmp_path / "partial.yaml")
    assert err.value.problems[0] == "recipe is missing required key(s): global_train_batch_size, max_duration"
    assert err.value.problems[1].startswith("recipe is missing required key(s): optimizer.lr (")
    with pytest.raises(RecipeError, match=r"missing required key\(s\): optimizer.lr \(the keyword arguments of "
                                          "optimizer.name 'decoupled_adamw' without a default; an optimizer's lr is "
                                          "always required"):
        load_recipe(tmp_path / "partial.yaml", ["global_train_batch_size=8", "max_duration=8ba"])
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(RecipeError, match="base chain loops"):
        load_recipe(tmp_path / "a.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(RecipeError, match="must be a mapping"):
        load_recipe(tmp_path / "list.yaml")
    with pytest.raises(RecipeError, match="does not exist"):
        load_recipe(tmp_path / "absent.yaml")


def test_base_recipe_is_extended_and_overridden(tmp_path):
    (tmp_path / "child.yaml").write_text(f"base: {BASELINE}\nrun_name: child\noptimizer: {{lr: 0.5}}\n")
    cfg = load_recipe(tmp_path / "child.yaml", ["optimizer.eps=0.001"]).cfg
    assert cfg.run_name == "child" and cfg.optimizer.lr == 0.5 and cfg.optimizer.eps == 0.001
    assert list(cfg.optimizer.betas) == [0.9, 0.95]  # the rest comes from the base


def test_errors_stop_before_anything_is_built(tmp_path, monkeypatch, capsys):
    def must_not_run(*args, **kwargs):
        raise AssertionError("built something although the recipe is invalid")

    monkeypatch.setattr(composer_qsdp.recipes.models, "ComposerGPT", must_not_run)
    monkeypatch.setattr(composer_qsdp.recipes.data, "build_token_dataloader", must_not_run)
    assert main([str(BASELINE), "optimizer.lr=0", f"save_folder={tmp_path / 'ckpt'}"]) == 2
    assert "recipe key 'optimizer.lr' = 0.0 is invalid" in capsys.readouterr().err
    assert not (tmp_path / "ckpt").exists()


def test_missing_shards_stop_before_the_model_is_built(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(composer_qsdp.recipes.models, "ComposerGPT", lambda *a, **k: pytest.fail("model built without data"))
    assert main([str(BASELINE), f"data.local={tmp_path / 'nothing'}"]) == 2
    assert (f"recipe error: recipe key 'data.local' = '{tmp_path / 'nothing'}': no MDS token shards there for split(s) "
            "train, val") in capsys.readouterr().err  # at the recipe's check, before any process group


# ------------------------------------------------------------------------------------------------------ GPU
def synthetic_shards(out: Path, seq_len: int) -> Path:
    """Shards of repetitive English-like text (no gensim needed): a model learns it within a few steps."""
    words = "the model shards its weights and gathers them before each layer then scatters gradients".split()
    documents = ((("val" if i % 10 == 0 else "train"), " ".join(words[(i + j) % len(words)] for j in range(3000)))
                 for i in range(100))
    write_token_shards(documents, out, seq_len)
    return out


def gpu_overrides(shards: Path, run_dir: Path, global_batch: int) -> list[str]:
    """The paper recipe cut to a few steps of 2048-token samples on local shards."""
    return ["data.remote=null", f"data.local={shards}", "data.num_workers=0", "max_duration=6ba",
            f"global_train_batch_size={global_batch}", "device_train_microbatch_size=2", "device_eval_batch_size=2",
            "eval_interval=6ba", "eval_subset_num_batches=2", "scheduler.t_warmup=1ba", "save_folder=null",
            "progress_bar=false", f"metrics_file={run_dir / 'metrics.json'}"]


@pytest.mark.gpu
def test_gpu_one_process_paper_recipe(tmp_path):
    shards = synthetic_shards(tmp_path / "shards", 2048)
    assert main([str(ROOT / "yamls" / "gpt-125m" / "baseline.yaml"), *gpu_overrides(shards, tmp_path, 4)]) == 0
    losses = train_losses(tmp_path)
    assert losses[5] < losses[0] - 1.0


@pytest.mark.gpu
def test_gpu_two_processes_qsdp_recipe(tmp_path):
    shards = synthetic_shards(tmp_path / "shards", 2048)
    result = launch(2, ROOT / "yamls" / "gpt-125m" / "qsdp-w8g8.yaml", gpu_overrides(shards, tmp_path, 8))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    losses = train_losses(tmp_path)
    assert losses[5] < losses[0] - 1.0
    traffic = json.loads((tmp_path / "metrics.json").read_text())["communication"]["QSDP"]["total"]
    # bf16 mixed precision: FSDP itself would send bf16, and 8-bit codes need about half of that.
    assert 0.45 < traffic["sent"] / traffic["bf16"] < 0.55
    # One GPU: the two ranks share it over gloo, and the run says so; with two GPUs nothing changes.
    shared = torch.cuda.device_count() < 2
    hyperparameters = json.loads((tmp_path / "metrics.json").read_text())["hyperparameters"]
    assert (hyperparameters["shared_gpu"], hyperparameters["dist_backend"]) == (shared, "gloo" if shared else "nccl")
    assert ("shared_gpu: 2 rank(s) on 1 GPU(s)" in result.stdout + result.stderr) == shared


@pytest.mark.gpu
def test_gpu_deterministic_mode_repeats_a_qsdp_run_bit_for_bit(tmp_path):
    """Two runs of one seed differ by the order of GPU floating-point work, which training amplifies to about 1% of
    the loss (benchmarks/RESULTS.md); with ``deterministic_mode`` they are the same run."""
    shards = synthetic_shards(tmp_path / "shards", 2048)
    losses = []
    for name in ("first", "second"):
        run_dir = tmp_path / name
        run_dir.mkdir()
        result = launch(2, ROOT / "yamls" / "gpt-125m" / "qsdp-w8g8.yaml",
                        [*gpu_overrides(shards, run_dir, 8), "deterministic_mode=true"])
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        losses.append(train_losses(run_dir))
    assert sorted(losses[0]) == list(range(6)) and losses[0] == losses[1]



@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_gpu_ranks_sharing_gpus_over_gloo_train_as_nccl_ranks_do(tmp_path):
    """The convergence protocol runs quantized arms either way (shared_gpu over gloo, or NCCL with a GPU per rank)
    and pools their runs: the transport must not change the training, only the order of an unquantized
    reduction's sums. Deterministic mode removes the GPU kernels' run-to-run differences, so what is left is it."""
    shards = synthetic_shards(tmp_path / "shards", 2048)
    losses = {}
    for shared in ("false", "true"):
        run_dir = tmp_path / f"shared-{shared}"
        run_dir.mkdir()
        result = launch(2, ROOT / "yamls" / "gpt-125m" / "qsdp-w8g8.yaml",
                        [*gpu_overrides(shards, run_dir, 8), "deterministic_mode=true", f"shared_gpu={shared}"])
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        hyperparameters = json.loads((run_dir / "metrics.json").read_text())["hyperparameters"]
        assert hyperparameters["dist_backend"] == ("gloo" if shared == "true" else "nccl")
        losses[shared] = train_losses(run_dir)
    assert sorted(losses["false"]) == sorted(losses["true"]) == list(range(6))
    gaps = {batch: abs(losses["true"][batch] / losses["false"][batch] - 1.0) for batch in losses["false"]}
    print(f"NCCL {losses['false']}\ngloo {losses['true']}\nrelative gaps {gaps}")
    assert max(gaps.values()) < 1e-3, gaps

# ------------------------------------------------------------------------------------------- eval_weights
def test_eval_weights_both_is_a_recipe_setting_that_adds_the_quantized_evaluator(corpus_shards, tmp_path):
    both = load_recipe(QSDP_RECIPE, tiny_overrides(corpus_shards, tmp_path, "algorithms.qsdp.eval_weights=both"))
    assert both.eval_labels == ("val", "val_quantized")
    assert both.algorithm_kwargs["qsdp"]["eval_weights"] == {"val": "exact", "val_quantized": "quantized"}
    quantized = load_recipe(QSDP_RECIPE, tiny_overrides(corpus_shards, tmp_path,
                                                        "algorithms.qsdp.eval_weights=quantized"))
    assert quantized.eval_labels == ("val",) and quantized.algorithm_kwargs["qsdp"]["eval_weights"] == "quantized"
    with pytest.raises(RecipeError, match="data.eval_split must be set"):
        load_recipe(QSDP_RECIPE, tiny_overrides(corpus_shards, tmp_path, "algorithms.qsdp.eval_weights=both",
                                                "data.eval_split=null"))
    with pytest.raises(RecipeError, match="eval_weights='exakt' is invalid.*did you mean 'exact'"):
        load_recipe(QSDP_RECIPE, tiny_overrides(corpus_shards, tmp_path, "algorithms.qsdp.eval_weights=exakt"))


@pytest.mark.slow  # 2 processes through the launcher: 145 s on 2 shared cores
def test_eval_weights_both_logs_the_exact_and_the_quantized_loss_of_each_evaluation(corpus_shards, tmp_path):
    result = launch(2, QSDP_RECIPE, tiny_overrides(corpus_shards, tmp_path, "max_duration=4ba", "eval_interval=2ba",
                                                   "algorithms.qsdp.eval_weights=both"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    logged = json.loads((tmp_path / "metrics.json").read_text())
    exact = dict(logged["metrics"]["metrics/val/LanguageCrossEntropy"])
    quantized = dict(logged["metrics"]["metrics/val_quantized/LanguageCrossEntropy"])
    assert sorted(exact) == sorted(quantized) == [2, 4]
    for batch in exact:  # the same batches and weights, gathered exactly and 8-bit quantized
        assert exact[batch] != quantized[batch] and abs(exact[batch] - quantized[batch]) < 0.05 * exact[batch]
    assert logged["hyperparameters"]["qsdp/eval_weights"] == "val=exact, val_quantized=quantized"


# The recipe's W8G8; qWD + LoCo (weight differences rounded to nearest); the same with stochastic weight differences.
EVAL_CASES = {"w8g8": [], "qwd-w3g3-loco": ["algorithms.qsdp.preset=qwd-w3g3-loco"],
              "qwd-stochastic": ["algorithms.qsdp.preset=qwd-w3g3-loco", "algorithms.qsdp.weight_codec=minmax"],
              "learned": ["algorithms.qsdp.weight_codec=learned",  # refit at every new key: evaluations' keys too
                          "algorithms.qsdp.weight_codec_options.refresh_every=1"]}


@pytest.mark.slow  # twelve 2-process launches through the launcher: 550-610 s on 2 shared cores
@pytest.mark.timeout(1200)  # above the suite's 600 s
def test_evaluations_leave_a_qsdp_run_bit_identical(corpus_shards, tmp_path):
    """What pooling runs of other evaluation intervals relies on (benchmarks/convergence.py --combine): the
    trainer's evaluations (its evaluator, eval dataloader and their gathers) change nothing in training. Of the exact
    weights, no scheme state moves. Of the quantized weights: a direct scheme keeps no state but learned levels,
    whose refits are pinned to a key, and a weight difference (rounded to nearest, or stochastically) is sent by the
    evaluation's first gather; both read the key the next training forward would read, so the levels and the
    reference are the ones training would have had."""
    losses = {}
    for case, interval, weights in (("learned", "6ba", "exact"), ("learned", "2ba", "exact"),
                                    ("learned", "2ba", "quantized"),
                                    ("w8g8", "6ba", "exact"), ("w8g8", "2ba", "exact"), ("w8g8", "2ba", "quantized"),
                                    ("qwd-w3g3-loco", "6ba", "exact"), ("qwd-w3g3-loco", "2ba", "exact"),
                                    ("qwd-w3g3-loco", "2ba", "quantized"), ("qwd-stochastic", "6ba", "exact"),
                                    ("qwd-stochastic", "2ba", "exact"), ("qwd-stochastic", "2ba", "quantized")):
        run_dir = tmp_path / f"{case}-{interval}-{weights}"
        result = launch(2, QSDP_RECIPE, tiny_overrides(corpus_shards, run_dir, "max_duration=6ba", *EVAL_CASES[case],
                                                       f"eval_interval={interval}",
                                                       f"algorithms.qsdp.eval_weights={weights}"))
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        losses[case, interval, weights] = train_losses(run_dir)
    for case in EVAL_CASES:
        assert sorted(losses[case, "6ba", "exact"]) == list(range(6))
        assert losses[case, "2ba", "exact"] == losses[case, "6ba", "exact"], case
        assert losses[case, "2ba", "quantized"] == losses[case, "6ba", "exact"], case
