"""Layers frozen mid-run under QSDP, as Composer's ``LayerFreezing`` does it (its functional ``freeze_layers``), on
two FSDP2 ranks over gloo.

``freeze_layers`` freezes leaf modules in order, so an FSDP unit of two layers is first frozen in part: FSDP2 then
reduce-scatters only the unit's parameters that still have gradients, a smaller gradient layout for the unit's
scheme. Every preset trains on; a frozen parameter keeps its value bit for bit; the error-feedback presets restart
that unit's residual from zero with one warning (the residual's own semantics are tested against a fresh scheme in
``tests/schemes/test_loco_scheme.py``); and the losses stay within 1% of plain FSDP2's run with the same
freezing.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
from composer.algorithms.layer_freezing import freeze_layers
from dist_spawn import RankInfo, run_ranks
from torch.distributed.fsdp import fully_shard

from composer_qsdp.config import from_preset
from composer_qsdp.fsdp2 import apply_qsdp
from composer_qsdp.schemes import LoCoResidualWarning

STEPS, WORLD = 8, 2
CASES = {  # name: (preset, options)
    "w8g8": ("w8g8", {}), "w8g4": ("w8g4", {}), "qwd-w3g3-loco": ("qwd-w3g3-loco", {}), "sdp4bit": ("sdp4bit", {}),
    "qwd-w3g3-loco-speculative": ("qwd-w3g3-loco", {"speculative_update": True}),
}
FEEDBACK = {"w8g4", "qwd-w3g3-loco", "qwd-w3g3-loco-speculative"}  # gradient schemes that keep a LoCo residual


def _model() -> nn.Sequential:
    torch.manual_seed(5)

    def block() -> nn.Sequential:
        return nn.Sequential(nn.Linear(32, 96), nn.ReLU(), nn.Linear(96, 32), nn.ReLU())

    return nn.Sequential(block(), block(), nn.Linear(32, 16))


def _rank(info: RankInfo) -> dict:
    out = {}
    for name in ("plain", *CASES):
        model = _model()
        for unit in model:
            if any(True for _ in unit.parameters()):
                fully_shard(unit)
        fully_shard(model)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
        if name != "plain":
            preset, options = CASES[name]
            apply_qsdp(model, from_preset(preset, **options), optimizers=opt)
        frozen_at: dict[str, torch.Tensor] = {}
        losses, depths = [], []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", LoCoResidualWarning)
            for step in range(STEPS):
                # leaves 0.0, 0.2, 1.0, 1.2, 2; frozen from the earliest: 1 of them at step 2, 2 at 4, 3 at 6
                depth, _ = freeze_layers(model, opt, current_duration=step / STEPS, freeze_start=0.0,
                                         freeze_level=1.0)
                depths.append(depth)
                for pname, param in model.named_parameters():
                    if not param.requires_grad and pname not in frozen_at:
                        frozen_at[pname] = param.full_tensor().clone()
                gen = torch.Generator().manual_seed(100 * step + info.rank)
                x, y = torch.randn(64, 32, generator=gen), torch.randn(64, 16, generator=gen)
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses.append(loss.item())
        kept = {pname: torch.equal(dict(model.named_parameters())[pname].full_tensor(), before)
                for pname, before in frozen_at.items()}
        out[name] = {"losses": losses, "depths": depths, "kept": kept,
                     "warnings": [str(w.message) for w in caught if issubclass(w.category, LoCoResidualWarning)]}
    return out


@pytest.fixture(scope="module")
def results():
    return run_ranks(_rank, WORLD)


def test_freezing_reaches_inside_a_unit(results):
    """Each block's first layer freezes alone first (steps 2 and 6): a unit frozen in part."""
    assert results[0]["plain"]["depths"] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert set(results[0]["plain"]["kept"]) == {"0.0.weight", "0.0.bias", "0.2.weight", "0.2.bias",
                                                "1.0.weight", "1.0.bias"}


@pytest.mark.parametrize("name", list(CASES))
def test_every_preset_trains_on_and_keeps_frozen_weights(results, name):
    for out in results:
        got, plain = out[name], out["plain"]
        assert len(got["losses"]) == STEPS and got["kept"] and all(got["kept"].values())
        assert got["kept"].keys() == plain["kept"].keys()
        for mine, ref in zip(got["losses"], plain["losses"]):
            assert abs(mine - ref) <= 0.01 * ref
        # a partly frozen unit (steps 2 and 6) restarts its residual once; a wholly frozen one is not reduced at all
        assert len(got["warnings"]) == (2 if name in FEEDBACK else 0)
        assert all("parameters with gradients changed" in w for w in got["warnings"])
