"""``QSDPHandle.install``, the engine's one entry for adapters: it sets up every unit's schemes on the unit's group
(with the unit's gather layout where a scheme needs one), hooks the optimizer, calls the adapter's
``install_collectives`` once with the groups, then registers the handle on the model; a handle without an adapter
refuses."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from composer_qsdp.comm import Topology
from composer_qsdp.config import from_preset
from composer_qsdp.engine import QSDPHandle, Unit, plan_units
from dist_spawn import RankInfo, run_ranks


class _RecordingHandle(QSDPHandle):
    """An adapter that records what ``install`` hands it and what was done by then."""

    def install_collectives(self, groups):
        self.calls = getattr(self, "calls", []) + [{
            "groups": list(groups),
            "set_up": [u.weights.group is not None and u.grads.group is not None for u in self.units],
            "registered": QSDPHandle.applied(self.model) is not None,
        }]


def _handle(preset: str, cls: type[QSDPHandle] = _RecordingHandle) -> tuple[QSDPHandle, torch.optim.Optimizer]:
    config = from_preset(preset, check_finite=False)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    units = [Unit(f"{i}", m, 20, tuple(m.parameters())) for i, m in enumerate(model)]
    return cls(model, config, plan_units(units, config), Topology(1)), torch.optim.SGD(model.parameters(), lr=0.1)


def _install(info: RankInfo) -> dict:
    out = {}
    for preset in ("w8g8", "sdp4bit"):  # direct weights need no gather layout; difference weights keep one
        handle, optimizer = _handle(preset)
        groups = [dist.group.WORLD] * len(handle.units)
        layouts = {}

        def layout_of(index: int, layouts=layouts) -> object:
            layouts[index] = object()  # a stand-in: the difference scheme uses it only to checkpoint
            return layouts[index]

        handle.install(groups, layout_of, optimizer)
        (call,) = handle.calls
        handle.model(torch.zeros(1, 4)).sum().backward()
        optimizer.step()
        out[preset] = {
            "groups": call["groups"] == groups,
            "set_up_first": call["set_up"],
            "registered_first": call["registered"],
            "registered": QSDPHandle.applied(handle.model) is handle,
            "layouts_asked": sorted(layouts),
            "layouts_kept": [u.weights.layout is layouts.get(u.index) for u in handle.units],
            "seeds": (handle.seeds.optimizer_step, handle.seeds.microbatch),
        }
    bare, _ = _handle("w8g8", QSDPHandle)
    try:
        bare.install([dist.group.WORLD] * len(bare.units))
    except NotImplementedError as err:
        out["bare"] = str(err)
    return out


def test_install_sets_up_hooks_and_hands_the_collectives_to_the_adapter():
    (result,) = run_ranks(_install, 1)
    for preset, layouts in (("w8g8", []), ("sdp4bit", [0, 1])):
        r = result[preset]
        assert r["groups"] and r["set_up_first"] == [True, True] and not r["registered_first"], (preset, r)
        assert r["registered"], preset
        assert r["layouts_asked"] == layouts and all(r["layouts_kept"]), (preset, r)
        assert r["seeds"] == (1, 0), preset  # the optimizer's step is the handle's step boundary
    assert result["bare"] == "QSDPHandle installs no collectives: an adapter's handle overrides install_collectives"
