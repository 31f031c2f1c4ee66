"""0/1 Adam's two step schedules: ``T_v``, the steps that update Adam's variance, and ``T_u``, the steps at which
workers synchronize during the local-step phase (Lu et al., "Maximizing Communication Efficiency for Large-scale
Training via 0/1 Adam", ICLR 2023; the counters of DeepSpeed's ``ZeroOneAdam``).

Steps count from 1.

* Variance phase, ``t <= var_freeze_step``: every step synchronizes. The steps of ``T_v`` are ``k_1 = 1`` and
  ``k_{j+1} - k_j = 2 ** floor(j / var_update_scaler)``: the interval starts at 1 and doubles after every
  ``var_update_scaler`` variance updates (DeepSpeed's ``var_interval``/``var_counter``; the paper's kappa).
* Local-step phase, ``t > var_freeze_step``: the variance is frozen. Workers synchronize once ``local_step_interval``
  steps have passed since their last synchronization; the interval starts at 1 and doubles (capped at
  ``local_step_clipper``, the paper's ``H``) every ``local_step_scaler`` steps of this phase (DeepSpeed's
  ``local_step_interval``/``local_step_counter``).

DeepSpeed tests ``step % interval == 0`` against a global step counter whose first step only allocates buffers;
counting the steps since the last update instead gives the same spacings without the offset, and an interval that
grows between two synchronizations delays the next one rather than skipping it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

__all__ = ["ScheduledStep", "SchedulePlan", "ZeroOneSchedule"]


@dataclass(frozen=True)
class ScheduledStep:
    """What one optimizer step does.

    Attributes:
        step: the step's number, from 1.
        local: the step is in the local-step phase (variance frozen).
        enter_local: the step is the first of the local-step phase.
        update_variance: the step is in ``T_v`` (variance phase only).
        sync: the workers synchronize at this step (every step of the variance phase; ``T_u`` after it).
    """

    step: int
    local: bool
    enter_local: bool
    update_variance: bool
    sync: bool


@dataclass(frozen=True)
class SchedulePlan:
    """What a run of ``steps`` optimizer steps does under a schedule (see :meth:`ZeroOneSchedule.plan`).

    Attributes:
        steps: optimizer steps of the run.
        exact_steps: variance updates (all-reduces of the gradient: fp32, or with ZeroOneAdam's variance_codec).
        onebit_steps: variance-phase steps synchronized with 1 bit.
        local_syncs: 1-bit synchronizations of the local-step phase.
        local_steps: steps of the local-step phase (synchronized or not).
        first_local_step: the first step of the local-step phase (None: the variance never freezes).
        largest_interval: the largest synchronization interval reached (1 without local steps).
        interval_4_at: the first step at which the interval is at least 4 (None: never).
    """

    steps: int
    exact_steps: int
    onebit_steps: int
    local_syncs: int
    local_steps: int
    first_local_step: int | None
    largest_interval: int
    interval_4_at: int | None

    def ratio_vs_fp32(self, bits_per_element: float, variance_bits_per_element: float = 32.0,
                      stats_bits_per_element: float = 0.0) -> float:
        """DDP's fp32 all-reduce bytes over the run divided by 0/1 Adam's (both in the same ring convention).

        Args:
            bits_per_element: what a 1-bit synchronization sends (sign with one fp32 scale per 256 elements: 1.125).
            variance_bits_per_element: what a variance update sends (32: fp32; 8-bit symmetric with one fp32 scale
                per 256 elements: 8.125).
            stats_bits_per_element: what ``variance_rescale`` adds to every variance update and local-phase
                synchronization (one fp32 per bucket of 256: 0.125).
        """
        sent = (self.exact_steps * (variance_bits_per_element + stats_bits_per_element)
                + (self.onebit_steps + self.local_syncs) * bits_per_element
                + self.local_syncs * stats_bits_per_element) / 32
        return self.steps / sent


@dataclass
class ZeroOneSchedule:
    """The counters behind ``T_v`` and ``T_u`` (see the module docstring); :meth:`advance` once per step.

    Attributes:
        var_freeze_step: the last step of the variance phase.
        var_update_scaler: variance updates between two doublings of the variance interval.
        local_step_scaler: local-phase steps between two doublings of the synchronization interval.
        local_step_clipper: the largest synchronization interval.
        step: steps taken.
        var_interval: steps from one variance update to the next.
        var_counter: variance updates since the interval last doubled.
        next_var_step: the next step of ``T_v``.
        var_updates: variance updates so far (Adam's bias correction of the variance counts them).
        local_step_interval: steps from one synchronization to the next in the local-step phase.
        local_step_counter: local-phase steps since the interval last doubled.
        local_steps: local-phase steps since the last synchronization.
    """

    var_freeze_step: int
    var_update_scaler: int
    local_step_scaler: int
    local_step_clipper: int
    step: int = 0
    var_interval: int = 1
    var_counter: int = 0
    next_var_step: int = 1
    var_updates: int = 0
    local_step_interval: int = 1
    local_step_counter: int = 0
    local_steps: int = 0

    def advance(self) -> ScheduledStep:
        """Take the next step: what it does, with the counters moved on to the step after it."""
        self.step += 1
        t = self.step
        if t <= self.var_freeze_step:
            update = t == self.next_var_step
            if update:
                self.var_updates += 1
                self.var_counter += 1
                if self.var_counter == self.var_update_scaler:
                    self.var_counter = 0
                    self.var_interval *= 2
                self.next_var_step = t + self.var_interval
            return ScheduledStep(t, local=False, enter_local=False, update_variance=update, sync=True)
        self.local_steps += 1
        sync = self.local_steps >= self.local_step_interval
        if sync:
            self.local_steps = 0
        self.local_step_counter += 1
        if self.local_step_counter == self.local_step_scaler:
            self.local_step_counter = 0
            self.local_step_interval = min(self.local_step_clipper, 2 * self.local_step_interval)
        return ScheduledStep(t, local=True, enter_local=t == self.var_freeze_step + 1, update_variance=False,
                             sync=sync)

    def plan(self, steps: int) -> SchedulePlan:
        """What ``steps`` steps from the start do under these settings (the counters are not touched)."""
        fresh = ZeroOneSchedule(self.var_freeze_step, self.var_update_scaler, self.local_step_scaler,
                                self.local_step_clipper)
        exact = onebit = syncs = local = 0
        first_local = interval_4_at = None
        largest = 1
        for _ in range(steps):
            interval = fresh.local_step_interval
            step = fresh.advance()
            if not step.local:
                exact += step.update_variance
                onebit += not step.update_variance
                continue
            local += 1
            syncs += step.sync
            first_local = first_local or step.step
            largest = max(largest, interval)
            if interval >= 4 and interval_4_at is None:
                interval_4_at = step.step
        return SchedulePlan(steps, exact, onebit, syncs, local, first_local, largest, interval_4_at)

    @property
    def between_syncs(self) -> bool:
        """Local steps were taken since the last synchronization: the ranks' weights and momenta differ."""
        return self.local_steps > 0

    _SETTINGS = ("var_freeze_step", "var_update_scaler", "local_step_scaler", "local_step_clipper")

    def state_dict(self) -> dict[str, int]:
        """The counters (the four settings come from the optimizer's arguments)."""
        return {k: v for k, v in asdict(self).items() if k not in self._SETTINGS}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore :meth:`state_dict` output."""
        for f in fields(self):
            if f.name not in self._SETTINGS:
                setattr(self, f.name, int(state[f.name]))
