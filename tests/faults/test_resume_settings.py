"""Resume with other QSDP settings (issue 16): a handle that loads a checkpoint written under other settings keeps its
own, warns naming every change, rebuilds scheme state that no longer fits, and keeps the byte totals (fast: one spawn
of 2 ranks, FSDP2, the MLP of tests/sharded_mlp.py against its exact single-process reference)."""

from __future__ import annotations

import warnings

import pytest
import torch
from dist_spawn import RankInfo, run_ranks
from sharded_mlp import LR, Adapter, _train, full_tensors, reference_training

from composer_qsdp.config import from_preset
from composer_qsdp.engine import ResumeSettingsWarning
from composer_qsdp.engine.handle import settings_changes

pytestmark = pytest.mark.requires_custom_comm

W8G8 = from_preset("w8g8", bucket_size=64, seed=7)
W4G4 = from_preset("w4g4", bucket_size=64, seed=7)
QWD = from_preset("w8g8", weight_scheme="difference", weight_bits=4, weight_codec="symmetric", bucket_size=64, seed=7)
SAVED_STEPS, RESUMED_STEPS = 2, 2
CHANGES = {"w8g8->w4g4": (W8G8, W4G4), "w8g8->qwd": (W8G8, QWD), "qwd->w8g8": (QWD, W8G8), "same": (W8G8, W8G8)}


def _step_bytes(info: RankInfo, config) -> int:
    """Bytes one training step sends under ``config`` from scratch (fixed by the shapes for these schemes after the
    first step: measured on the second, so the difference scheme's first-step keyframe does not count)."""
    model = Adapter("fsdp2").shard(info)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    handle = Adapter("fsdp2").apply(model, config, optimizers=opt)
    _train(info, model, 1, opt, grads=False)
    before = handle.traffic().total.sent
    _train(info, model, 1, opt, first_step=1, grads=False)
    return handle.traffic().total.sent - before


def _resume(info: RankInfo, old, new) -> dict:
    """Train SAVED_STEPS under ``old``, load model and QSDP state into a fresh model under ``new``, train on."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    adapter = Adapter("fsdp2")
    model = adapter.shard(info)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    handle = adapter.apply(model, old, optimizers=opt)
    _train(info, model, SAVED_STEPS, opt, grads=False)
    saved_model, saved_qsdp = get_model_state_dict(model), handle.state_dict()

    model = adapter.shard(info)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    handle = adapter.apply(model, new, optimizers=opt)
    set_model_state_dict(model, saved_model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        handle.load_state_dict(saved_qsdp)
    loaded = handle.traffic().total.sent
    _train(info, model, RESUMED_STEPS, opt, first_step=SAVED_STEPS, grads=False)
    return {"warnings": [str(w.message) for w in caught if issubclass(w.category, ResumeSettingsWarning)],
            "changes": handle.resume_changes, "saved_sent": sum(u[s]["traffic"]["sent"] for u in saved_qsdp["units"]
                                                                for s in ("weights", "grads")),
            "loaded_sent": loaded, "resumed_sent": handle.traffic().total.sent - loaded,
            "keyframes": [getattr(u.weights, "keyframes", None) for u in handle.units],
            "seeds": handle.seeds.state_dict(), "params": full_tensors(model)}


def _scenarios(info: RankInfo) -> dict:
    out = {name: _resume(info, old, new) for name, (old, new) in CHANGES.items()}
    out["step_bytes"] = {name: _step_bytes(info, config) for name, config in (("w4g4", W4G4), ("w8g8", W8G8))}
    return out


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return run_ranks(_scenarios, 2, timeout_s=240)


def test_settings_changes_name_each_changed_key():
    assert settings_changes({"grads": {"bits": 8, "codec": "minmax"}, "world_size": 2},
                            {"grads": {"bits": 4, "codec": "minmax"}, "world_size": 2, "extra": 1}) == [
        "extra: '<absent>' -> 1", "grads.bits: 8 -> 4"]
    assert settings_changes({"a": {"b": 1}}, {"a": {"b": 1}}) == []


def test_changed_settings_warn_naming_each_change(results):
    for rank in results:
        (message,) = rank["w8g8->w4g4"]["warnings"]
        for change in ("weights.bits: 8 -> 4", "grads.bits: 8 -> 4", "the schemes of 3 of 3 unit(s)"):
            assert change in message and any(c.startswith(change) for c in rank["w8g8->w4g4"]["changes"]), change
        assert "byte counters keep the checkpoint's totals" in message
        assert "weights.scheme: None -> 'difference'" in rank["w8g8->qwd"]["warnings"][0]
        assert "weights.scheme: 'difference' -> None" in rank["qwd->w8g8"]["warnings"][0]
        assert rank["same"]["warnings"] == [] and rank["same"]["changes"] == []


def test_byte_totals_are_kept_and_the_new_settings_count_from_the_resume(results):
    for rank in results:
        step = rank["step_bytes"]
        assert step["w4g4"] < step["w8g8"]
        for name in CHANGES:
            assert rank[name]["loaded_sent"] == rank[name]["saved_sent"] > 0, name
        # After the resume the steps send what the new settings send, not the old ones.
        assert rank["w8g8->w4g4"]["resumed_sent"] == RESUMED_STEPS * step["w4g4"]
        assert rank["same"]["resumed_sent"] == RESUMED_STEPS * step["w8g8"]
        assert rank["same"]["seeds"] == {"optimizer_step": SAVED_STEPS + RESUMED_STEPS, "microbatch": 0}


def test_a_weight_difference_reference_from_another_scheme_is_rebuilt_by_a_keyframe(results):
    for rank in results:
        # No reference in a direct scheme's state: one full-precision gather per unit, then differences.
        assert rank["w8g8->qwd"]["keyframes"] == [1, 1, 1]
        assert rank["qwd->w8g8"]["keyframes"] == [None, None, None]


def test_training_continues_under_the_new_settings(results):
    ref, _ = reference_training(2, SAVED_STEPS + RESUMED_STEPS)
    for name in CHANGES:
        params = results[0][name]["params"]
        assert all(torch.equal(params[n], results[1][name]["params"][n]) for n in ref), name  # replicas agree
        for n, expected in ref.items():
            rel = ((params[n] - expected).norm() / expected.norm()).item()
            assert rel < 2e-2, (name, n, rel)
