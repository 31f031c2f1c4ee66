"""Extending QSDP goes through :mod:`composer_qsdp.registry`: ``docs/api.md``'s example (a toy codec subclass of the
real ``Codec``, registered by its path) runs as written, a configuration checks the new codec's options at
construction, and QSDP trains with it on 2 gloo ranks, building it for every unit at install."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from dist_spawn import RankInfo, run_ranks
from sharded_mlp import LAYERS, Adapter, _train, reference_training

ROOT = Path(__file__).resolve().parents[1]
API_DOC = ROOT / "docs" / "api.md"


def _example(tmp_path: Path) -> str:
    """Write the doc's module ``my_codecs.py`` into ``tmp_path``; return the doc's usage code."""
    extender = API_DOC.read_text().split("## For an extender", 1)[1]
    module, usage = re.findall(r"```python\n(.*?)```", extender, flags=re.S)[:2]
    (tmp_path / "my_codecs.py").write_text(module)
    return usage


def test_the_doc_example_registers_a_codec_and_quantizes_with_it_through_the_config(tmp_path):
    checks = textwrap.dedent("""
        import pytest
        with pytest.raises(ValueError, match=r"grads: codec 'int8_absmax' with .*bits=4 is not supported; allowed: 8"):
            QSDPConfig.from_preset("w8g8", grad_codec="int8_absmax", grad_bits=4)  # refused at construction
        with pytest.raises(ValueError, match="codec 'int8_absmax' is already registered"):
            CODECS.register("int8_absmax", "my_codecs:Int8AbsMax")
        print("ok")
    """)
    env = {"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"}
    run = subprocess.run([sys.executable, "-c", _example(tmp_path) + checks], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr


def _train_with_toy_codec(info: RankInfo, path: str) -> dict:
    sys.path.insert(0, path)
    from composer_qsdp import QSDPConfig
    from composer_qsdp.registry import CODECS

    CODECS.register("int8_absmax", "my_codecs:Int8AbsMax")  # in every rank, before its config names it
    config = QSDPConfig.from_preset("w8g8", weight_codec="int8_absmax", grad_codec="int8_absmax", bucket_size=64)
    adapter = Adapter("fsdp2")
    model = adapter.shard(info)
    handle = adapter.apply(model, config)
    codecs = [(u.weights.codec.name, u.grads.codec.name) for u in handle.units]
    out = _train(info, model, 3, grads=False)
    return {"codecs": codecs, "losses": out["losses"], "sent": handle.traffic().total.sent}


@pytest.mark.requires_custom_comm
def test_qsdp_trains_with_a_registered_codec(tmp_path):
    if torch.__version__ < "2.7":
        pytest.skip(f"FSDP2 cannot run on CPU with torch {torch.__version__}")
    _example(tmp_path)
    _, exact = reference_training(2, 3)
    for rank in run_ranks(_train_with_toy_codec, 2, str(tmp_path)):
        assert rank["codecs"] == [("int8_absmax", "int8_absmax")] * len(LAYERS)  # every unit, both sides
        assert rank["sent"] > 0
        assert rank["losses"] == pytest.approx(exact, rel=0.05)
