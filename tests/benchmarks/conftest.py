"""A tiny CPU recipe family in the files the benchmark drivers read (``baseline.yaml``, ``qsdp-w8g8.yaml``,
``qsdp-w4g4.yaml``, ``qsdp-w8g4.yaml``, ``sdp4bit.yaml``, ``qwd-w4g4.yaml``, ``zeropp.yaml``, ``ddp-baseline.yaml``,
``zero-one-adam.yaml``), built on the repository's ``yamls/cpu`` recipes. (``tests/conftest.py`` puts
``benchmarks/`` on the import path.)"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def tiny_recipes(tmp_path_factory) -> Path:
    """The tiny CPU GPT as a recipe family, micro-batch 4."""
    d = tmp_path_factory.mktemp("gpt-tiny")
    cpu = ROOT / "yamls" / "cpu"
    (d / "baseline.yaml").write_text(f"base: {cpu / 'gpt-tiny-baseline.yaml'}\ndevice_train_microbatch_size: 4\n")
    (d / "qsdp-w8g8.yaml").write_text(f"base: {cpu / 'gpt-tiny-qsdp.yaml'}\ndevice_train_microbatch_size: 4\n")
    (d / "qsdp-w4g4.yaml").write_text("base: qsdp-w8g8.yaml\nalgorithms: {qsdp: {weight_bits: 4, grad_bits: 4}}\n")
    presets = {"qsdp-w8g4": "w8g4", **{name: name for name in ("sdp4bit", "qwd-w4g4", "zeropp", "qwd-w3g3-loco")}}
    for recipe, preset in presets.items():  # as the families' recipes of these presets are
        (d / f"{recipe}.yaml").write_text(f"base: baseline.yaml\nalgorithms: {{qsdp: {{preset: {preset}}}}}\n")
    (d / "ddp-baseline.yaml").write_text("base: baseline.yaml\nfsdp: null\n")
    (d / "zero-one-adam.yaml").write_text("base: ddp-baseline.yaml\n"
                                          "algorithms: {zero_one_adam: {var_freeze_step: 10, local_step_scaler: 10}}\n")
    return d
