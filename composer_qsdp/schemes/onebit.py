"""``OneBitAllReduce``: the compressed all-reduce of 1-bit Adam / 0/1 Adam, with its error-feedback state.

The scheme owns what the stateless :func:`composer_qsdp.comm.compressed_all_reduce` needs between calls: this
rank's worker error (one full, padded copy of the tensor) and its server error (its chunk). Both are saved by
:meth:`OneBitAllReduce.state_dict`, so a run resumed from a checkpoint compresses exactly as an uninterrupted one
(DeepSpeed's ``ZeroOneAdam`` drops them on load and starts them again from zero).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from composer_qsdp.comm import CallTraffic, call_traffic, compressed_all_reduce, error_feedback_chunk_numel
from composer_qsdp.quant import Codec
from composer_qsdp.schemes.base import AllReduceScheme

__all__ = ["OneBitAllReduce"]


class OneBitAllReduce(AllReduceScheme):
    """Error-feedback compressed all-reduce of one flat fp32 tensor (the default all-reduce scheme).

    The first call (or :meth:`load_state_dict`) fixes the tensor's size; every later call must pass the same
    number of elements. ``exact=True`` calls run a plain fp32 all-reduce and leave the error buffers alone.

    Args:
        codec: a deterministic codec (0/1 Adam: ``make_codec("sign")``), or ``None`` for uncompressed fp32
            chunks (exact means; the error buffers stay zero).
        error_sample_interval: must be 0: this scheme does not sample quantization errors.
        error_feedback: carry the compression errors into the next call (default True). ``False``: every call
            compresses on its own with zero residues and the scheme keeps no buffers (0/1 Adam's 8-bit variance
            updates, whose squares would not cancel a carried error).

    Attributes:
        worker_error: this rank's worker error, fp32, ``W * c`` elements (``c``:
            :func:`~composer_qsdp.comm.error_feedback_chunk_numel`); ``None`` before the first call and without
            error feedback.
        server_error: this rank's server error, fp32, ``c`` elements; ``None`` as ``worker_error``.

    Raises:
        ValueError: a stochastic codec, a non-zero ``error_sample_interval``, or a non-bool ``error_feedback``.
    """

    name = "onebit"

    def __init__(self, codec: Codec | None, error_sample_interval: int = 0, error_feedback: bool = True) -> None:
        if not isinstance(error_feedback, bool):
            raise ValueError(f"error_feedback={error_feedback!r} is invalid; allowed: True, False")
        if error_sample_interval != 0:
            raise ValueError(f"error_sample_interval={error_sample_interval!r} is not supported by the onebit "
                             "scheme; allowed: 0")
        if codec is not None and codec.unbiased:
            raise ValueError(f"the onebit scheme needs a deterministic codec, got {codec!r} with stochastic "
                             "rounding (allowed: sign, symmetric, minmax with rounding='nearest', or None)")
        super().__init__(codec, error_sample_interval)
        self.error_feedback = error_feedback
        self.worker_error: torch.Tensor | None = None
        self.server_error: torch.Tensor | None = None
        self._chunk: int | None = None  # elements of each rank's chunk, fixed by the first call

    def _all_reduce(self, tensor: torch.Tensor, group: dist.ProcessGroup, exact: bool,
                    valid: torch.Tensor | None) -> CallTraffic:
        self._ensure_buffers(tensor.numel(), tensor.device)
        if exact:
            dist.all_reduce(tensor, group=group)
            tensor.div_(group.size())
            if valid is not None:
                tensor.masked_fill_(~valid, 0)
            # A ring all-reduce is a reduce-scatter then an all-gather: each chunk moves twice.
            return call_traffic(group.size(), 2 * self._chunk, 2 * self._chunk * 4, 4, self._off_node_peers)
        worker, server = self.worker_error, self.server_error
        if not self.error_feedback:
            worker = tensor.new_zeros(group.size() * self._chunk)
            server = tensor.new_zeros(self._chunk)
        return compressed_all_reduce(tensor, worker, server, self.codec, group, valid=valid,
                                     off_node_peers=self._off_node_peers)

    def reset_errors(self) -> None:
        """Zero both error buffers (0/1 Adam does when what it compresses changes from gradients to momentum)."""
        for buffer in (self.worker_error, self.server_error):
            if buffer is not None:
                buffer.zero_()

    def _ensure_buffers(self, numel: int, device: torch.device) -> None:
        if self.group is None:
            raise RuntimeError("OneBitAllReduce was used before setup(group, topology)")
        chunk = error_feedback_chunk_numel(numel, self.group.size(), self.codec)
        if self._chunk is None:
            self._chunk = chunk
        elif self._chunk != chunk:
            raise ValueError(f"OneBitAllReduce serves one tensor size: it was set up for chunks of "
                             f"{self._chunk} elements, but a tensor of {numel} elements needs {chunk}")
        if self.worker_error is None and self.error_feedback:
            self.worker_error = torch.zeros(self.group.size() * chunk, device=device)
            self.server_error = torch.zeros(chunk, device=device)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Byte counters and this rank's error buffers (different on every rank: save each rank's)."""
        return {**super().state_dict(), "worker_error": self.worker_error, "server_error": self.server_error}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output of the same rank of a group of the same size (after :meth:`setup`).

        Raises:
            ValueError: buffers of another size than this group needs for the same tensor.
            RuntimeError: called before :meth:`setup`.
        """
        if self.group is None:
            raise RuntimeError("OneBitAllReduce.load_state_dict was called before setup(group, topology)")
        super().load_state_dict(state)
        worker, server = state["worker_error"], state["server_error"]
        if worker is None or not self.error_feedback:
            self.worker_error = self.server_error = None
            return
        if worker.numel() != self.group.size() * server.numel():
            raise ValueError(f"saved OneBitAllReduce buffers of {worker.numel()} and {server.numel()} elements do "
                             f"not fit a group of {self.group.size()} ranks (a worker error of W x the server's)")
        self.worker_error = worker.detach().to(torch.float32).clone()
        self.server_error = server.detach().to(torch.float32).clone()
        self._chunk = server.numel()

    def memory_bytes(self) -> int:
        return sum(4 * b.numel() for b in (self.worker_error, self.server_error) if b is not None)

    def describe(self) -> str:
        feedback = "with worker and server error feedback" if self.error_feedback else "without error feedback"
        return f"{super().describe()} {feedback}"
