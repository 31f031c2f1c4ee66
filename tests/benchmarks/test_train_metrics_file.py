"""train.py's metrics file, as the benchmark drivers read it: rewritten after every evaluation (so a run killed
mid-way keeps its evaluations) and at the end; peak GPU memory is null on CPU."""

from __future__ import annotations

import json
from pathlib import Path

from composer_qsdp.recipes import train as train_module
from composer_qsdp.recipes.data import write_token_shards
from composer_qsdp.recipes.metrics_file import MetricsFile

ROOT = Path(__file__).resolve().parents[2]
VAL = "metrics/val/LanguageCrossEntropy"


def test_metrics_file_is_rewritten_after_every_evaluation(tmp_path, monkeypatch):
    words = "gather the shards then scatter the gradients of every layer".split()
    documents = ((("val" if i % 5 == 0 else "train"), " ".join(words[(i + j) % len(words)] for j in range(400)))
                 for i in range(40))
    write_token_shards(documents, tmp_path / "shards", 32)
    seen = []
    real = MetricsFile.write

    def spy(self, state):
        real(self, state)
        data = json.loads(self.path.read_text())  # what a reader finds at this moment
        seen.append((max(b for b, _ in data["metrics"]["loss/train/total"]),
                     [b for b, _ in data["metrics"].get(VAL, [])], data["memory"]))

    monkeypatch.setattr(MetricsFile, "write", spy)
    metrics_file = tmp_path / "run" / "metrics.json"
    recipe = ROOT / "yamls" / "cpu" / "gpt-tiny-baseline.yaml"
    assert train_module.main([str(recipe), f"data.local={tmp_path / 'shards'}", "model.max_seq_len=32",
                              "global_train_batch_size=4", "max_duration=4ba", "eval_interval=2ba",
                              "eval_subset_num_batches=1", "device_eval_batch_size=2", "progress_bar=false",
                              "callbacks.memory_monitor={}", f"metrics_file={metrics_file}"]) == 0
    # After the evaluations at batches 2 and 4 (training losses are keyed 0-based), then at the end.
    assert seen == [(1, [2], None), (3, [2, 4], None), (3, [2, 4], None)]
    assert not metrics_file.with_name("metrics.json.tmp").exists()
    # The speed monitor's wall clock at the end of batches 1-4, which bench_e2e.py turns into throughput.
    assert [b for b, _ in json.loads(metrics_file.read_text())["metrics"]["time/train"]] == [1, 2, 3, 4]


def test_peak_memory_is_memory_monitors_largest_logged_value():
    """MemoryMonitor logs gigabytes (5 significant digits); the file holds bytes, the largest value logged."""
    log = MetricsFile("unused.json")
    assert log.peak_memory() is None  # no memory_monitor, or a CPU run: it logs nothing
    for gigabytes in ((1.25, 2.5), (3.0001, 4.0), (2.0, 4.5)):
        log.data.setdefault("memory/peak_allocated_mem", []).append((None, gigabytes[0]))
        log.data.setdefault("memory/peak_reserved_mem", []).append((None, gigabytes[1]))
    assert log.peak_memory() == {"peak_allocated_bytes": 3_000_100_000, "peak_reserved_bytes": 4_500_000_000}
