"""``BucketStatistics``: the per-bucket statistics of ``ZeroOneAdam``'s ``variance_rescale``.

For each bucket ``b`` of the optimizer's flat layout it keeps ``q_b``, this rank's EMA of its per-bucket sums of
squared gradients since the last synchronization; ``e_b``, the EMA of the ranks' mean of those sums, shared by the
ranks; ``r_b``, its bias-corrected value when the variance was last written; and the ratio ``c_b / r_b`` (``c_b``
the current bias-corrected EMA) that scales the frozen variance, bounded to :data:`RESCALE_BOUNDS`. Every value the
ratio is computed from is all-reduced first, so the ranks' ratios stay bit-identical. The update rules are in
:mod:`composer_qsdp.optim.zero_one_adam`'s docstring.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from composer_qsdp.schemes import AllReduceScheme

__all__ = ["LOCAL_BUFFER", "RESCALE_BOUNDS", "SHARED_BUFFERS", "BucketStatistics"]

#: The buffers shared by the ranks: the EMA of the per-bucket sums of squared gradients, its bias-corrected value at
#: the last variance update, and the ratio of the two that scales the frozen variance.
SHARED_BUFFERS = ("grad_sq_ema", "grad_sq_ref", "grad_sq_ratio")
#: This rank's per-bucket sums of squared gradients since the last synchronization (differs by rank).
LOCAL_BUFFER = "grad_sq_local"
#: The bounds of the ratio: a hundredfold change of a bucket's squared gradients either way (a tenfold change of
#: ``sqrt(v)``, the step size), beyond which the ratio says more about the noise of a rarely touched bucket than
#: about the variance.
RESCALE_BOUNDS = (1e-2, 1e2)


class BucketStatistics:
    """The buffers of :data:`SHARED_BUFFERS` and :data:`LOCAL_BUFFER` over ``buckets`` buckets, and their updates.

    Args:
        buckets: buckets of the optimizer's flat layout.
        align: elements per bucket.
        device: where the buffers live (the parameters' device).
    """

    def __init__(self, buckets: int, align: int, device: torch.device) -> None:
        self.align = align
        self.buffers = {k: torch.zeros(buckets, device=device) for k in (*SHARED_BUFFERS, LOCAL_BUFFER)}
        self.reset()

    def reset(self) -> None:
        """Back to the start: zeros, and a ratio of 1."""
        for buffer in self.buffers.values():
            buffer.zero_()
        self.buffers["grad_sq_ratio"].fill_(1)

    def sums_of_squares(self, grads: torch.Tensor) -> torch.Tensor:
        """The sum of ``grads ** 2`` over each bucket of the flat ``grads``."""
        return grads.view(-1, self.align).square().sum(1)

    def accumulate(self, squares: torch.Tensor, parts: Iterable[tuple[float, slice]]) -> None:
        """Fold this step's per-bucket ``squares`` into the local accumulator and age the shared EMA by one step,
        with each part's ``beta2`` (``parts``: a parameter group's beta2 and its buckets): after a synchronization
        the EMA is the per-step EMA of the ranks' mean."""
        local, ema = self.buffers[LOCAL_BUFFER], self.buffers["grad_sq_ema"]
        for beta2, part in parts:
            local[part].mul_(beta2).add_(squares[part], alpha=1 - beta2)
            ema[part].mul_(beta2)

    def synchronize(self, step: int, update_variance: bool, parts: Iterable[tuple[float, slice]],
                    scheme: AllReduceScheme | None) -> None:
        """All-reduce the accumulated squares through ``scheme`` (None: one rank) into the shared EMA; on a variance
        update (``update_variance``) record its bias-corrected value at ``step`` as the reference of the variance
        just written; set the ratio that scales the frozen variance (1 where the reference is 0)."""
        local, b = self.buffers[LOCAL_BUFFER], self.buffers
        if scheme is not None:
            scheme.all_reduce(local, exact=True)
        b["grad_sq_ema"].add_(local)
        local.zero_()
        for beta2, part in parts:
            current = b["grad_sq_ema"][part] / (1 - beta2**step)
            ref = b["grad_sq_ref"][part]
            if update_variance:
                ref.copy_(current)
            ratio = torch.where(ref > 0, current / ref, 1.0).clamp_(*RESCALE_BOUNDS)
            b["grad_sq_ratio"][part].copy_(ratio)

    def element_ratio(self) -> torch.Tensor:
        """The ratio per element of the flat layout (each bucket's, repeated)."""
        return self.buffers["grad_sq_ratio"].repeat_interleave(self.align)
