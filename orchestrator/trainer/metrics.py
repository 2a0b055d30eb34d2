"""Prometheus exporter for the trainer (placeholder with the agreed interface; the metrics work replaces it).

The trainer calls only what is below. `build_metrics` returns a NullMetrics when metrics are off.
"""

from __future__ import annotations


class NullMetrics:
    """Metrics that do nothing: used when metrics are disabled (no branches in the loop)."""

    def on_step(self, *, step: int, samples: int, tokens: int = 0, loss: float | None = None,
                lr: float | None = None, grad_norm: float | None = None, step_seconds: float = 0.0,
                data_wait_seconds: float = 0.0, loss_scale: float | None = None, skipped: bool = False,
                flops: float | None = None) -> None:
        pass

    def set_restart_count(self, count: int) -> None:
        pass

    def close(self) -> None:
        pass


def build_metrics(*, enabled: bool, job: str, rank: int, local_rank: int, node_rank: int,
                  local_world_size: int, port: int, device: str) -> NullMetrics:
    return NullMetrics()
