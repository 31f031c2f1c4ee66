"""Shared-GPU ranks: more processes than GPUs on one host, each GPU serving several ranks joined by gloo.

NCCL refuses two ranks on one device ("Duplicate GPU detected"); gloo carries CUDA tensors through host memory
for every collective this package uses (all-gather, reduce-scatter, all-to-all, all-reduce, broadcast), so N
ranks on fewer GPUs compute exactly what N GPUs would. Their step times say nothing about a network: gloo
copies each message through the host, and the ranks of one GPU time-share it.

The recipe key ``shared_gpu`` (:func:`gpu_placement`) chooses:

* ``auto`` (the default): shared only when the host has fewer visible GPUs than local ranks; with enough GPUs
  nothing changes (rank ``r`` on ``cuda:r``, NCCL).
* ``true``: always gloo, local rank ``r`` on ``cuda:(r % GPUs)``, even with a GPU per rank.
* ``false``: never; fewer GPUs than ranks is an error.

The recipe key ``shared_gpu_transport`` (:data:`SHARED_GPU_TRANSPORTS`) chooses how shared ranks exchange data:
``gloo`` (the default) or ``samedev`` (:mod:`composer_qsdp.comm.same_device_pg`: staging buffers every rank of the GPU
maps, no copy through the host), which computes what gloo computes, bit for bit at two ranks. ``samedev`` must be
registered in the process first (``composer_qsdp.comm.register_same_device_backend``, a layer above this module).

Full (unsharded) FSDP2 checkpoints cannot be written by shared ranks (:func:`check_state_dict_type`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Union

__all__ = ["SHARED_GPU_TRANSPORTS", "SHARED_GPU_VALUES", "GPUPlacement", "check_shared_gpu",
           "check_shared_gpu_transport", "check_state_dict_type", "composer_device", "gpu_placement",
           "this_process_gpu"]

#: What the ``shared_gpu`` recipe key takes.
SHARED_GPU_VALUES: tuple[Union[str, bool], ...] = ("auto", True, False)
#: What the ``shared_gpu_transport`` recipe key takes: the process-group backend of ranks sharing GPUs.
SHARED_GPU_TRANSPORTS: tuple[str, ...] = ("gloo", "samedev")


def dist_backends() -> list[str]:
    """The ``torch.distributed`` backends this process can create groups of (registered ones included)."""
    import torch.distributed

    return torch.distributed.Backend.backend_list


def check_shared_gpu_transport(value: Any) -> str:
    """``value`` as one of :data:`SHARED_GPU_TRANSPORTS`.

    Raises:
        ValueError: any other value, naming it and what is allowed (with the closest name).
    """
    if value in SHARED_GPU_TRANSPORTS:
        return value
    from composer_qsdp._names import did_you_mean

    hint = did_you_mean(str(value), SHARED_GPU_TRANSPORTS)
    raise ValueError(f"shared_gpu_transport = {value!r} is invalid; allowed: gloo (through host memory), samedev "
                     f"(staging buffers on the GPU that its ranks share){hint}")


def check_shared_gpu(value: Any) -> Union[str, bool]:
    """``value`` as one of :data:`SHARED_GPU_VALUES` (the strings ``"true"``/``"false"`` count as booleans).

    Raises:
        ValueError: any other value, naming it and what is allowed.
    """
    if isinstance(value, str) and value.lower() in ("auto", "true", "false"):
        return {"auto": "auto", "true": True, "false": False}[value.lower()]
    if isinstance(value, bool):
        return value
    raise ValueError(f"shared_gpu = {value!r} is invalid; allowed: auto (share GPUs only when there are fewer than "
                     "ranks), true (always: gloo, rank r on GPU r % GPUs), false (never: one GPU per rank, NCCL)")


@dataclass(frozen=True)
class GPUPlacement:
    """Where one local rank trains and which backend joins the ranks.

    Attributes:
        device_id: the CUDA device index of this rank.
        backend: ``"nccl"`` (a GPU per rank), or a :data:`SHARED_GPU_TRANSPORTS` one (shared GPUs).
        shared: whether the ranks share GPUs through gloo.
        gpus: visible GPUs on this host.
        local_world_size: ranks on this host.
    """

    device_id: int
    backend: str
    shared: bool
    gpus: int
    local_world_size: int

    @property
    def ranks_per_gpu(self) -> int:
        """The most ranks any GPU of this host serves."""
        return math.ceil(self.local_world_size / min(self.gpus, self.local_world_size))

    def describe(self) -> str:
        """One line for the run's log."""
        if not self.shared:
            return f"{self.local_world_size} rank(s) on {self.gpus} GPU(s), one GPU per rank, NCCL"
        return (f"shared_gpu: {self.local_world_size} rank(s) on {min(self.gpus, self.local_world_size)} GPU(s), up "
                f"to {self.ranks_per_gpu} per GPU, {self.backend} (rank r on cuda:r % {self.gpus}): the numerics of "
                f"{self.local_world_size} GPUs; step times are not network measurements")

    def hyperparameters(self) -> dict[str, Any]:
        """What the run logs as hyperparameters about its placement."""
        return {"shared_gpu": self.shared, "ranks_per_gpu": self.ranks_per_gpu, "dist_backend": self.backend,
                "visible_gpus": self.gpus}


def gpu_placement(setting: Union[str, bool], local_rank: int, local_world_size: int, gpus: int,
                  transport: str = "gloo", world_size: Optional[int] = None) -> GPUPlacement:
    """The device and backend of local rank ``local_rank`` of ``local_world_size`` on a host with ``gpus`` visible
    GPUs, for the ``shared_gpu`` recipe key's ``setting`` and, where ranks share GPUs, the ``shared_gpu_transport``
    key's ``transport``; ``world_size``: the job's ranks on every host (None: this host's).

    Raises:
        ValueError: ``setting`` is not one of :data:`SHARED_GPU_VALUES` or ``transport`` of
            :data:`SHARED_GPU_TRANSPORTS`; no GPU is visible; ``setting`` is false and there are fewer GPUs than
            ranks; ``local_rank`` is outside ``[0, local_world_size)``; shared ranks over ``samedev`` would be on
            more than one GPU or host (it joins the ranks of one device).
    """
    setting = check_shared_gpu(setting)
    transport = check_shared_gpu_transport(transport)
    if not 0 <= local_rank < local_world_size:
        raise ValueError(f"local rank {local_rank} is outside [0, {local_world_size})")
    if gpus < 1:
        raise ValueError("device: gpu needs a visible CUDA GPU, found none (check CUDA_VISIBLE_DEVICES and "
                         "torch.cuda.is_available()); use device: cpu to train on the CPU")
    shared = setting is True or (setting == "auto" and gpus < local_world_size)
    if not shared and gpus < local_world_size:
        raise ValueError(f"shared_gpu = false needs a GPU per rank: {local_world_size} ranks on this host, "
                         f"{gpus} GPU(s) visible; set shared_gpu=auto to run several ranks per GPU over gloo")
    if shared and transport == "samedev":
        _check_one_device(local_world_size, gpus, local_world_size if world_size is None else world_size)
    return GPUPlacement(device_id=local_rank % gpus if shared else local_rank, backend=transport if shared else "nccl",
                        shared=shared, gpus=gpus, local_world_size=local_world_size)


def _check_one_device(local_world_size: int, gpus: int, world_size: int) -> None:
    """Refuse ``samedev`` for shared ranks that would not all be on one device: its group maps one staging buffer
    per rank of one GPU, and would fail at the first collective otherwise."""
    spread = min(gpus, local_world_size)
    if spread > 1:
        raise ValueError(f"shared_gpu_transport = samedev joins the ranks of one GPU, but {local_world_size} ranks on "
                         f"{gpus} visible GPUs share {spread} of them (rank r on cuda:r % {gpus}); make one GPU "
                         "visible (CUDA_VISIBLE_DEVICES) or set shared_gpu_transport=gloo")
    if world_size > local_world_size:
        raise ValueError(f"shared_gpu_transport = samedev joins the ranks of one GPU, but the job has {world_size} "
                         f"ranks, {local_world_size} on this host; set shared_gpu_transport=gloo")


def check_state_dict_type(shared: bool, state_dict_type: Optional[str]) -> None:
    """Refuse full FSDP2 checkpoints (``state_dict_type`` ``"full"``) when the ranks share GPUs (``shared``).

    A full checkpoint gathers every FSDP2 parameter with ``DTensor.full_tensor()`` (Composer calls
    ``torch.distributed.checkpoint.state_dict.get_model_state_dict(full_state_dict=True)``), i.e. torch's functional
    all-gather, which reaches gloo's coalesced all-gather; that reads CUDA tensors as host memory and every rank
    dies with SIGSEGV at the first checkpoint (pytorch/pytorch#152645). Sharded checkpoints gather nothing.

    Raises:
        ValueError: ``shared`` and ``state_dict_type == "full"``, naming both keys and what works.
    """
    if shared and state_dict_type == "full":
        raise ValueError(
            "fsdp.state_dict_type = 'full' cannot be saved with shared_gpu (ranks sharing a GPU over gloo): a full "
            "checkpoint gathers each FSDP2 parameter with torch's functional all-gather (DTensor.full_tensor()), "
            "which gloo cannot run on CUDA tensors (every rank segfaults at the first checkpoint, "
            "pytorch/pytorch#152645); use fsdp.state_dict_type=sharded (a file per rank), or a GPU per rank "
            "(shared_gpu=false, NCCL)")


def composer_device(placement: GPUPlacement) -> Any:
    """Composer's device for ``placement``: ``"gpu"`` (Composer's own choice, unchanged) when a GPU per rank,
    else a ``DeviceGPU`` on ``placement.device_id`` whose process group is ``placement.backend``.

    Composer also builds ``DeviceGPU()`` itself, with no argument, where it needs "this rank's device" (FSDP2's
    preparation, checkpoint loading: ``composer.utils.get_device(None)``), and such a device moves rank ``r`` to
    ``cuda:r``, which does not exist when ranks share GPUs. So in the shared case ``composer.devices.DeviceGPU``
    becomes, for this process, a subclass whose default device is ``placement.device_id`` and whose backend is
    that backend; ``isinstance(device, DeviceGPU)`` holds for it everywhere.
    """
    if not placement.shared:
        return "gpu"
    if placement.backend not in dist_backends():
        raise ValueError(f"shared_gpu_transport = {placement.backend!r} is not a torch.distributed backend in this "
                         "process yet: call composer_qsdp.comm.register_same_device_backend() first (the recipes' "
                         "train does)")
    import composer.devices
    from composer.devices.device_gpu import DeviceGPU  # the class itself, never the substitute

    class SharedDeviceGPU(DeviceGPU):
        """Composer's ``DeviceGPU`` for a rank that shares its GPU: its shared transport, and this rank's GPU by
        default."""

        dist_backend = placement.backend

        def __init__(self, device_id: Optional[int] = None, *, allow_tf32: bool = True) -> None:
            super().__init__(placement.device_id if device_id is None else device_id, allow_tf32=allow_tf32)

    composer.devices.DeviceGPU = SharedDeviceGPU
    return SharedDeviceGPU()


def this_process_gpu(setting: Union[str, bool] = "auto", state_dict_type: Optional[str] = None,
                     transport: str = "gloo") -> tuple[Any, GPUPlacement]:
    """Composer's device (for ``Trainer(device=...)`` and ``dist.initialize_dist``) and the placement of this
    process, from the launcher's local rank and world size and the visible GPUs.

    Args:
        setting: the ``shared_gpu`` recipe key's value.
        transport: the ``shared_gpu_transport`` recipe key's value.
        state_dict_type: the run's FSDP2 checkpoint format (Composer's ``fsdp`` ``state_dict_type``), checked by
            :func:`check_state_dict_type` against the placement before anything is built; None: not checked.

    Raises:
        ValueError: as :func:`gpu_placement` and :func:`check_state_dict_type`.
    """
    import torch
    from composer.utils import dist

    placement = gpu_placement(setting, dist.get_local_rank(), dist.get_local_world_size(), torch.cuda.device_count(),
                              transport, dist.get_world_size())
    check_state_dict_type(placement.shared, state_dict_type)
    return composer_device(placement), placement
