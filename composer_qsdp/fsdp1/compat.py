"""FSDP1's private names that the adapter needs, in one place, checked against the installed torch: the only
module of the FSDP1 adapter that reads torch's private names (``tests/test_private_access.py`` keeps it so).

FSDP1 (``FullyShardedDataParallel``) has a public gradient hook but no weight hook:

* Gradients: ``FullyShardedDataParallel.register_comm_hook(state, hook)`` (public; root only, once, refused for
  hybrid strategies) makes every FSDP instance under the root call ``hook(state, padded_unsharded_grad,
  new_sharded_grad)`` instead of its reduce-scatter, reading ``state`` from the instance's ``_comm_hook_state``.
  The adapter registers through the public call, then gives each instance its own unit's state, so the one hook
  knows which unit is reducing.
* Weights: ``FlatParamHandle.unshard`` gathers the sharded flat parameter with
  ``self._all_gather_flat_param(padded_unsharded_flat_param)`` (private, unchanged from torch 2.0 to 2.13; Composer's
  own patch of ``unshard`` for auto-microbatching calls it too). The adapter overrides it on each unit's handle
  instance, never on the class, and leaves ``summon_full_params`` (full state dicts) to the original, so
  checkpoints hold exact weights.

:func:`check_fsdp1_support` verifies those names at install and raises, naming what moved, before anything is
changed.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

__all__ = [
    "FlatPiece",
    "check_fsdp1_support",
    "division_factors",
    "flat_handle",
    "flat_pieces",
    "has_comm_hook",
    "install_all_gather",
    "install_reduce_scatter",
    "offloads_params",
    "release_unsharded",
    "restore_all_gather",
    "restore_reduce_scatter",
    "sharding_strategy",
    "unit_params",
    "weight_versions",
    "zero_padding",
]

#: ``(key, shape, elements)`` of one piece of a flat parameter; padding has key and shape ``None``.
FlatPiece = tuple[str | None, torch.Size | None, int]

_FLAT_PARAM_MODULE = "torch.distributed.fsdp._flat_param"
_COMMON_UTILS_MODULE = "torch.distributed.fsdp._common_utils"
_RUNTIME_UTILS_MODULE = "torch.distributed.fsdp._runtime_utils"
_FLAT_PARAM_ATTRS = ("_fqns", "_shapes", "_numels", "_numels_with_padding", "_is_padding_mask")
_STATE_ATTRS = ("_handle", "_comm_hook", "_comm_hook_state", "_gradient_predivide_factor",
                "_gradient_postdivide_factor", "sharding_strategy", "cpu_offload")


def check_fsdp1_support(fsdp_module: FullyShardedDataParallel) -> None:
    """Raise unless this torch's FSDP1 has the private names the adapter uses (checked on a wrapped instance).

    Raises:
        RuntimeError: naming the torch version and each name that moved.
    """
    problems = []
    try:
        handle_cls = importlib.import_module(_FLAT_PARAM_MODULE).FlatParamHandle
        importlib.import_module(_COMMON_UTILS_MODULE).HandleTrainingState.SUMMON_FULL_PARAMS
        runtime_utils = importlib.import_module(_RUNTIME_UTILS_MODULE)
        reduce_grad = runtime_utils._reduce_grad
        runtime_utils._reshard, handle_cls.needs_unshard  # release_unsharded's
    except (ImportError, AttributeError) as err:
        problems.append(f"cannot import FSDP1's internals ({err})")
    else:
        if "_all_gather_flat_param" not in handle_cls.unshard.__code__.co_names:
            problems.append("FlatParamHandle.unshard no longer calls self._all_gather_flat_param")
        if "_comm_hook_state" not in reduce_grad.__code__.co_names:
            problems.append("_runtime_utils._reduce_grad no longer passes the instance's _comm_hook_state")
    problems += [f"FSDP instances have no {a}" for a in _STATE_ATTRS if not hasattr(fsdp_module, a)]
    handle = getattr(fsdp_module, "_handle", None)
    if handle is not None:
        problems += [f"flat parameters have no {a}" for a in _FLAT_PARAM_ATTRS if not hasattr(handle.flat_param, a)]
    if problems:
        raise RuntimeError(
            f"QSDP's FSDP1 adapter does not fit torch {torch.__version__}: " + "; ".join(problems) + ". It is "
            "verified on torch 2.7-2.11; use FSDP2 (torch.distributed.fsdp.fully_shard) instead."
        )


def flat_handle(fsdp_module: FullyShardedDataParallel) -> Any:
    """The instance's ``FlatParamHandle``, or ``None`` when it manages no parameters."""
    return fsdp_module._handle


def unit_params(handle: Any) -> tuple[torch.Tensor, ...]:
    """The tensors whose version counters show an in-place change of the unit's weights: the flat parameter (which
    the optimizer updates with ``use_orig_params=False``) and, with ``use_orig_params=True``, the original
    parameters, whose sharded views the optimizer updates under their own version counters."""
    flat_param = handle.flat_param
    return (flat_param, *(flat_param._params or ()))


def weight_versions(params: Sequence[torch.Tensor]) -> tuple[int, ...]:
    """The autograd version counters of ``params`` (:func:`unit_params`), which every in-place change of a tensor
    advances; torch has no public reader for them."""
    return tuple(p._version for p in params)


def flat_pieces(handle: Any) -> list[FlatPiece]:
    """The flat parameter's pieces in order: each parameter (key relative to the FSDP instance's module, e.g.
    ``"weight"``, and shape) and the padding ``use_orig_params=True`` inserts (between parameters, for alignment,
    and at the end, up to a multiple of the world size)."""
    flat_param = handle.flat_param
    names = iter(zip(flat_param._fqns, flat_param._shapes))
    pieces: list[FlatPiece] = []
    for numel, padding in zip(flat_param._numels_with_padding, flat_param._is_padding_mask):
        pieces.append((None, None, numel) if padding else (*next(names), numel))
    return pieces


@torch.no_grad()
def zero_padding(handle: Any) -> None:
    """Set the padding elements of this rank's shard of the flat parameter to 0.

    FSDP1 fills the padding of ``use_orig_params=True`` (alignment between parameters, and up to a multiple of the
    world size) with 42, a marker never computed with. Quantizers bucket it with the parameters beside it, where 42
    would widen a bucket's range (and a weight-difference reference rebuilt from a checkpoint, padded with 0, would
    differ there). Zero, FSDP2's padding, stays zero: no gradient reaches padding, so no optimizer moves it.
    """
    pieces = flat_pieces(handle)
    shard = handle.flat_param.data  # outside forward and backward: this rank's (padded) shard
    if shard.numel() != -(-sum(numel for _, _, numel in pieces) // handle.world_size):
        raise RuntimeError("the FSDP1 model's flat parameters are unsharded; apply QSDP before the first forward")
    start, stop = handle.rank * shard.numel(), (handle.rank + 1) * shard.numel()
    offset = 0
    for key, _, numel in pieces:
        low, high = max(offset, start), min(offset + numel, stop)
        if key is None and low < high:
            shard[low - start : high - start].zero_()
        offset += numel


def division_factors(fsdp_module: FullyShardedDataParallel) -> tuple[float, float]:
    """FSDP1's gradient pre- and post-division factors (their product is the world size): dividing before the sum
    keeps low-precision sums in range; a hook that replaces the reduce-scatter applies them itself."""
    return fsdp_module._gradient_predivide_factor, fsdp_module._gradient_postdivide_factor


def release_unsharded(fsdp_module: FullyShardedDataParallel) -> None:
    """Free the unit's gathered flat parameter if it still holds one, as FSDP1's post-backward reshard does
    (``_runtime_utils._reshard``). FSDP1 keeps the root's weights gathered after a forward (for the backward it
    expects), so a forward without a backward (an evaluation) leaves them for the next forward to reuse."""
    handle = fsdp_module._handle
    if handle is None or handle.needs_unshard():  # no parameters, or sharded already
        return
    importlib.import_module(_RUNTIME_UTILS_MODULE)._reshard(fsdp_module, handle, True)


def offloads_params(fsdp_module: FullyShardedDataParallel) -> bool:
    """Whether the instance offloads parameters to the CPU (``CPUOffload(offload_params=True)``)."""
    return bool(fsdp_module.cpu_offload.offload_params)


def has_comm_hook(fsdp_module: FullyShardedDataParallel) -> bool:
    """Whether a communication hook is registered on the instance (FSDP1 takes one per instance)."""
    return fsdp_module._comm_hook is not None


def sharding_strategy(fsdp_module: FullyShardedDataParallel) -> ShardingStrategy:
    """The instance's sharding strategy (FSDP1 switches to ``NO_SHARD`` itself at world size 1)."""
    return fsdp_module.sharding_strategy


def install_all_gather(handle: Any, all_gather: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Route ``handle``'s weight all-gathers to ``all_gather(padded_unsharded_flat_param) -> that tensor``.

    ``summon_full_params`` (full state dicts, ``FSDP.summon_full_params``) and FSDP's debugging fake gathers keep
    the original: a checkpoint must hold the exact weights, never quantized ones.
    """
    summoning = importlib.import_module(_COMMON_UTILS_MODULE).HandleTrainingState.SUMMON_FULL_PARAMS
    original = type(handle)._all_gather_flat_param

    def all_gather_flat_param(padded_unsharded_flat_param: torch.Tensor) -> torch.Tensor:
        if handle._training_state == summoning or handle._use_fake_all_gather:
            return original(handle, padded_unsharded_flat_param)
        return all_gather(padded_unsharded_flat_param)

    handle._all_gather_flat_param = all_gather_flat_param


def restore_all_gather(handle: Any) -> None:
    """Undo :func:`install_all_gather` (the class's method shows through again)."""
    del handle._all_gather_flat_param


def install_reduce_scatter(root: FullyShardedDataParallel, states: dict[nn.Module, Any],
                           hook: Callable[..., None], placeholder: Any) -> None:
    """Register ``hook`` on the FSDP root ``root`` (public ``register_comm_hook``), then give each FSDP instance
    in ``states`` its own hook state; the other instances keep ``placeholder`` (they manage no parameters, so FSDP
    never calls the hook for them)."""
    root.register_comm_hook(placeholder, hook)
    for module in FullyShardedDataParallel.fsdp_modules(root):
        if module._comm_hook_state is not placeholder:  # what register_comm_hook is documented to set
            raise RuntimeError(f"register_comm_hook did not set _comm_hook_state on torch {torch.__version__}")
        if module in states:
            module._comm_hook_state = states[module]


def restore_reduce_scatter(root: FullyShardedDataParallel) -> None:
    """Undo :func:`install_reduce_scatter`: FSDP's own reduce-scatter again (FSDP1 has no public unregister)."""
    for module in FullyShardedDataParallel.fsdp_modules(root):
        module._comm_hook = None
        module._comm_hook_state = None
