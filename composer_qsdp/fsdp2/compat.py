"""How QSDP reaches FSDP2's collectives on each torch: the one module of the FSDP2 adapter that knows the version,
and the only one that reads torch's private names (FSDP2's collectives module, its parameter group and
``FSDPParam`` fields, tensors' version counters); ``tests/test_private_access.py`` keeps it so.

Two comm paths deliver a unit's all-gather and reduce-scatter to the same comm objects
(:class:`~composer_qsdp.fsdp2.comms.QSDPAllGather`, :class:`~composer_qsdp.fsdp2.comms.QSDPReduceScatter`):

* ``"custom"`` (torch >= 2.9): FSDP2's public custom-collective API, ``FSDPModule.set_custom_all_gather`` /
  ``set_custom_reduce_scatter``.
* ``"proxy"`` (torch 2.6-2.8, which have no such API; it also works on 2.9-2.12): FSDP2 issues its collectives
  as ``dist.all_gather_into_tensor`` / ``dist.reduce_scatter_tensor`` through the module global ``dist`` of
  ``torch.distributed.fsdp._fully_shard._fsdp_collectives`` (``foreach_all_gather`` / ``foreach_reduce`` on 2.6-2.8,
  the default comm classes on 2.9+). That global becomes a proxy that forwards everything to
  ``torch.distributed``, except those two calls while one of QSDP's units communicates: each unit's parameter group
  has its ``unshard`` and ``post_backward`` wrapped (on the instance, nothing class-wide) to name the unit in a
  context variable, and the proxy hands the call to that unit's comm objects. Other FSDP2 models in the process,
  and world-size-1 groups (where torch >= 2.9 skips the collective), pass through untouched.

The proxy path relies on private names. :func:`check_proxy_support` inspects this torch's code for exactly the
calls the proxy intercepts and raises before anything is installed when a release has moved them (torch 2.13
renamed the collectives to ``all_gather_single`` / ``reduce_scatter_single``; it has the public API).
"""

from __future__ import annotations

import contextvars
import importlib
import inspect
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FSDPModule

try:  # the Comm ABCs arrived with the custom-collective API in torch 2.9
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
except ImportError:  # torch < 2.9: the comm objects are plain callables, reached through the proxy path
    AllGather = ReduceScatter = object  # type: ignore[assignment,misc]

__all__ = [
    "AllGather",
    "COMM_PATHS",
    "HAS_CUSTOM_COMM_API",
    "ReduceScatter",
    "ShardedParam",
    "check_comm_path",
    "check_custom_comm_support",
    "check_proxy_support",
    "default_comm_path",
    "install_comms",
    "param_group",
    "restore_comms",
    "sharded_params",
    "weight_versions",
]

#: FSDP2 has ``set_custom_all_gather`` / ``set_custom_reduce_scatter`` (torch >= 2.9).
HAS_CUSTOM_COMM_API = hasattr(FSDPModule, "set_custom_all_gather")

#: The comm paths, and what each one hooks.
COMM_PATHS = {
    "custom": "FSDPModule.set_custom_all_gather/set_custom_reduce_scatter (torch >= 2.9)",
    "proxy": "a proxy for torch.distributed in FSDP2's _fsdp_collectives (torch 2.6-2.8: no custom-collective API)",
}

_COLLECTIVES_MODULE = "torch.distributed.fsdp._fully_shard._fsdp_collectives"
_PARAM_GROUP_MODULE = "torch.distributed.fsdp._fully_shard._fsdp_param_group"
# The calls the proxy intercepts, and the param-group methods (and the collective functions they call) it wraps.
_GATHER, _REDUCE = "all_gather_into_tensor", "reduce_scatter_tensor"
_WRAPPED = {"unshard": "foreach_all_gather", "post_backward": "foreach_reduce"}


def check_custom_comm_support() -> None:
    """Raise unless this torch has FSDP2's custom-collective API (torch >= 2.9).

    Raises:
        RuntimeError: naming the installed torch and the version needed.
    """
    if not HAS_CUSTOM_COMM_API:
        raise RuntimeError(
            f"QSDP's custom-collective path needs FSDPModule.set_custom_all_gather, added in torch 2.9; this is "
            f"torch {torch.__version__}, where QSDP uses its proxy path (comm_path='proxy', the default here)."
        )


def check_proxy_support() -> None:
    """Raise unless this torch's FSDP2 issues its collectives where the proxy path intercepts them.

    Raises:
        RuntimeError: naming the torch version and each private name that moved.
    """
    try:
        collectives = importlib.import_module(_COLLECTIVES_MODULE)
        param_group = importlib.import_module(_PARAM_GROUP_MODULE).FSDPParamGroup
    except (ImportError, AttributeError) as err:
        problems = [f"cannot import FSDP2's internals ({err})"]
    else:
        problems = _proxy_problems(collectives, param_group)
    if problems:
        raise RuntimeError(
            f"QSDP's FSDP2 proxy path does not fit torch {torch.__version__}: " + "; ".join(problems) + ". It is "
            "verified on torch 2.7-2.11; on torch >= 2.9 use the custom-collective path (comm_path='custom')."
        )


def default_comm_path() -> str:
    """``"custom"`` where this torch has the custom-collective API, else ``"proxy"``."""
    return "custom" if HAS_CUSTOM_COMM_API else "proxy"


def check_comm_path(path: str) -> None:
    """Validate ``path`` for this torch.

    Raises:
        ValueError: ``path`` is not one of :data:`COMM_PATHS`.
        RuntimeError: the path cannot run on this torch (see :func:`check_custom_comm_support` and
            :func:`check_proxy_support`).
    """
    if not isinstance(path, str) or path not in COMM_PATHS:
        raise ValueError(f"comm_path={path!r} is invalid; allowed: {', '.join(map(repr, COMM_PATHS))} or None")
    if path == "custom":
        check_custom_comm_support()
    else:
        check_proxy_support()


def install_comms(module: nn.Module, all_gather: Callable[..., Any], reduce_scatter: Callable[..., Any],
                  path: str) -> None:
    """Make ``module`` (an FSDP2 unit) send its all-gathers through ``all_gather`` and its reduce-scatters through
    ``reduce_scatter`` (FSDP2's comm-object call signatures), by ``path``."""
    fsdp_module: Any = module
    if path == "custom":
        fsdp_module.set_custom_all_gather(all_gather)
        fsdp_module.set_custom_reduce_scatter(reduce_scatter)
        return
    group = param_group(module)
    comms = _UnitComms(all_gather, reduce_scatter)
    for name in _WRAPPED:
        setattr(group, name, _marking(getattr(type(group), name), group, comms))
    _Proxy.acquire()


def restore_comms(module: nn.Module, path: str) -> None:
    """Undo :func:`install_comms`: FSDP2's default collectives again."""
    fsdp_module: Any = module
    if path == "custom":
        from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

        fsdp_module.set_custom_all_gather(DefaultAllGather())
        fsdp_module.set_custom_reduce_scatter(DefaultReduceScatter())
        return
    group = param_group(module)
    for name in _WRAPPED:
        delattr(group, name)  # the instance attribute: the class's method shows through again
    _Proxy.release()


# ---------------------------------------------------------------------------------------------- the proxy path
class _UnitComms(NamedTuple):
    all_gather: Callable[..., Any]
    reduce_scatter: Callable[..., Any]


# The unit whose parameter group is communicating right now (set around its unshard / post_backward).
_ACTIVE: contextvars.ContextVar[_UnitComms | None] = contextvars.ContextVar("qsdp_fsdp2_unit", default=None)


def _marking(method: Callable[..., Any], group: Any, comms: _UnitComms) -> Callable[..., Any]:
    """``method`` bound to ``group``, running with ``comms`` as the active unit (nesting-safe: a prefetch of
    another unit inside it sets and resets its own)."""

    def marked(*args: Any, **kwargs: Any) -> Any:
        token = _ACTIVE.set(comms)
        try:
            return method(group, *args, **kwargs)
        finally:
            _ACTIVE.reset(token)

    return marked


class _Proxy:
    """Stands in for ``torch.distributed`` as ``_fsdp_collectives.dist`` while any unit uses the proxy path.

    Every attribute resolves to the real module (``ProcessGroup``, ``ReduceOp``, ``distributed_c10d.Work``, HSDP's
    ``all_reduce``...) except the two collectives, which go to the active unit's comm objects. Signatures are
    ``torch.distributed``'s: FSDP passes keywords.
    """

    users = 0  # units on the proxy path, over all models in the process

    def __init__(self, real: types.ModuleType) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def all_gather_into_tensor(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                               group: dist.ProcessGroup | None = None, async_op: bool = False) -> Any:
        comms = _ACTIVE.get()
        if comms is None or group is None or group.size() == 1:
            return self._real.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)
        return comms.all_gather(output_tensor, input_tensor, group, async_op)

    def reduce_scatter_tensor(self, output: torch.Tensor, input: torch.Tensor,
                              op: dist.ReduceOp | dist.ReduceOp.RedOpType = dist.ReduceOp.SUM,
                              group: dist.ProcessGroup | None = None, async_op: bool = False) -> Any:
        comms = _ACTIVE.get()
        if comms is None or group is None or group.size() == 1:
            return self._real.reduce_scatter_tensor(output, input, op=op, group=group, async_op=async_op)
        return comms.reduce_scatter(output, input, group, op, async_op)

    @classmethod
    def acquire(cls) -> None:
        collectives = importlib.import_module(_COLLECTIVES_MODULE)
        if not isinstance(collectives.dist, _Proxy):
            collectives.dist = _Proxy(collectives.dist)
        cls.users += 1

    @classmethod
    def release(cls) -> None:
        cls.users -= 1
        collectives = importlib.import_module(_COLLECTIVES_MODULE)
        if cls.users == 0 and isinstance(collectives.dist, _Proxy):
            collectives.dist = collectives.dist._real


def param_group(module: nn.Module) -> Any:
    """FSDP2's parameter group of a unit (an FSDP2 internal: its ``fsdp_params`` and ``mesh_info`` are what FSDP2
    communicates, and over which group; its presence is part of :func:`check_proxy_support`).

    Raises:
        ValueError: ``module`` was not given to ``fully_shard``, or it manages no parameters.
    """
    if not isinstance(module, FSDPModule):
        raise ValueError(f"{type(module).__name__} is not an FSDP2 module; was fully_shard applied?")
    group = module._get_fsdp_state()._fsdp_param_group  # type: ignore[operator,union-attr]
    if group is None:
        raise ValueError(f"{type(module).__name__} manages no parameters; FSDP2 sends no collective for it")
    return group


class ShardedParam(NamedTuple):
    """One parameter of an FSDP2 unit as FSDP2 shards it (read from its private ``FSDPParam``)."""

    module: nn.Module  #: the submodule that holds it
    name: str  #: its attribute name on ``module``
    shape: torch.Size  #: its full, unsharded shape
    padded_shard: torch.Size  #: the shape of each rank's shard, padded to the same rows on every rank


def sharded_params(module: nn.Module) -> list[ShardedParam]:
    """The parameters of an FSDP2 unit in FSDP2's order, the order of each rank's all-gather input.

    Raises:
        ValueError: as :func:`param_group`.
        AttributeError: this torch's ``FSDPParam`` keeps its module, name or sizes elsewhere.
    """
    return [ShardedParam(p._module_info.module, p._module_info.param_name, p._orig_size, p.padded_sharded_param_size)
            for p in param_group(module).fsdp_params]


def weight_versions(params: Sequence[torch.Tensor]) -> tuple[int, ...]:
    """The autograd version counters of ``params`` (a unit's sharded parameters), which every in-place change of a
    tensor advances; torch has no public reader for them."""
    return tuple(p._version for p in params)


def _proxy_problems(collectives: types.ModuleType, param_group: type) -> list[str]:
    """What keeps the proxy path from working with these FSDP2 internals (empty: nothing)."""
    problems = []
    real = collectives.__dict__.get("dist")
    if not (real is dist or isinstance(real, _Proxy)):
        problems.append(f"{collectives.__name__} has no module global 'dist' bound to torch.distributed")
    for name in (_GATHER, _REDUCE):
        if not any({"dist", name} <= set(code.co_names) for code in _codes(collectives)):
            problems.append(f"{collectives.__name__} no longer calls dist.{name}")
    for method, callee in _WRAPPED.items():
        code = getattr(inspect.unwrap(getattr(param_group, method, None)), "__code__", None)
        if code is None or callee not in code.co_names:
            problems.append(f"FSDPParamGroup.{method} no longer calls {callee}")
    if not hasattr(FSDPModule, "_get_fsdp_state"):
        problems.append("FSDPModule has no _get_fsdp_state")
    return problems


def _codes(module: types.ModuleType) -> Iterator[types.CodeType]:
    """The code objects of every function and method defined in ``module``, nested ones included."""
    roots = []
    for value in vars(module).values():
        if getattr(value, "__module__", None) != module.__name__:
            continue
        functions = vars(value).values() if isinstance(value, type) else [value]
        # unwrap: decorators such as @torch.no_grad() hide the function's own code behind a wrapper's
        roots.extend(f.__code__ for f in map(inspect.unwrap, functions) if isinstance(f, types.FunctionType))
    while roots:
        code = roots.pop()
        yield code
        roots.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
