"""A DDP communication hook that keeps each rank's local gradients, and its state.

No ``from __future__ import annotations`` here: DDP's ``register_comm_hook`` compares the hook's annotations with
the ``dist.GradBucket`` and ``torch.futures.Future[torch.Tensor]`` objects, and postponed (string) annotations fail
that check.
"""

import torch
import torch.distributed as dist

__all__ = ["LocalGradients", "keep_local_gradients"]


class LocalGradients:
    """The state of :func:`keep_local_gradients`: how many gradient buckets DDP handed to the hook.

    Attributes:
        buckets: buckets since the last :meth:`end_step`.
    """

    def __init__(self) -> None:
        self.buckets = 0

    def end_step(self) -> None:
        """Close an optimizer step's backward passes.

        Raises:
            RuntimeError: DDP never called the hook during the step: the gradients were synchronized some other
                way (e.g. Composer's ``ddp_sync_strategy='forced_sync'`` all-reduces them itself, in full
                precision, under ``no_sync``), so the optimizer's communication would come on top of it.
        """
        if self.buckets == 0:
            raise RuntimeError(
                "DDP did not call the local-gradients comm hook during this step: the gradients were synchronized "
                "outside DDP's reducer (Composer's ddp_sync_strategy='forced_sync' all-reduces them in full "
                "precision itself). 0/1 Adam needs local gradients: use ddp_sync_strategy 'single_auto_sync' (the "
                "default) or 'multi_auto_sync'."
            )
        self.buckets = 0


def keep_local_gradients(state: LocalGradients, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: return the bucket unchanged, so every rank keeps its local gradients (DDP divides nothing by
    the world size when a hook is registered). Register with
    ``ddp_model.register_comm_hook(LocalGradients(), keep_local_gradients)``."""
    state.buckets += 1
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future
