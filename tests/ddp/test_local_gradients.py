"""The DDP adapter on a real 2-rank gloo group: with the local-gradients hook DDP all-reduces nothing, the hook
notices steps whose backward bypassed it, and ZeroOneAdam then keeps the replicas in sync by itself."""

from __future__ import annotations

import copy

import pytest
import torch
from dist_spawn import RankInfo, run_ranks
from torch.nn.parallel import DistributedDataParallel

from composer_qsdp.ddp import apply_zero_one_adam, check_not_sharded
from composer_qsdp.optim import ZeroOneAdam


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


def _batch(rank: int, step: int) -> torch.Tensor:
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(100 * rank + step))


def _local_grads(module: torch.nn.Module, batch: torch.Tensor) -> list[torch.Tensor]:
    """What this rank's own backward gives, without DDP."""
    twin = copy.deepcopy(module)
    twin(batch).square().sum().backward()
    return [p.grad for p in twin.parameters()]


def _rank_side(info: RankInfo) -> dict:
    ddp = DistributedDataParallel(_model())
    opt = ZeroOneAdam(ddp.parameters(), lr=0.01, var_freeze_step=1, local_step_scaler=1, local_step_clipper=2,
                      bucket_size=16)
    hook = apply_zero_one_adam(ddp, opt)
    out: dict = {"local_grads": [], "params": []}
    for step in range(3):
        expected = _local_grads(ddp.module, _batch(info.rank, step))
        ddp.zero_grad()
        ddp(_batch(info.rank, step)).square().sum().backward()
        out["local_grads"].append(all(torch.equal(p.grad, e) for p, e in zip(ddp.parameters(), expected)))
        hook.end_step()
        opt.step()
        out["params"].append(torch.cat([p.detach().reshape(-1) for p in ddp.parameters()]))
    with ddp.no_sync():  # a backward that never reaches DDP's reducer, as under Composer's forced_sync
        ddp(_batch(info.rank, 9)).square().sum().backward()
    try:
        hook.end_step()
    except RuntimeError as err:
        out["bypassed"] = str(err)
    out["schedule"] = (opt.schedule.local_steps, opt.schedule.local_step_interval)
    return out


def test_ddp_keeps_local_gradients_and_the_optimizer_synchronizes():
    outs = run_ranks(_rank_side, 2)
    for out in outs:
        assert out["local_grads"] == [True, True, True]  # DDP averaged nothing
        assert "forced_sync" in out["bypassed"]
    # Step 1 updates the variance from an exact mean, step 2 synchronizes (interval 1), step 3 is a local step
    # (the interval grew to 2): the replicas agree after steps 1 and 2 and differ after step 3.
    assert outs[0]["schedule"] == (1, 2)
    assert [torch.equal(a, b) for a, b in zip(outs[0]["params"], outs[1]["params"])] == [True, True, False]


def test_sharded_models_and_other_optimizers_are_refused():
    from torch.distributed.fsdp import FSDPModule

    sharded = torch.nn.Linear(2, 2)
    sharded.__class__ = type("FSDPLinear", (FSDPModule, torch.nn.Linear), {})  # what fully_shard does to a module
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), sharded)
    with pytest.raises(ValueError, match="module '1' is sharded .FSDPModule.*does not work with FSDP"):
        check_not_sharded(model)
    with pytest.raises(ValueError, match="needs a composer_qsdp.optim.ZeroOneAdam optimizer, got SGD"):
        apply_zero_one_adam(_model(), torch.optim.SGD(_model().parameters(), lr=0.1))
    assert apply_zero_one_adam(_model(), ZeroOneAdam(_model().parameters())) is None  # not DDP: no hook needed
