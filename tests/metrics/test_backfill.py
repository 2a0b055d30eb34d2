"""Dashboard panels and alert expressions on a backfilled TSDB: synthetic series of a 2-GPU, 2-rank job written
as OpenMetrics, turned into blocks by `promtool tsdb create-blocks-from openmetrics`, served by a real Prometheus.
The GPU series are synthetic because there is no GPU here. Deterministic: no scrape, no waiting."""

from __future__ import annotations

import math
import subprocess
import time

import pytest

from tests.conftest import require_tool
from tests.metrics.conftest import Prometheus, concrete, panel_queries, rule_groups

STEP = 15  # seconds between samples
POINTS = 60  # 15 minutes
HOST = "node-a"
GPUS = {"0": "GPU-aaaaaaaa-0000-0000-0000-000000000000", "1": "GPU-bbbbbbbb-1111-1111-1111-111111111111"}


def _labels(**labels) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def openmetrics(end: int) -> str:
    """A healthy-looking job `bf` (with an idle GPU, a full GPU, a NaN loss at the end, 20% skipped fp16 steps and
    50% data wait) and a job `bf-stalled` whose last step was 12 minutes before `end`."""
    times = [end - STEP * (POINTS - 1 - i) for i in range(POINTS)]
    families: dict[str, tuple[str, list[str]]] = {}

    def add(name, kind, labels, value_at):
        lines = families.setdefault(name, (kind, []))[1]
        for i, t in enumerate(times):
            value = value_at(i, t)
            if value is not None:
                lines.append(f"{name}{'_total' if kind == 'counter' else ''}{_labels(**labels)} {value} {t}")

    for job in ("bf", "bf-stalled"):
        for rank in ("0", "1"):
            r = dict(job=job, rank=rank, local_rank=rank, node_rank="0")
            stalled_at = POINTS - 1 - (12 * 60) // STEP if job == "bf-stalled" else POINTS

            def steps(i, stalled_at=stalled_at):
                return min(i, stalled_at) * 30  # 2 steps/s

            add("orch_train_step", "gauge", r, lambda i, t, f=steps: f(i))
            add("orch_train_optimizer_steps", "counter", r, lambda i, t, f=steps: f(i))
            add("orch_train_samples", "counter", r, lambda i, t, f=steps: f(i) * 64)
            add("orch_train_tokens", "counter", r, lambda i, t, f=steps: f(i) * 64 * 256)
            add("orch_train_amp_skipped_steps", "counter", r, lambda i, t, f=steps: f(i) // 5)
            add("orch_train_flops", "counter", r, lambda i, t, f=steps: f(i) * 1e14)
            add("orch_train_data_wait_seconds", "counter", r, lambda i, t, f=steps: f(i) * 0.25)
            add(
                "orch_train_last_step_timestamp_seconds",
                "gauge",
                r,
                lambda i, t, s=stalled_at: times[min(i, s)],
            )
            nan_end = job == "bf" and rank == "0"
            add(
                "orch_train_loss",
                "gauge",
                r,
                lambda i, t, n=nan_end: "NaN" if n and i >= POINTS - 2 else 3.0 / (1 + i),
            )
            add("orch_train_step_ready_seconds", "gauge", r, lambda i, t: 0.2)
            add("orch_train_learning_rate", "gauge", r, lambda i, t: 3e-4)
            add("orch_train_grad_norm", "gauge", r, lambda i, t: 1.0 + 0.01 * i)
            add("orch_train_amp_loss_scale", "gauge", r, lambda i, t: 65536.0)
            add("orch_train_mfu_ratio", "gauge", r, lambda i, t: 0.1)
            add("orch_train_peak_flops", "gauge", r, lambda i, t: 989e12)
            add("orch_train_elastic_restarts", "gauge", r, lambda i, t: 1)
            add("orch_goodput_ratio", "gauge", r, lambda i, t: 0.8)
            for cause, share in (("unproductive_checkpoint_save_time", 0.05), ("data_loading_sync", 0.15)):
                add(
                    "orch_badput_seconds", "counter", dict(r, cause=cause), lambda i, t, s=share: i * STEP * s
                )
            add("orch_torch_cuda_memory_allocated_bytes", "gauge", r, lambda i, t: 30e9)
            add("orch_torch_cuda_memory_reserved_bytes", "gauge", r, lambda i, t: 40e9)
            add("orch_torch_cuda_memory_peak_allocated_bytes", "gauge", r, lambda i, t: 35e9)
            add("orch_torch_cuda_alloc_retries", "counter", r, lambda i, t: i // 10)
            add("orch_torch_cuda_ooms", "counter", r, lambda i, t: 0)
            add(
                "orch_rank_info",
                "gauge",
                dict(r, hostname=HOST, device=f"cuda:{rank}", gpu_uuid=GPUS[rank]),
                lambda i, t: 1,
            )
            # step time: every step 0.5 s -> all in the (0.4, 0.6] bucket
            name = "orch_train_step_duration_seconds"
            lines = families.setdefault(name, ("histogram", []))[1]
            for i, t in enumerate(times):
                n = steps(i)
                for le in ("0.4", "0.6", "+Inf"):
                    lines.append(f"{name}_bucket{_labels(**r, le=le)} {0 if le == '0.4' else n} {t}")
                lines.append(f"{name}_sum{_labels(**r)} {n * 0.5} {t}")
                lines.append(f"{name}_count{_labels(**r)} {n} {t}")

        for gpu, uuid in GPUS.items():
            g = dict(job=job, node_rank="0", hostname=HOST, gpu=gpu, gpu_uuid=uuid)
            idle = gpu == "1"
            add(
                "orch_gpu_info",
                "gauge",
                dict(g, name="NVIDIA H100 80GB HBM3", driver_version="550"),
                lambda i, t: 1,
            )
            add("orch_gpu_utilization_ratio", "gauge", g, lambda i, t, idle=idle: 0.0 if idle else 0.93)
            add("orch_gpu_memory_used_bytes", "gauge", g, lambda i, t, idle=idle: 1e9 if idle else 78e9)
            add("orch_gpu_memory_total_bytes", "gauge", g, lambda i, t: 80e9)
            add("orch_gpu_power_watts", "gauge", g, lambda i, t, idle=idle: 70.0 if idle else 640.0)
            add("orch_gpu_temperature_celsius", "gauge", g, lambda i, t: 60.0)
            add("orch_gpu_sm_clock_hertz", "gauge", g, lambda i, t: 1.755e9)
            add("orch_gpu_pcie_tx_bytes_per_second", "gauge", g, lambda i, t: 1e9)
            add("orch_gpu_pcie_rx_bytes_per_second", "gauge", g, lambda i, t: 2e9)
            add("orch_gpu_energy_joules", "counter", g, lambda i, t: 1e6 + 640 * STEP * i)
            for reason in ("gpu_idle", "sw_power_cap", "hw_slowdown"):
                held = (reason == "gpu_idle") == idle and reason != "hw_slowdown"
                add(
                    "orch_gpu_clock_event_active",
                    "gauge",
                    dict(g, reason=reason),
                    lambda i, t, h=held: int(h),
                )

    out = []
    for name, (kind, lines) in families.items():
        out += [f"# TYPE {name} {kind}", *lines]
    return "\n".join(out) + "\n# EOF\n"


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory):
    promtool, prometheus = require_tool("promtool"), require_tool("prometheus")
    tmp = tmp_path_factory.mktemp("backfill")
    end = (int(time.time()) // 3600 - 3) * 3600  # well before the head block
    (tmp / "series.om").write_text(openmetrics(end))
    create = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(tmp / "series.om"), str(tmp / "data")],
        capture_output=True,
        text=True,
    )
    assert create.returncode == 0, create.stdout + create.stderr
    server = Prometheus(prometheus, tmp / "server", {"scrape_configs": []}, storage=tmp / "data")
    yield server, end
    server.stop()


@pytest.mark.parametrize(("row", "title", "expr"), panel_queries())
def test_panel_has_data(backfilled, row, title, expr):
    prom, end = backfilled
    result = prom.query_range(
        concrete(expr, job="bf", rate_interval="1m"), end - STEP * (POINTS - 1), end, STEP
    )
    values = [float(v) for s in result for _, v in s["values"]]
    assert any(math.isfinite(v) for v in values), f"{title}: {concrete(expr, job='bf')} -> {result}"


EXPECTED_ALERTS = {  # alert -> label sets (subset) its expression returns at the end of the synthetic data
    "OrchGpuIdle": [{"job": "bf", "gpu": "1"}, {"job": "bf-stalled", "gpu": "1"}],
    "OrchTrainingStalled": [{"job": "bf-stalled"}],
    "OrchNonFiniteLoss": [{"job": "bf"}],  # one per job, not per rank
    "OrchStraggler": [],  # the ranks reach the reduction together
    "OrchAmpSkippedSteps": [{"job": "bf"}],
    "OrchGpuMemoryNearlyFull": [{"job": "bf", "gpu": "0"}, {"job": "bf-stalled", "gpu": "0"}],
    "OrchInputBound": [{"job": "bf"}],
}


@pytest.mark.parametrize("alert", sorted(EXPECTED_ALERTS))
def test_alert_expression_fires_on_synthetic_series(backfilled, alert):
    prom, end = backfilled
    rule = next(r for g in rule_groups()["groups"] for r in g["rules"] if r.get("alert") == alert)
    result = prom.query(rule["expr"], at=end)
    got = sorted((s["metric"] for s in result), key=lambda m: (m.get("job", ""), m.get("gpu", "")))
    expected = EXPECTED_ALERTS[alert]
    assert len(got) == len(expected), f"{alert}: {got}"
    for labels, want in zip(got, expected, strict=True):
        assert want.items() <= labels.items(), f"{alert}: {got}"
