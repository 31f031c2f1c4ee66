"""Loading checkpoints as data: a checkpoint that Composer or ``torch.distributed.checkpoint`` reads inside
:func:`checkpoint_loading` can hold tensors and Composer's training state, and cannot run code.

The recipe entrypoint trains inside it (the recipe key ``trust_checkpoint`` is its keyword); a script that builds
its own ``Trainer(load_path=...)`` or calls ``composer.utils.load_checkpoint`` wraps that in it the same way::

    with checkpoint_loading():
        trainer = Trainer(..., load_path="checkpoints/ep0-ba100")
        trainer.fit()

What loads and what is refused is in ``docs/trust.md``; the hooks themselves are
:func:`composer_qsdp.recipes.compat.restricted_checkpoint_loads`.
"""

from __future__ import annotations

import contextlib

from composer_qsdp.recipes.compat import UntrustedCheckpointError, restricted_checkpoint_loads
from composer_qsdp.validate import check_bool

__all__ = ["UntrustedCheckpointError", "checkpoint_loading"]


def checkpoint_loading(*, trust_checkpoint: bool = False) -> contextlib.AbstractContextManager[None]:
    """A context in which checkpoints load without running code: a full checkpoint and the non-tensor items of a
    sharded one with ``torch.load(weights_only=True)`` and the few classes Composer's saved state needs, a sharded
    checkpoint's ``.metadata`` through an unpickler that finds only ``torch.distributed.checkpoint``'s metadata
    classes, and no tar archive. Process-wide while it is open: put a run's ``Trainer`` construction and ``fit``
    inside it.

    Args:
        trust_checkpoint: load as Composer does (``weights_only=False``, plain ``pickle``): a checkpoint can then
            run any code it names. Only for checkpoints whose writers you trust.

    Raises:
        ValueError: ``trust_checkpoint`` is not a bool (a truthy string must not switch the check off).
        UntrustedCheckpointError: from a load inside the context, naming the file and the global that it needs
            (before anything of it runs).
    """
    check_bool("trust_checkpoint", trust_checkpoint)
    return contextlib.nullcontext() if trust_checkpoint else restricted_checkpoint_loads()
