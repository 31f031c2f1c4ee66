"""The training entrypoint: a tiny recipe on 1 process (in-process) and 2 processes (the real ``composer``
launcher): the loss falls, checkpoints are written, resuming reproduces the uninterrupted losses; bad recipes
stop before anything is built, with a message naming the key."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

import composer_qsdp.train as train_module
import e2e_common  # benchmarks/ (tests/conftest.py): Composer's launcher command
from composer_qsdp.data import write_token_shards
from composer_qsdp.data.sources import wikipedia_sample_documents
from composer_qsdp.train import RecipeError, load_recipe, main

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "yamls" / "cpu" / "gpt-tiny-baseline.yaml"
QSDP_RECIPE = ROOT / "yamls" / "cpu" / "gpt-tiny-qsdp.yaml"
SEQ_LEN = 32


@pytest.fixture(scope="module")
def wiki_shards(tmp_path_factory) -> Path:
    """A slice of the bundled Wikipedia sample (15 articles, ~120K tokens) as 32-token samples."""
    out = tmp_path_factory.mktemp("wiki") / f"wiki-gpt2-t{SEQ_LEN}"
    write_token_shards(wikipedia_sample_documents(0.3), out, SEQ_LEN, max_documents=15)
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
def test_one_process_trains_checkpoints_and_resumes_exactly(wiki_shards, tmp_path):
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    common = ["max_duration=16ba", "eval_interval=8ba"]
    assert main([str(BASELINE), *tiny_overrides(wiki_shards, full, *common, f"save_folder={full / 'ckpt'}",
                                                "save_interval=8ba")]) == 0
    losses = train_losses(full)
    assert sorted(losses) == list(range(16))
    first, last = sum(losses[b] for b in range(4)) / 4, sum(losses[b] for b in range(12, 16)) / 4
    assert last < first - 0.5, f"loss did not fall: {first:.3f} -> {last:.3f}"
    assert (full / "ckpt" / "ep0-ba8").is_dir() and (full / "ckpt" / "ep0-ba16").is_dir()
    metrics = json.loads((full / "metrics.json").read_text())["metrics"]
    assert "metrics/val/LanguagePerplexity" in metrics

    assert main([str(BASELINE), *tiny_overrides(wiki_shards, resumed, *common,
                                                f"load_path={full / 'ckpt' / 'ep0-ba8'}")]) == 0
    resumed_losses = train_losses(resumed)
    assert sorted(resumed_losses) == list(range(8, 16))
    assert resumed_losses == {b: losses[b] for b in range(8, 16)}  # same weights, optimizer, data position


# ------------------------------------------------------------------------------------------ two processes
@pytest.mark.requires_custom_comm
def test_two_processes_through_the_launcher(wiki_shards, tmp_path):
    result = launch(2, QSDP_RECIPE, tiny_overrides(wiki_shards, tmp_path, "max_duration=12ba", "eval_interval=12ba",
                                                   f"save_folder={tmp_path / 'ckpt'}", "save_interval=12ba"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    losses = train_losses(tmp_path)
    assert sum(losses[b] for b in range(9, 12)) / 3 < sum(losses[b] for b in range(3)) / 3 - 0.3
    # FSDP2 sharded checkpoint: one DCP file per rank.
    assert sorted(p.name for p in (tmp_path / "ckpt" / "ep0-ba12").glob("*.distcp")) == ["__0_0.distcp",
                                                                                         "__1_0.distcp"]
    summary = json.loads((tmp_path / "metrics.json").read_text())["communication"]["QSDP"]
    assert 0 < summary["total"]["sent"] < summary["total"]["bf16"]
    assert "QSDP communication" in result.stdout


@pytest.mark.slow
def test_two_processes_qsdp_resume_reproduces_losses(wiki_shards, tmp_path):
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    common = ["max_duration=10ba", "eval_interval=10ba"]
    result = launch(2, QSDP_RECIPE, tiny_overrides(wiki_shards, full, *common, f"save_folder={full / 'ckpt'}",
                                                   "save_interval=5ba"))
    assert result.returncode == 0, result.stderr[-3000:]
    result = launch(2, QSDP_RECIPE, tiny_overrides(wiki_shards, resumed, *common,
                                                   f"load_path={full / 'ckpt' / 'ep0-ba5'}"))
    assert result.returncode == 0, result.stderr[-3000:]
    losses, resumed_losses = train_losses(full), train_losses(resumed)
    assert resumed_losses == {b: losses[b] for b in range(5, 10)}


# ------------------------------------------------------------------------------------------- bad recipes
@pytest.mark.parametrize("overrides, message", [
    (["optimzer.lr=1"], "unknown recipe key 'optimzer'"),
    (["optimizer.lrr=1"], "unknown recipe key 'optimizer.lrr'"),
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
    (["fsdp.mixed_precision=HALF"], "recipe key 'fsdp.mixed_precision' = 'HALF' is invalid; allowed: DEFAULT"),
    (["algorithms.sparsify.ratio=0.5"], "recipe key 'algorithms.sparsify' = 'sparsify' is invalid; known algorithms"),
    (["fsdp=null", "algorithms.qsdp.weight_bits=8"], "needs an 'fsdp' section"),
    (["autoresume=true"], "autoresume needs save_folder and run_name"),
    (["max_duration"], "must have the form key=value"),
])
def test_bad_recipe_names_the_key(overrides, message):
    with pytest.raises(RecipeError) as err:
        load_recipe(BASELINE, overrides)
    assert message in str(err.value)


def test_missing_keys_and_base_loops(tmp_path):
    (tmp_path / "partial.yaml").write_text("model: {preset: tiny}\ndata: {local: x}\n")
    with pytest.raises(RecipeError, match="missing required key.*global_train_batch_size, max_duration, "
                                          "optimizer.lr"):
        load_recipe(tmp_path / "partial.yaml")
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

    monkeypatch.setattr(train_module, "ComposerGPT", must_not_run)
    monkeypatch.setattr(train_module, "build_token_dataloader", must_not_run)
    assert main([str(BASELINE), "optimizer.lr=0", f"save_folder={tmp_path / 'ckpt'}"]) == 2
    assert "recipe error: recipe key 'optimizer.lr' = 0.0 is invalid" in capsys.readouterr().err
    assert not (tmp_path / "ckpt").exists()


def test_missing_shards_stop_before_the_model_is_built(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(train_module, "ComposerGPT", lambda *a, **k: pytest.fail("model built without data"))
    assert main([str(BASELINE), f"data.local={tmp_path / 'nothing'}"]) == 2
    assert "recipe section 'data': no MDS shards for split 'train'" in capsys.readouterr().err


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
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_gpu_two_processes_qsdp_recipe(tmp_path):
    shards = synthetic_shards(tmp_path / "shards", 2048)
    result = launch(2, ROOT / "yamls" / "gpt-125m" / "qsdp-w8g8.yaml", gpu_overrides(shards, tmp_path, 8))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    losses = train_losses(tmp_path)
    assert losses[5] < losses[0] - 1.0
    traffic = json.loads((tmp_path / "metrics.json").read_text())["communication"]["QSDP"]["total"]
    # bf16 mixed precision: FSDP itself would send bf16, and 8-bit codes need about half of that.
    assert 0.45 < traffic["sent"] / traffic["bf16"] < 0.55
