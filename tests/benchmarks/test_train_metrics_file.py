"""train.py's metrics file, as the benchmark drivers read it: rewritten after every evaluation (so a run killed
mid-way keeps its evaluations) and at the end, with rank 0's peak GPU memory (null on CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import composer_qsdp.train as train_module
from composer_qsdp.data import write_token_shards

ROOT = Path(__file__).resolve().parents[2]
VAL = "metrics/val/LanguageCrossEntropy"


def test_metrics_file_is_rewritten_after_every_evaluation(tmp_path, monkeypatch):
    words = "gather the shards then scatter the gradients of every layer".split()
    documents = ((("val" if i % 5 == 0 else "train"), " ".join(words[(i + j) % len(words)] for j in range(400)))
                 for i in range(40))
    write_token_shards(documents, tmp_path / "shards", 32)
    seen = []
    real = train_module._write_metrics

    def spy(path, logger, traffic, memory):
        real(path, logger, traffic, memory)
        data = json.loads(Path(path).read_text())  # what a reader finds at this moment
        seen.append((max(b for b, _ in data["metrics"]["loss/train/total"]),
                     [b for b, _ in data["metrics"].get(VAL, [])], data["memory"]))

    monkeypatch.setattr(train_module, "_write_metrics", spy)
    metrics_file = tmp_path / "run" / "metrics.json"
    recipe = ROOT / "yamls" / "cpu" / "gpt-tiny-baseline.yaml"
    assert train_module.main([str(recipe), f"data.local={tmp_path / 'shards'}", "model.max_seq_len=32",
                              "global_train_batch_size=4", "max_duration=4ba", "eval_interval=2ba",
                              "eval_subset_num_batches=1", "device_eval_batch_size=2", "progress_bar=false",
                              f"metrics_file={metrics_file}"]) == 0
    # After the evaluations at batches 2 and 4 (training losses are keyed 0-based), then at the end.
    assert seen == [(1, [2], None), (3, [2, 4], None), (3, [2, 4], None)]
    assert not metrics_file.with_name("metrics.json.tmp").exists()
