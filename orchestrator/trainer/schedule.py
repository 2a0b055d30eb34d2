"""Learning-rate schedules, stepped once per optimizer step (never per micro-step).

`lr_at` is a pure function of the step; `Plateau` is the one schedule with state: it lowers the rate when
the watched loss stops improving. Every schedule starts with a linear warmup when `warmup_steps` > 0.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any


def lr_at(step: int, cfg: Any, base_lr: float, max_steps: int, plateau_scale: float = 1.0) -> float:
    """Learning rate of optimizer step `step` (0-based). `cfg` is a train.schedule section."""
    # 1) linear warmup: step 0 gets base/warmup, step warmup-1 the full rate
    if step < cfg.warmup_steps:
        return base_lr * (step + 1) / cfg.warmup_steps
    # 2) after warmup, decay over the remaining steps (progress 0 -> 1)
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, max_steps - cfg.warmup_steps))
    if cfg.name == "constant":
        return base_lr
    if cfg.name == "linear":
        return cfg.min_lr + (base_lr - cfg.min_lr) * (1.0 - progress)
    if cfg.name == "cosine":
        return cfg.min_lr + (base_lr - cfg.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
    if cfg.name == "step":
        return base_lr * cfg.gamma ** (step // cfg.step_size)
    if cfg.name == "plateau":
        return max(cfg.min_lr, base_lr * plateau_scale)
    raise ValueError(f"unknown schedule {cfg.name!r}")


@dataclass
class Plateau:
    """ReduceLROnPlateau's rule (mode min, relative threshold, no cooldown) as a multiplier.

    A value counts as better when it is below best x (1 - threshold). After more than `patience`
    evaluations in a row that are not better, the scale is multiplied by `factor` and the count restarts.
    """

    factor: float
    patience: int
    threshold: float
    scale: float = 1.0
    best: float = math.inf
    bad_evals: int = 0

    def observe(self, loss: float) -> bool:
        """Record one evaluation's loss; True when this lowered the rate."""
        if loss < self.best * (1.0 - self.threshold):
            self.best, self.bad_evals = loss, 0
            return False
        self.bad_evals += 1
        if self.bad_evals > self.patience:
            self.scale *= self.factor
            self.bad_evals = 0
            return True
        return False


class Scheduler:
    """Writes `lr_at(step)` into the optimizer before each step; holds the plateau state for checkpoints."""

    def __init__(self, optimizer: Any, cfg: Any, base_lr: float, max_steps: int) -> None:
        self.optimizer, self.cfg, self.base_lr, self.max_steps = optimizer, cfg, base_lr, max_steps
        self.plateau = Plateau(cfg.factor, cfg.patience, cfg.threshold)

    def set_lr(self, step: int) -> float:
        lr = lr_at(step, self.cfg, self.base_lr, self.max_steps, self.plateau.scale)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def observe_loss(self, loss: float) -> bool:
        """Feed an evaluation loss to the plateau schedule (other schedules ignore it)."""
        return self.cfg.name == "plateau" and self.plateau.observe(loss)

    def state_dict(self) -> dict[str, Any]:
        return {"plateau": asdict(self.plateau), "max_steps": self.max_steps}

    def load_state_dict(self, state: dict[str, Any]) -> str | None:
        """Restore the plateau state; returns what changed when the checkpoint's run had another length."""
        self.plateau = Plateau(**state["plateau"])
        saved = state.get("max_steps")  # absent in checkpoints of earlier versions
        return None if saved is None else stretched(self.cfg, self.base_lr, self.max_steps, saved)


# The schedules whose rate at a step depends on max_steps: a longer (or shorter) run reshapes them.
DECAYS_OVER_MAX_STEPS = ("linear", "cosine")


def stretched(cfg: Any, base_lr: float, max_steps: int, saved_max_steps: int) -> str | None:
    """The line a resume prints when train.max_steps differs from the checkpoint's run and the schedule
    decays over it: the schedule is recomputed for the new length (the rate jumps), not kept as it was."""
    if cfg.name not in DECAYS_OVER_MAX_STEPS or saved_max_steps == max_steps:
        return None
    return (
        f"the {cfg.name} schedule now decays over {max_steps} steps, not the {saved_max_steps} of the run that "
        f"wrote the checkpoint (train.max_steps or --steps changed): the rate is recomputed for the new length"
    )
