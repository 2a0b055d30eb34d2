"""Tasks: what to train. A task is a factory `make(**task_args) -> Task`; see docs/tasks.md.

Built-ins are looked up by name; anything else is an import path `package.module:factory`.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from orchestrator.trainer.config import BUILTIN_TASKS

# The batch a DataLoader yields from the datasets is `(inputs, targets)`; the trainer calls
# `outputs = model(inputs)` and `loss_fn(outputs, targets)`.
LossFn = Callable[[Any, torch.Tensor], torch.Tensor]
MetricFn = Callable[[Any, torch.Tensor], dict[str, float]]
# on_log(step, metrics) / on_eval(step, results): the task's own numbers, or None.
Hook = Callable[[int, dict[str, float]], "dict[str, float] | None"]


def no_extra_metrics(step: int, metrics: dict[str, float]) -> dict[str, float] | None:
    """The default hook: the task adds nothing."""
    return None


@dataclass
class Task:
    """Everything the trainer needs to know about one training problem."""

    model: nn.Module
    train_dataset: Dataset
    loss_fn: LossFn
    """Mean loss of one micro-batch (a scalar tensor); the trainer divides it by the accumulation."""
    eval_dataset: Dataset | None = None
    eval_metrics: MetricFn | None = None
    """Per-batch means, e.g. {"accuracy": 0.97}; the trainer weights them by batch size over the eval set."""
    flops_per_sample: float | None = None
    """Training FLOPs (forward + backward) of one sample, for MFU. None: not reported."""
    tokens_per_sample: int | None = None
    """Tokens in one sample (language models), for tokens/s. None: not reported."""
    shard_units: list[nn.Module] | None = None
    """`train.parallel: fsdp`: the submodules of `model` sharded (and gathered) as one unit each, e.g.
    the transformer blocks; the root takes the rest. None: each direct child module with parameters."""
    on_log: Hook = no_extra_metrics
    """Called on every rank at each log step with the step and orch's numbers of it (loss, lr, grad_norm,
    samples_per_second); returns extra scalars, e.g. {"perplexity": 12.3}, or None. They go wherever orch's
    go: the log line, Prometheus (orch_task_metric), MLflow and TensorBoard (as train/NAME)."""
    on_eval: Hook = no_extra_metrics
    """Called on every rank after each evaluation with the step and its results; returns extra scalars (added
    to the evaluation's results: log line, summary.json, MLflow and TensorBoard as eval/NAME), or None."""


# The names job.yaml accepts (checked by the spec) are the modules of this package, each with a `make`.
BUILTIN = {name: f"orchestrator.trainer.tasks.{name}:make" for name in BUILTIN_TASKS}


def build_task(name: str, task_args: dict[str, Any]) -> Task:
    """Import the task's factory and call it with `task_args` as keyword arguments."""
    module_name, _, attribute = BUILTIN.get(name, name).partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"train.task {name!r}: cannot import {module_name}:{attribute} ({error})") from error
    try:
        inspect.signature(factory).bind(**task_args)
    except TypeError as error:
        raise ValueError(f"train.task_args do not fit task {name!r}: {error}") from error
    task = factory(**task_args)
    if not isinstance(task, Task):
        raise ValueError(
            f"train.task {name!r} returned {type(task).__name__}, not orchestrator.trainer.tasks.Task"
        )
    return task


def accuracy(logits: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """Share of samples whose highest logit is the target class."""
    return {"accuracy": (logits.argmax(dim=-1) == targets).float().mean().item()}
