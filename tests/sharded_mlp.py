"""What every adapter's multi-rank training tests share: a small MLP, its per-rank data, the exact single-process
reference, the weight capture, the training loop, and :class:`Adapter`, how each framework adapter shards the MLP
and installs QSDP (FSDP2 through either comm path, FSDP1 with either ``use_orig_params``).

The model has a layer of 67 rows, which no world size here divides (uneven shards).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from dist_spawn import RankInfo
from full_dtensor import gather_full

IN, HID, ODD, OUT = 32, 128, 67, 16
STEPS, LR, BATCH = 8, 0.1, 16
LAYERS = ("l1", "l2", "l3")


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1234)
        self.l1, self.l2, self.l3 = nn.Linear(IN, HID), nn.Linear(HID, ODD), nn.Linear(ODD, OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l3(torch.relu(self.l2(torch.relu(self.l1(x)))))


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(10_000 * step + rank)
    return torch.randn(BATCH, IN, generator=gen), torch.randn(BATCH, OUT, generator=gen)


def global_batch(world: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*(batch(r, step) for r in range(world)))
    return torch.cat(xs), torch.cat(ys)


def reference_training(world: int, steps: int, skip: Collection[int] = ()) -> tuple[dict, list[float]]:
    """Exact single-process data parallelism: the mean loss over all ranks' batches, plain SGD; the steps in
    ``skip`` compute their loss but do not update (as a gradient scaler skips a non-finite step)."""
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(steps):
        x, y = global_batch(world, step)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        if step not in skip:
            opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {n: p.detach() for n, p in model.named_parameters()}, losses


# ---------------------------------------------------------------------------------------------- rank side
def _is_fsdp1(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FullyShardedDataParallel

    return any(isinstance(m, FullyShardedDataParallel) for m in model.modules())


def full_tensors(model: nn.Module, grads: bool = False) -> dict[str, torch.Tensor]:
    """Every parameter (``grads``: its gradient), unsharded, by its name in the unwrapped model (collective).

    FSDP1 gathers them with ``summon_full_params``, which QSDP leaves exact; gradients need ``use_orig_params``.
    FSDP2's DTensors are gathered by :func:`full_dtensor.gather_full` (not ``full_tensor()``, which segfaults on CUDA
    tensors over gloo, as ranks sharing a GPU run).
    """
    if _is_fsdp1(model):
        from torch.distributed.fsdp import FullyShardedDataParallel

        with FullyShardedDataParallel.summon_full_params(model, writeback=False, with_grads=grads):
            return {n: (p.grad if grads else p).detach().clone() for n, p in model.named_parameters()}
    return {n: gather_full(p.grad if grads else p) for n, p in model.named_parameters()}


def local_shard(param: torch.Tensor) -> torch.Tensor:
    """This rank's part of a sharded parameter (FSDP2: a DTensor's local tensor; FSDP1: the parameter itself)."""
    return param.to_local() if hasattr(param, "to_local") else param


def layer(model: nn.Module, name: str) -> nn.Module:
    """The ``nn.Linear`` itself under FSDP1's and activation checkpointing's wrappers (FSDP2 wraps in place)."""
    module = getattr(model, name)
    while wrapped := [m for key, m in module._modules.items()
                      if key in ("_fsdp_wrapped_module", "_checkpoint_wrapped_module")]:
        module = wrapped[0]
    return module


class Capture:
    """Records the unsharded weights each layer computes with, in forward and (via a grad hook) in backward."""

    def __init__(self, model: nn.Module) -> None:
        self.forward: dict[str, torch.Tensor] = {}
        self.backward: dict[str, torch.Tensor] = {}
        for name in LAYERS:  # registered after wrapping: runs after the unshard
            layer(model, name).register_forward_pre_hook(self._pre_forward(name))

    def _pre_forward(self, name: str):
        def hook(module: nn.Module, args) -> None:
            weight = module.weight
            self.forward[name] = weight.detach().clone()
            self.forward[f"{name}.bias"] = module.bias.detach().clone()
            # FSDP2 reuses its unsharded parameter every step; FSDP1 computes with a new view of its flat parameter.
            if not getattr(weight, "_captured", False):
                weight._captured = True
                weight.register_hook(lambda grad, w=weight: self.backward.__setitem__(name, w.detach().clone()))
        return hook


def _train(info: RankInfo, model: nn.Module, steps: int, opt=None, first_step: int = 0,
           capture: Capture | None = None, poison: tuple[int, int] | None = None, microbatches: int = 1,
           handle=None, grads: bool = True) -> dict:
    """Train ``steps`` steps, each on its batch in ``microbatches`` gradient-accumulation microbatches; with a
    ``capture`` the weights each microbatch's forward and backward saw, with a ``handle`` its seed counters, with
    ``grads`` the unsharded gradients of the first step."""
    opt = opt or torch.optim.SGD(model.parameters(), lr=LR)
    losses, forward, backward, seeds, grads0 = [], [], [], [], None
    for step in range(first_step, first_step + steps):
        x, y = (t.to(info.device) for t in batch(info.rank, step))
        if poison == (info.rank, step):
            x[0, 0] = float("inf")
        total = torch.zeros((), device=info.device)
        for xm, ym in zip(x.chunk(microbatches), y.chunk(microbatches)):
            # .float(): bf16 outputs under mixed precision
            loss = nn.functional.mse_loss(model(xm).float(), ym) / microbatches
            loss.backward()
            total += loss.detach()
            if capture is not None:
                forward.append(dict(capture.forward))
                backward.append(dict(capture.backward))
            if handle is not None:
                seeds.append((handle.seeds.optimizer_step, handle.seeds.microbatch))
        if step == first_step and grads:
            grads0 = full_tensors(model, grads=True)
        opt.step()
        opt.zero_grad()
        dist.all_reduce(total)
        losses.append(total.item() / info.world_size)
    return {"losses": losses, "params": full_tensors(model), "grads0": grads0, "forward": forward,
            "backward": backward, "seeds": seeds}


@dataclass(frozen=True)
class Adapter:
    """How a scenario shards the MLP and installs QSDP on it.

    Attributes:
        name: ``"fsdp2"`` (this torch's default comm path: the custom collectives on torch >= 2.9),
            ``"fsdp2-proxy"`` (FSDP2's internal collectives, the path of torch 2.6-2.8, forced) or ``"fsdp1"``.
        use_orig_params: FSDP1's ``use_orig_params`` (Composer's default: True).
    """

    name: str
    use_orig_params: bool = True

    @property
    def fsdp1(self) -> bool:
        return self.name == "fsdp1"

    def shard(self, info: RankInfo, mixed_precision: bool = False, checkpoint_l2: bool = False,
              fsdp1_options: dict | None = None) -> MLP:
        """The MLP with each layer and the root sharded; ``mixed_precision``: bf16 gathers and fp32 reductions
        (Composer's ``DEFAULT``); ``checkpoint_l2``: l2's activations recomputed in backward from re-gathered
        weights; ``fsdp1_options``: more (or other) ``FullyShardedDataParallel`` arguments."""
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        model = MLP()
        if checkpoint_l2:
            model.l2 = checkpoint_wrapper(model.l2)
        dtypes = {"param_dtype": torch.bfloat16, "reduce_dtype": torch.float32} if mixed_precision else {}
        if self.fsdp1:
            from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision
            from torch.distributed.fsdp.wrap import ModuleWrapPolicy

            precision = MixedPrecision(**dtypes, buffer_dtype=torch.float32) if mixed_precision else None
            options = {"mixed_precision": precision, "use_orig_params": self.use_orig_params}
            options.update(fsdp1_options or {})
            return FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
                                            device_id=info.device, **options)
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        model = model.to(info.device)
        kwargs = {"mesh": info.mesh(), "mp_policy": MixedPrecisionPolicy(**dtypes)}
        for name in LAYERS:
            fully_shard(getattr(model, name), **kwargs)
        fully_shard(model, **kwargs)
        return model

    def apply(self, model: nn.Module, config, optimizers=None):
        """QSDP on ``model`` through this adapter; returns the handle."""
        if self.fsdp1:
            from composer_qsdp.fsdp1 import apply_qsdp

            return apply_qsdp(model, config, optimizers=optimizers)
        from composer_qsdp.fsdp2 import apply_qsdp

        comm_path = "proxy" if self.name == "fsdp2-proxy" else None
        return apply_qsdp(model, config, optimizers=optimizers, comm_path=comm_path)

    def remove(self, model: nn.Module) -> None:
        if self.fsdp1:
            from composer_qsdp.fsdp1 import remove_qsdp
        else:
            from composer_qsdp.fsdp2 import remove_qsdp
        remove_qsdp(model)


def save_sharded(model: nn.Module, opt: torch.optim.Optimizer, handle, ckpt_dir: str) -> None:
    """The model, optimizer and QSDP handle state in one ``torch.distributed.checkpoint`` (each rank its pieces)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd, "qsdp": handle.state_dict()}, checkpoint_id=ckpt_dir)


def load_sharded(model: nn.Module, opt: torch.optim.Optimizer, handle, ckpt_dir: str) -> None:
    """Load :func:`save_sharded`'s checkpoint into a fresh model, optimizer and handle. Two passes: a fresh scheme
    has no residual yet, so the first load's state gives the residuals' sizes (the handle's state then holds zero
    pieces of them) and the second reads each rank's own piece in place."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd, "qsdp": handle.state_dict()}
    dcp.load(state, checkpoint_id=ckpt_dir)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    handle.load_state_dict(state["qsdp"])
    pieces = {"qsdp": handle.state_dict()}
    dcp.load(pieces, checkpoint_id=ckpt_dir)
    handle.load_state_dict(pieces["qsdp"])
