"""Single-process float64 references of 0/1 Adam for the tests: the two-phase 1-bit all-reduce with worker and
server error feedback over ``W`` simulated ranks, and the paper's update (Lu et al., ICLR 2023, as DeepSpeed's
``ZeroOneAdam`` computes it) with its two schedules written from their closed forms.

Written from the algorithm's description, independently of the package's code: only the layout is a convention
the two share: each rank's chunk holds ``ceil(n / W)`` elements rounded up to whole buckets and to 8, and an
optimizer's flat vector starts every parameter on a bucket, leaving gaps that carry no data.
"""

from __future__ import annotations

import math

import torch

F64 = torch.float64


def chunk_numel(numel: int, world: int, bucket: int | None) -> int:
    align = 8 if bucket is None else math.lcm(8, bucket)
    return -(-(-(-numel // world)) // align) * align


def sign_compress(x: torch.Tensor, bucket: int) -> torch.Tensor:
    """Per bucket of the 1-D ``x``: ``||b||_2 / sqrt(len(b)) * sign(b)`` with ``sign(0) = +1``."""
    out = torch.empty_like(x)
    for start in range(0, x.numel(), bucket):
        b = x[start : start + bucket]
        scale = b.norm() / b.numel() ** 0.5
        out[start : start + bucket] = torch.where(b >= 0, scale, -scale)
    return out


class OneBitAllReduce:
    """DeepSpeed's compressed all-reduce of ``W`` ranks' 1-D tensors of ``numel`` elements, in float64, with every
    rank's worker error (``[W, W * c]``) and server error (``[W, c]``); ``bucket=None`` sends exact values. Elements
    outside ``valid`` (and the padding) are ignored, returned as zeros and never carry error."""

    def __init__(self, numel: int, world: int, bucket: int | None, valid: torch.Tensor | None = None) -> None:
        self.numel, self.world, self.bucket = numel, world, bucket
        self.chunk = chunk_numel(numel, world, bucket)
        self.worker = torch.zeros(world, world * self.chunk, dtype=F64)
        self.server = torch.zeros(world, self.chunk, dtype=F64)
        self.valid = torch.zeros(world * self.chunk, dtype=torch.bool)
        self.valid[:numel] = True if valid is None else valid

    def _compress(self, x: torch.Tensor) -> torch.Tensor:
        return x.clone() if self.bucket is None else sign_compress(x, self.bucket)

    def reset(self) -> None:
        self.worker.zero_()
        self.server.zero_()

    def __call__(self, tensors: list[torch.Tensor], valid: torch.Tensor | None = None) -> torch.Tensor:
        """The mean of the ranks' ``tensors``; ``valid`` further restricts the elements that carry data."""
        w, c = self.world, self.chunk
        saved, self.valid = self.valid, self.valid.clone()
        if valid is not None:
            self.valid[: self.numel] &= valid
        try:
            return self._reduce(tensors)
        finally:
            self.valid = saved

    def _reduce(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        w, c = self.world, self.chunk
        decoded = torch.empty(w, w * c, dtype=F64)
        for rank in range(w):
            buf = torch.zeros(w * c, dtype=F64)
            buf[: self.numel] = tensors[rank].to(F64)
            buf = torch.where(self.valid, buf + self.worker[rank], 0.0)
            decoded[rank] = torch.cat([self._compress(part) for part in buf.split(c)])
            self.worker[rank] = torch.where(self.valid, buf - decoded[rank], 0.0)
        full = torch.empty(w * c, dtype=F64)
        for server in range(w):
            part = slice(server * c, (server + 1) * c)
            served = torch.where(self.valid[part], decoded[:, part].mean(0), 0.0) + self.server[server]
            full[part] = self._compress(served)
            self.server[server] = torch.where(self.valid[part], served - full[part], 0.0)
        return torch.where(self.valid, full, 0.0)[: self.numel]


def variance_steps(var_freeze_step: int, kappa: int) -> set[int]:
    """``T_v``: ``k_1 = 1``, ``k_{j+1} - k_j = 2 ** floor(j / kappa)``, up to ``var_freeze_step``."""
    steps, k, j = set(), 1, 1
    while k <= var_freeze_step:
        steps.add(k)
        k += 2 ** (j // kappa)
        j += 1
    return steps


def local_interval(i: int, alpha: int, clipper: int) -> int:
    """The synchronization interval in force at the ``i``-th step (from 1) of the local-step phase: it doubles
    after every ``alpha`` steps of the phase, up to ``clipper``."""
    return min(clipper, 2 ** ((i - 1) // alpha))


class ZeroOneAdamReference:
    """0/1 Adam for ``W`` simulated ranks over one flat float64 vector split into parameter groups.

    Args:
        x0: the initial flat parameters (every rank starts from them), the parameters back to back.
        groups: per group ``(sizes, lr, betas, eps, weight_decay, bias_correction)``, ``sizes`` the element counts of
            its parameters; ``lr`` is read at each step from ``step(..., lrs)``.
        world: ranks.
        bucket: the sign codec's bucket, or None for exact means. Communication runs on the padded layout where
            every parameter starts on a bucket.
        var_freeze_step, var_update_scaler, local_step_scaler, local_step_clipper: 0/1 Adam's settings.
    """

    def __init__(self, x0: torch.Tensor, groups: list[tuple], world: int, bucket: int | None, var_freeze_step: int,
                 var_update_scaler: int, local_step_scaler: int, local_step_clipper: int) -> None:
        n = x0.numel()
        self.groups, self.world = [(sum(g[0]), *g[1:]) for g in groups], world
        self.x = [x0.to(F64).clone() for _ in range(world)]
        self.m = [torch.zeros(n, dtype=F64) for _ in range(world)]
        self.v = torch.zeros(n, dtype=F64)
        self.u = [torch.zeros(n, dtype=F64) for _ in range(world)]
        self.lr_sums = [0.0] * len(groups)
        align, offset, positions = bucket or 1, 0, []
        for size in (size for g in groups for size in g[0]):
            positions.append(torch.arange(offset, offset + size))
            offset += -(-size // align) * align
        self.positions = torch.cat(positions)
        valid = torch.zeros(offset, dtype=torch.bool)
        valid[self.positions] = True
        self.comm = OneBitAllReduce(offset, world, bucket, valid)
        self.freeze, self.alpha, self.clipper = var_freeze_step, local_step_scaler, local_step_clipper
        self.t_v = variance_steps(var_freeze_step, var_update_scaler)
        self.t = 0
        self.last_sync = 0  # local-phase step index of the last synchronization

    def _communicate(self, dense: list[torch.Tensor], valid: torch.Tensor) -> torch.Tensor:
        """The compressed mean of the ranks' dense vectors over the ``valid`` elements, sent in the padded layout."""
        padded, padded_valid = [], torch.zeros(self.comm.numel, dtype=torch.bool)
        padded_valid[self.positions] = valid
        for x in dense:
            p = torch.zeros(self.comm.numel, dtype=F64)
            p[self.positions] = x
            padded.append(p)
        return self.comm(padded, padded_valid)[self.positions]

    def _parts(self):
        start = 0
        for index, (numel, *_rest) in enumerate(self.groups):
            yield index, slice(start, start + numel), self.groups[index]
            start += numel

    def _denom(self, group: tuple) -> torch.Tensor:
        _, _, (_, b2), eps, _, bias_correction = group
        n_v = sum(1 for k in self.t_v if k <= min(self.t, self.freeze))
        v = self.v / (1 - b2**n_v) if bias_correction else self.v
        return v.sqrt() + eps

    def step(self, grads: list[torch.Tensor], lrs: list[float]) -> None:
        """One step with each rank's flat gradient and each group's learning rate."""
        self.t += 1
        t = self.t
        grads = [g.to(F64) for g in grads]
        local = t > self.freeze
        exact = not local and t in self.t_v
        if not exact:
            # An element whose variance is zero ignores its gradient and is left out of the synchronizations.
            grads = [torch.where(self.v == 0, 0.0, g) for g in grads]
        if not local and exact:
            grads = [torch.stack(grads).mean(0)] * self.world
        elif not local:
            # 1-bit steps send g / (sqrt(v) + eps), with the variance of the last update.
            denom = torch.cat([self._denom(group)[part] for _, part, group in self._parts()])
            grads = [self._communicate([g / denom for g in grads], self.v != 0) * denom] * self.world
        elif t == self.freeze + 1:
            self.comm.reset()
        denoms = {}
        for index, part, group in self._parts():
            _, _, (b1, b2), _, wd, bias_correction = group
            if exact:
                self.v[part] = b2 * self.v[part] + (1 - b2) * grads[0][part] ** 2
            denoms[index] = self._denom(group)[part]
            corr1 = 1 - b1**t if bias_correction else 1.0
            for r in range(self.world):
                self.m[r][part] = b1 * self.m[r][part] + (1 - b1) * grads[r][part]
                # Adam's own bound on |m_hat / (sqrt(v_hat) + eps)| when v is current: sqrt((1-b1)/(1-b2)).
                bound = max(1.0, math.sqrt((1 - b1) / (1 - b2)))
                update = (self.m[r][part] / corr1 / denoms[index]).clamp(-bound, bound) + wd * self.x[r][part]
                update = torch.where(self.v[part] == 0, 0.0, update)  # no variance: the element does not move
                self.x[r][part] -= lrs[index] * update
                if local:
                    self.u[r][part] -= lrs[index] * update
            if local:
                self.lr_sums[index] += lrs[index]
        if not local:
            return
        i = t - self.freeze
        if i - self.last_sync < local_interval(i, self.alpha, self.clipper):
            return
        self.last_sync = i
        for r in range(self.world):
            self.x[r] = self.x[r] - self.u[r]
        mean = self._communicate(self.u, self.v != 0)  # the accumulated updates themselves (preconditioned)
        for index, part, group in self._parts():
            b1 = group[2][0]
            corr1 = 1 - b1**t if group[5] else 1.0
            for r in range(self.world):
                if self.lr_sums[index] > 0:
                    self.m[r][part] = -mean[part] * denoms[index] / self.lr_sums[index] * corr1
                self.x[r][part] += mean[part]
            self.lr_sums[index] = 0.0
        for r in range(self.world):
            self.u[r].zero_()
