"""0/1 Adam's checkpoint on another world size (2 -> 4 -> 2 ranks): in the variance phase the shared state (Adam's
moments, the schedule, the byte counters) carries over and the per-rank error-feedback residuals restart from zero
with a warning; between two synchronizations of the local-step phase (every rank's weights differ) the load is
refused with a clear error. The optimizer, its test parameters and gradients are those of tests/optim."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from dist_spawn import RankInfo, run_ranks
from optim.test_zero_one_adam import SCENARIOS, _optimizer, _params, _train

pytestmark = pytest.mark.slow  # five spawns of 2 and 4 ranks: about a minute on 2 cores

SETTINGS = SCENARIOS["local"]  # frozen after step 4; synchronizations at steps 5, 6, 8, 12, 16
VARIANCE_STEP, BETWEEN_SYNCS_STEP, MORE = 3, 10, 2


def _save(info: RankInfo, at: int) -> dict | None:
    """Train to step ``at``; rank 0's copy of the (collective) state dict, as Composer writes it for DDP."""
    params = [[p.detach().requires_grad_() for p in ps] for ps in _params()]
    opt = _optimizer(params, SETTINGS)
    _train(opt, params, range(1, at + 1), info.rank)
    state = opt.state_dict()
    return {"optimizer": copy.deepcopy(state), "params": [[p.detach().clone() for p in ps] for ps in params],
            "between_syncs": opt.schedule.between_syncs} if info.rank == 0 else None


def _load(info: RankInfo, saved: dict, at: int) -> dict:
    """Load ``saved`` (taken at step ``at``) on this world size and train MORE steps (or report the refusal)."""
    params = [[p.clone().requires_grad_() for p in ps] for ps in saved["params"]]
    opt = _optimizer(params, SETTINGS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            opt.load_state_dict(saved["optimizer"])
        except ValueError as err:
            return {"error": str(err)}
    state = copy.deepcopy(opt.state_dict())  # its tensors are live views of the optimizer's buffers
    flats = _train(opt, params, range(at + 1, at + MORE + 1), info.rank)
    return {"warnings": [str(w.message) for w in caught], "state": state if info.rank == 0 else None,
            "flats": flats, "schedule": opt.schedule.state_dict(), "finite": all(f.isfinite().all() for f in flats)}


def _check_carried_over(saved: dict, loaded: list[dict], saved_world: int) -> None:
    world = len(loaded)
    for rank, out in enumerate(loaded):
        assert [w for w in out["warnings"] if f"resumes {saved_world}-rank error-feedback state on {world} ranks: "
                "the error buffers restart from zero" in w], (rank, out["warnings"])
        assert out["finite"]
        # Synchronized steps (the variance phase): every rank holds the same weights after each.
        assert all(torch.equal(f, loaded[0]["flats"][i]) for i, f in enumerate(out["flats"])), rank
    before, after = saved["optimizer"]["state"], loaded[0]["state"]["state"]
    for key, entry in before.items():
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(torch.as_tensor(after[key][name]), torch.as_tensor(entry[name])), (key, name)
        assert after[key]["zero_one"]["traffic"] == entry["zero_one"]["traffic"]  # the counters carry over
        assert after[key]["zero_one"]["world_size"] == world
        assert not after[key]["worker_error"].any() and not after[key]["server_error"].any()  # restarted


@pytest.fixture(scope="module")
def saved_on_2() -> dict:
    return {at: run_ranks(_save, 2, at, timeout_s=120)[0] for at in (VARIANCE_STEP, BETWEEN_SYNCS_STEP)}


def test_variance_phase_state_moves_from_2_to_4_ranks_and_back(saved_on_2):
    saved = saved_on_2[VARIANCE_STEP]
    assert not saved["between_syncs"]
    _check_carried_over(saved, run_ranks(_load, 4, saved, VARIANCE_STEP, timeout_s=120), saved_world=2)
    on_4 = run_ranks(_save, 4, VARIANCE_STEP, timeout_s=120)[0]
    _check_carried_over(on_4, run_ranks(_load, 2, on_4, VARIANCE_STEP, timeout_s=120), saved_world=4)


def test_between_synchronizations_another_world_size_is_refused(saved_on_2):
    saved = saved_on_2[BETWEEN_SYNCS_STEP]
    assert saved["between_syncs"]
    for out in run_ranks(_load, 4, saved, BETWEEN_SYNCS_STEP, timeout_s=120):
        assert out["error"] == ("the checkpoint was taken by 2 ranks between two synchronizations of the local-step "
                                "phase (each rank's weights differ); this run has 4 ranks: resume with the same number")
