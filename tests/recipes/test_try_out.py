"""The CPU try-out of a shipped recipe (issue 52 point 9): ``make try RECIPE=...`` runs the recipe with
``@yamls/cpu/try-out.overrides`` on 2 CPU processes over gloo; it trains, says where its metrics are and writes no
checkpoint. Every GPT recipe passes the try-out's checks; in the default suite one 125m recipe trains its 30 batches
(2-4 minutes on 2 cores) and the GPT-13B lean recipe 12 batches (about 60 s); the ``slow`` group runs the 30 batches
of a recipe of each size and kind (qWD/LoCo, policy=auto, two-level gradients, DDP with 0/1 Adam)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

import e2e_common  # benchmarks/ (tests/conftest.py): Composer's launcher command
from composer_qsdp.recipes.data import write_token_shards
from composer_qsdp.recipes.data.sources import python_source_documents
from composer_qsdp.recipes.loader import check_machine, load_recipe

ROOT = Path(__file__).resolve().parents[2]
OVERRIDES = ROOT / "yamls" / "cpu" / "try-out.overrides"
GPT_RECIPES = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "yamls").glob("gpt-*/*.yaml"))
DEFAULT = "yamls/gpt-125m/qsdp-w8g8.yaml"
#: The default suite's short try-out beside DEFAULT's: the recipe that shares the least with it (meta-initialised,
#: the lean layout's sharded reference and two-level LoCo). A recipe of each of the four larger sizes would cost CI's
#: 2 cores about 4 minutes in all; the slow group launches every size.
LARGEST = "yamls/gpt-13b/qwd-w3g3-loco-lean.yaml"
# One recipe of each size, and of each kind the try-out must shrink: qWD with LoCo gradients, SDP4Bit's two-level
# gradients, ZeRO++'s blocks, the bandwidth-aware policy, DDP with 0/1 Adam, meta-initialised GPT-6.7B and 13B, the
# lean layout (a sharded qWD reference, two-level LoCo).
EACH_SIZE = ["yamls/gpt-125m/qwd-w4g3-loco.yaml", "yamls/gpt-125m/sdp4bit.yaml", "yamls/gpt-125m/zero-one-adam.yaml",
             "yamls/gpt-350m/qwd-w3g2-loco.yaml", "yamls/gpt-350m/zeropp.yaml", "yamls/gpt-1.3b/qsdp-auto.yaml",
             "yamls/gpt-1.3b/ddp-baseline.yaml", "yamls/gpt-6.7b/qsdp-w8g8.yaml", "yamls/gpt-6.7b/qwd-w4g2-loco.yaml",
             "yamls/gpt-6.7b/qsdp-auto.yaml", LARGEST]
STEPS = 30


@pytest.fixture(scope="module")
def try_dir(tmp_path_factory) -> Path:
    """A working directory with the shards the try-out reads (``data/wiki-gpt2-t64``, relative to it): here the
    standard library's ``email`` package as 64-token samples, which every machine has (the bundled Wikipedia sample
    of ``make wiki-shards`` needs the demo extra's gensim)."""
    cwd = tmp_path_factory.mktemp("try")
    email_package = Path(sysconfig.get_paths()["stdlib"]) / "email"
    write_token_shards(python_source_documents(0.3, [email_package]), cwd / "data" / "wiki-gpt2-t64", 64,
                       max_train_tokens=100_000)
    return cwd


def test_make_try_runs_the_documented_command():
    """``make try`` (dry run) is the command README and docs/recipes.md give."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("no make on this machine")
    result = subprocess.run([make, "-n", "try", "COMPOSER=composer", "PYTHON=python", f"RECIPE={DEFAULT}"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60, check=True)
    command = (f"OMP_NUM_THREADS=1 composer -n 2 -m composer_qsdp.recipes.train {DEFAULT} "
               "@yamls/cpu/try-out.overrides")
    assert result.stdout.splitlines()[-1] == command
    for doc in ("README.md", "docs/recipes.md"):
        assert command in (ROOT / doc).read_text(), doc


@pytest.mark.parametrize("recipe", GPT_RECIPES)
def test_every_gpt_recipe_passes_the_try_outs_checks(recipe, try_dir, monkeypatch):
    """The try-out's overrides fit every shipped GPT recipe, the machine's checks included (2 CPU processes)."""
    monkeypatch.chdir(try_dir)
    loaded = load_recipe(ROOT / recipe, [f"@{OVERRIDES}"], world_size=2)
    check_machine(loaded)  # the shards, the save folder: as the entrypoint checks them
    cfg = loaded.cfg
    assert (cfg.device, cfg.precision, cfg.save_folder, cfg.max_duration) == ("cpu", "fp32", None, f"{STEPS}ba")
    assert cfg.metrics_file == f"runs/try/{cfg.run_name}/metrics.json"


def run_try_out(recipe: str, cwd: Path, *keys: str, steps: int = STEPS, drop: float = 0.1) -> None:
    """Run the documented try-out of ``recipe`` in ``cwd`` (with the override ``keys`` after it, as the docs say to
    change more) for ``steps`` batches and check what it leaves: a loss that falls by ``drop`` from its first five
    batches to its last five, the metrics file the summary names, and nothing else under runs/ (no checkpoint)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([*e2e_common.launcher(2), "-m", "composer_qsdp.recipes.train", str(ROOT / recipe),
                             f"@{OVERRIDES}", *keys], cwd=cwd, env=env, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stderr[-6000:]
    run_name = load_recipe(ROOT / recipe, [f"@{OVERRIDES}"], world_size=2).cfg.run_name
    metrics = Path("runs") / "try" / run_name / "metrics.json"
    assert f"run {run_name}: {steps} batches; metrics in {metrics} " in result.stdout, result.stdout[-3000:]
    assert "; no checkpoints" in result.stdout
    losses = [loss for _, loss in json.loads((cwd / metrics).read_text())["metrics"]["loss/train/total"]]
    assert len(losses) == steps and all(math.isfinite(loss) for loss in losses), losses
    # It trains, at the recipe's learning rate (GPT-6.7B's 1.2e-4: about 10.85 -> 10.5 in 30 steps).
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - drop, losses
    written = [p for p in (cwd / "runs" / "try" / run_name).rglob("*") if p.is_file()]
    assert written == [cwd / metrics], written  # no checkpoint, no manifest, no folder of one
    assert not any(p.suffix in (".pt", ".distcp") for p in cwd.rglob("*")), "a checkpoint file was written"


def test_the_try_out_of_a_125m_recipe_trains_without_checkpoints(try_dir):
    run_try_out(DEFAULT, try_dir)


def test_the_try_out_of_the_largest_recipe_trains_without_checkpoints(try_dir):
    """12 batches (the whole 30 take 1-2 minutes a launch on 2 cores: the slow group runs them)."""
    run_try_out(LARGEST, try_dir, "max_duration=12ba", "scheduler.t_warmup=2ba", "eval_interval=12ba", steps=12,
                drop=0.0)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", EACH_SIZE)
def test_the_try_out_of_each_size_and_kind_trains_without_checkpoints(recipe, try_dir):
    run_try_out(recipe, try_dir)
