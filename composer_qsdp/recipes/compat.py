"""The GPT harness's one private torch name: the default process group's rendezvous store.

When a collective times out, :mod:`composer_qsdp.recipes.train` has every rank that timed out report itself in the
store all ranks rendezvoused through, to name the silent ones. torch has no public reader for that store, and no
public way reaches it under every ``init_method`` (``env://``, ``file://``, ``tcp://``). Private torch names in
the package live in the FSDP adapters' compat modules (:mod:`composer_qsdp.fsdp2.compat`,
:mod:`composer_qsdp.fsdp1.compat`) and here; ``tests/test_private_access.py`` keeps it so.
"""

from __future__ import annotations

from torch.distributed import Store, distributed_c10d

__all__ = ["default_store"]


def default_store() -> Store:
    """The store of the default process group (served by rank 0 for TCP rendezvous).

    Raises:
        RuntimeError: no default process group is initialized.
    """
    return distributed_c10d._get_default_store()
