"""Learning rates at chosen steps, per schedule, as tables (torchtitan's style)."""

from __future__ import annotations

import math

import pytest
import torch

from orchestrator.trainer.config import ScheduleSpec
from orchestrator.trainer.schedule import Plateau, Scheduler, lr_at

BASE = 1.0
MAX_STEPS = 100


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [
        # name, warmup, ...: {step: lr}
        ({"name": "constant"}, {0: 1.0, 50: 1.0, 99: 1.0}),
        ({"name": "constant", "warmup_steps": 4}, {0: 0.25, 1: 0.5, 3: 1.0, 4: 1.0, 99: 1.0}),
        ({"name": "linear", "min_lr": 0.0}, {0: 1.0, 25: 0.75, 50: 0.5, 100: 0.0}),
        (
            {"name": "linear", "warmup_steps": 10, "min_lr": 0.1},
            {0: 0.1, 9: 1.0, 10: 1.0, 55: 0.55, 100: 0.1},
        ),
        ({"name": "cosine", "min_lr": 0.0}, {0: 1.0, 50: 0.5, 100: 0.0, 150: 0.0}),
        (
            {"name": "cosine", "warmup_steps": 20, "min_lr": 0.2},
            {0: 0.05, 19: 1.0, 20: 1.0, 60: 0.6, 100: 0.2},
        ),
        ({"name": "step", "step_size": 30, "gamma": 0.1}, {0: 1.0, 29: 1.0, 30: 0.1, 60: 0.01, 99: 0.001}),
        ({"name": "step", "step_size": 30, "gamma": 0.5, "warmup_steps": 2}, {0: 0.5, 1: 1.0, 30: 0.5}),
        ({"name": "plateau", "warmup_steps": 5}, {0: 0.2, 4: 1.0, 99: 1.0}),
    ],
)
def test_lr_table(schedule, expected):
    cfg = ScheduleSpec(**schedule)
    actual = {step: lr_at(step, cfg, BASE, MAX_STEPS) for step in expected}
    assert actual == pytest.approx(expected, abs=1e-12)


def test_cosine_is_halfway_between_at_a_quarter_turn():
    cfg = ScheduleSpec(name="cosine", min_lr=0.0)
    assert lr_at(25, cfg, 2.0, MAX_STEPS) == pytest.approx(1.0 + math.cos(math.pi / 4))


def test_plateau_reduces_after_patience_non_improving_evals():
    plateau = Plateau(factor=0.5, patience=2, threshold=0.01)
    losses = [1.0, 0.9, 0.895, 0.9, 0.95, 0.8, 0.85, 0.85, 0.85, 0.85, 0.85, 0.85]
    # 0.895 is not 1% better than 0.9: the first bad eval; the third bad in a row reduces (patience 2).
    expected_reduced = [False, False, False, False, True, False, False, False, True, False, False, True]
    reduced = [plateau.observe(loss) for loss in losses]
    assert reduced == expected_reduced
    assert plateau.scale == 0.125


def test_plateau_schedule_floors_at_min_lr_and_round_trips_its_state():
    import torch

    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=1.0)
    cfg = ScheduleSpec(name="plateau", patience=0, factor=0.1, min_lr=0.05)
    scheduler = Scheduler(optimizer, cfg, 1.0, MAX_STEPS)
    scheduler.observe_loss(1.0)
    assert scheduler.observe_loss(2.0) and scheduler.set_lr(10) == pytest.approx(0.1)
    assert scheduler.observe_loss(2.0) and scheduler.set_lr(11) == 0.05  # 0.01 is below min_lr
    assert optimizer.param_groups[0]["lr"] == 0.05
    restored = Scheduler(optimizer, cfg, 1.0, MAX_STEPS)
    restored.load_state_dict(scheduler.state_dict())
    assert restored.plateau == scheduler.plateau


def test_other_schedules_ignore_the_loss():
    import torch

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = Scheduler(optimizer, ScheduleSpec(name="cosine", patience=0), 1.0, MAX_STEPS)
    assert not any(scheduler.observe_loss(loss) for loss in [1.0, 2.0, 3.0, 4.0])
    assert scheduler.set_lr(0) == 1.0


@pytest.mark.parametrize("name", ["linear", "cosine"])
def test_a_resume_with_another_length_says_the_schedule_is_recomputed(name):
    """#24.3: extending a run (--steps 100 after 60) reshapes a decaying schedule; the resume says so."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    cfg = ScheduleSpec(name=name)
    saved = Scheduler(optimizer, cfg, 1.0, 60).state_dict()
    assert Scheduler(optimizer, cfg, 1.0, 60).load_state_dict(saved) is None
    note = Scheduler(optimizer, cfg, 1.0, 100).load_state_dict(saved)
    assert note == (
        f"the {name} schedule now decays over 100 steps, not the 60 of the run that wrote the checkpoint "
        "(train.max_steps or --steps changed): the rate is recomputed for the new length"
    )


@pytest.mark.parametrize("name", ["constant", "step", "plateau"])
def test_schedules_that_ignore_max_steps_resume_without_a_note(name):
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    saved = Scheduler(optimizer, ScheduleSpec(name=name), 1.0, 60).state_dict()
    assert Scheduler(optimizer, ScheduleSpec(name=name), 1.0, 100).load_state_dict(saved) is None
    assert (
        Scheduler(optimizer, ScheduleSpec(name=name), 1.0, 100).load_state_dict({"plateau": saved["plateau"]})
        is None
    )
