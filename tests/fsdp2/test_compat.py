"""The FSDP2 adapter's version-gated module (composer_qsdp.fsdp2.compat): whether the proxy path fits this torch's
private FSDP2 internals (a release that moves them fails here, by name), and how the proxy routes calls. No process
group; install/remove on real units is in test_apply.py, training through both paths in test_fsdp_training.py."""

from __future__ import annotations

import re
import types

import pytest
import torch
import torch.distributed as dist

from composer_qsdp.fsdp2 import compat


def test_the_proxy_path_fits_this_torch():
    # If this fails, a torch release moved a private name the proxy path relies on: the message names it.
    compat.check_proxy_support()


def test_a_torch_that_moved_the_calls_is_refused_naming_each_one():
    # torch 2.13's FSDP2 calls the collectives all_gather_single / reduce_scatter_single (it has the public API).
    moved = types.ModuleType("torch.distributed.fsdp._fully_shard._fsdp_collectives")
    exec(
        "import torch.distributed as dist\n"
        "def foreach_all_gather(output, input, group):\n"
        "    return dist.all_gather_single(output, input, group=group)\n"
        "def foreach_reduce(output, input, group):\n"
        "    return dist.reduce_scatter_single(output, input, group=group)\n",
        moved.__dict__,
    )

    class FSDPParamGroup:  # unshard no longer goes through foreach_all_gather
        def unshard(self) -> None:
            return None

        def post_backward(self) -> None:
            foreach_reduce()  # noqa: F821 (only its name matters)

    assert compat._proxy_problems(moved, FSDPParamGroup) == [
        f"{moved.__name__} no longer calls dist.all_gather_into_tensor",
        f"{moved.__name__} no longer calls dist.reduce_scatter_tensor",
        "FSDPParamGroup.unshard no longer calls foreach_all_gather",
    ]


def test_check_proxy_support_raises_with_the_torch_version(monkeypatch):
    import torch.distributed.fsdp._fully_shard._fsdp_collectives as collectives

    monkeypatch.setattr(collectives, "dist", types.SimpleNamespace())  # FSDP2 reaching torch.distributed otherwise
    message = rf"proxy path does not fit torch {re.escape(str(torch.__version__))}: .*no module global 'dist'"
    with pytest.raises(RuntimeError, match=message):
        compat.check_proxy_support()
    with pytest.raises(RuntimeError, match=message):
        compat.check_comm_path("proxy")


def test_comm_paths_by_torch_version(monkeypatch):
    assert compat.default_comm_path() == ("custom" if hasattr(torch.distributed.fsdp.FSDPModule,
                                                              "set_custom_all_gather") else "proxy")
    with pytest.raises(ValueError, match=r"comm_path='nccl' is invalid; allowed: 'custom', 'proxy' or None"):
        compat.check_comm_path("nccl")
    monkeypatch.setattr(compat, "HAS_CUSTOM_COMM_API", False)  # torch 2.6-2.8
    assert compat.default_comm_path() == "proxy"
    with pytest.raises(RuntimeError, match=r"needs FSDPModule.set_custom_all_gather, added in torch 2.9; this is "):
        compat.check_comm_path("custom")


class _Group:
    def __init__(self, size: int) -> None:
        self._size = size

    def size(self) -> int:
        return self._size


def test_the_proxy_hands_only_the_communicating_units_calls_to_its_comms():
    calls = []
    real = types.SimpleNamespace(
        all_gather_into_tensor=lambda *a, **k: calls.append(("torch", "all_gather", k["group"])),
        reduce_scatter_tensor=lambda *a, **k: calls.append(("torch", "reduce_scatter", k["op"])),
        ReduceOp=dist.ReduceOp,
    )
    proxy = compat._Proxy(real)

    def comms(unit: str) -> compat._UnitComms:
        return compat._UnitComms(lambda out, inp, group, async_op: calls.append((unit, "all_gather", group)),
                                 lambda out, inp, group, op, async_op: calls.append((unit, "reduce_scatter", op)))

    class ParamGroup:  # stands in for FSDPParamGroup: its methods issue FSDP's collectives through the proxy
        def __init__(self, prefetch: ParamGroup | None = None) -> None:
            self.prefetch = prefetch

        def unshard(self, group) -> None:
            proxy.all_gather_into_tensor(None, None, group=group)
            if self.prefetch is not None:  # FSDP prefetches the next unit inside this one's unshard
                self.prefetch.unshard(group)
            proxy.all_gather_into_tensor(None, None, group=group)

        def post_backward(self) -> None:
            proxy.reduce_scatter_tensor(None, None, op=dist.ReduceOp.AVG, group=_Group(2))

    second, one, two = ParamGroup(), _Group(1), _Group(2)
    first = ParamGroup(prefetch=second)
    for group, unit in ((first, "first"), (second, "second")):
        for name in ("unshard", "post_backward"):
            setattr(group, name, compat._marking(getattr(ParamGroup, name), group, comms(unit)))
    first.unshard(two)
    first.post_backward()
    first.unshard(one)  # a 1-rank group: torch >= 2.9 skips the collective, torch 2.6-2.8 sends it as is
    proxy.all_gather_into_tensor(None, None, group=two)  # no unit communicating: another model's FSDP2
    assert calls == [
        ("first", "all_gather", two), ("second", "all_gather", two), ("second", "all_gather", two),
        ("first", "all_gather", two), ("first", "reduce_scatter", dist.ReduceOp.AVG),
        *[("torch", "all_gather", one)] * 4, ("torch", "all_gather", two),
    ]
    assert proxy.ReduceOp is dist.ReduceOp  # everything else is torch.distributed's
