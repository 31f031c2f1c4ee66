"""The start-up clock's laps against a scripted ``perf_counter``."""

from composer_qsdp.recipes import startup
from composer_qsdp.recipes.startup import StartupClock


def test_laps_are_the_time_between_calls_and_a_repeated_phase_adds_up(monkeypatch):
    ticks = iter([10.0, 12.5, 13.0, 20.0, 20.25])
    monkeypatch.setattr(startup.time, "perf_counter", lambda: next(ticks))
    clock = StartupClock()  # 10.0
    clock.lap("recipe")  # 2.5
    clock.lap("process group")  # 0.5
    clock.lap("model")  # 7.0
    clock.lap("recipe")  # 0.25 more
    assert clock.laps == {"recipe": 2.75, "process group": 0.5, "model": 7.0}
    assert clock.total == 10.25
    assert clock.hyperparameters() == {"startup/recipe_s": 2.75, "startup/process_group_s": 0.5,
                                       "startup/model_s": 7.0, "startup/total_s": 10.25}
    assert clock.describe() == "start-up 10.2 s: recipe 2.8 s, process group 0.5 s, model 7.0 s"

