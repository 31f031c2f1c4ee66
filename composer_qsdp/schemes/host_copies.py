"""``HostCopies``: a scheme's state kept in host memory instead of device memory, copied to the device for each call.

A scheme that keeps large state between calls (the ``difference`` weight scheme's reference, LoCo's residual) can keep
it in pinned host memory: each call copies it to the device, uses it there, and copies what it changed back. The
copies are asynchronous, so their order is kept by an event: each copy runs on the current stream after every earlier
copy of the same state on any stream. A call must not read the host state before the previous call's copy back has
written it (FSDP may gather on another stream than the one that updated it), nor write it while an earlier copy still
reads it. The host reads the state itself (a checkpoint, a reset) only after :meth:`HostCopies.settle`.
"""

from __future__ import annotations

import torch

__all__ = ["HostCopies"]


class HostCopies:
    """The ordered copies between one piece of host-resident state and the device."""

    def __init__(self) -> None:
        self._last: torch.cuda.Event | None = None  # recorded after the latest copy on CUDA

    @staticmethod
    def empty(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """Host memory for ``numel`` elements of state used on ``device``: pinned for a CUDA device, so that the
        copies are asynchronous."""
        return torch.empty(numel, dtype=dtype, pin_memory=device.type == "cuda")

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Copy ``src`` into ``dst`` (one of them the host state) on the current stream, after every earlier copy."""
        device = dst.device if dst.device.type != "cpu" else src.device
        if device.type != "cuda":
            dst.copy_(src)
            return
        stream = torch.cuda.current_stream(device)
        if self._last is not None:
            stream.wait_event(self._last)
        dst.copy_(src, non_blocking=True)
        self._last = torch.cuda.Event()
        self._last.record(stream)

    def to_device(self, src: torch.Tensor, device: torch.device) -> torch.Tensor:
        """A new tensor on ``device`` holding the host state ``src`` (ordered as :meth:`copy`)."""
        out = torch.empty(src.shape, dtype=src.dtype, device=device)
        self.copy(out, src)
        return out

    def settle(self) -> None:
        """Wait until every copy is done, before the host reads or writes the state itself."""
        if self._last is not None:
            self._last.synchronize()
