"""Install 0/1 Adam on a model: DDP's comm hook that keeps local gradients, and the checks around it."""

from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel

from composer_qsdp.ddp.hooks import LocalGradients, keep_local_gradients
from composer_qsdp.optim import ZeroOneAdam

__all__ = ["apply_zero_one_adam", "check_not_sharded"]

_SHARDED = ("FullyShardedDataParallel", "FSDPModule")


def check_not_sharded(model: torch.nn.Module) -> None:
    """Raise a ValueError when ``model`` is sharded by FSDP (FSDP1 or ``fully_shard``).

    0/1 Adam synchronizes full replicas; as in DeepSpeed, where it is not compatible with ZeRO, it does not work
    with sharded data parallelism.
    """
    for name, module in model.named_modules():
        sharded = [cls.__name__ for cls in type(module).__mro__ if cls.__name__ in _SHARDED]
        if sharded:
            raise ValueError(
                f"module {name or '<root>'!r} is sharded ({sharded[0]}): 0/1 Adam synchronizes full replicas (plain "
                "data parallelism) and, as in DeepSpeed, does not work with FSDP/ZeRO sharding; train with DDP, or "
                "use QSDP to compress FSDP's communication"
            )


def apply_zero_one_adam(model: torch.nn.Module, optimizer: ZeroOneAdam) -> LocalGradients | None:
    """Make ``model`` train with ``optimizer`` doing all the communication.

    On a ``DistributedDataParallel`` model, registers :func:`~composer_qsdp.ddp.hooks.keep_local_gradients` (DDP
    then all-reduces nothing) and puts back each rank's own weights when a checkpoint taken between two
    synchronizations was loaded before DDP's construction broadcast rank 0's
    (:meth:`~composer_qsdp.optim.ZeroOneAdam.restore_local_params`). Call it once, after wrapping and before the
    first backward. A model that is not wrapped (one process, or a loop that never all-reduces gradients) needs no
    hook.

    Returns:
        The hook's state (call its ``end_step()`` after each step's backward passes to check DDP used it), or
        ``None`` when ``model`` is not a DDP model.

    Raises:
        ValueError: ``optimizer`` is not a ``ZeroOneAdam``, or ``model`` is sharded.
    """
    if not isinstance(optimizer, ZeroOneAdam):
        raise ValueError(f"apply_zero_one_adam needs a composer_qsdp.optim.ZeroOneAdam optimizer, got "
                         f"{type(optimizer).__name__}")
    check_not_sharded(model)
    optimizer.restore_local_params()
    if not isinstance(model, DistributedDataParallel):
        return None
    state = LocalGradients()
    model.register_comm_hook(state, keep_local_gradients)
    return state
