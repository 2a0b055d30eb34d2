"""`orch top` past a screen of ranks (#22): the summary, the spread and the worst ranks, computed by a real
Prometheus in PromQL over a backfilled 64-rank job (8 nodes x 8 GPUs) with one straggler and one rank that
stopped first. Also: `--local` refuses an endpoint that serves another job's metrics (#24)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from orchestrator import top
from orchestrator.commands import tables
from tests.conftest import require_tool
from tests.metrics.conftest import REPO, Prometheus
from tests.metrics.test_top_answers import answering  # noqa: F401 (a fixture)

STEP, POINTS, NODES, GPUS = 15, 40, 8, 8
STRAGGLER, STOPPED = 37, 12


def openmetrics(end: int) -> str:
    times = [end - STEP * (POINTS - 1 - i) for i in range(POINTS)]
    families: dict[str, tuple[str, list[str]]] = {}

    def add(name: str, kind: str, labels: dict[str, str], value_at) -> None:  # type: ignore[no-untyped-def]
        lines = families.setdefault(name, (kind, []))[1]
        text = "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
        for i, t in enumerate(times):
            lines.append(f"{name}{'_total' if kind == 'counter' else ''}{text} {value_at(i, t)} {t}")

    for node in range(NODES):
        for local in range(GPUS):
            rank = node * GPUS + local
            r = {"job": "big", "rank": str(rank), "local_rank": str(local), "node_rank": str(node),
                 "pod": f"big-node-0-{node}-abcde"}  # fmt: skip
            uuid = f"GPU-{rank:04d}"
            last = POINTS - 1 - (8 if rank == STOPPED else 0)  # rank 12 stopped two minutes before the rest
            add("orch_train_step", "gauge", r, lambda i, t, last=last: min(i, last) * 10)
            add("orch_train_samples", "counter", r, lambda i, t, last=last: min(i, last) * 10 * 32)
            add("orch_train_last_step_timestamp_seconds", "gauge", r,
                lambda i, t, last=last: times[min(i, last)])  # fmt: skip
            add("orch_train_last_step_seconds", "gauge", r, lambda i, t: 1.5)
            add("orch_train_step_ready_seconds", "gauge", r,
                lambda i, t, rank=rank: 0.9 if rank == STRAGGLER else 0.2 + 0.001 * (rank % 3))  # fmt: skip
            add("orch_train_mfu_ratio", "gauge", r, lambda i, t: 0.4)
            add("orch_rank_info", "gauge", dict(r, hostname=f"gpu-node-{node}", device=f"cuda:{local}",
                                               gpu_uuid=uuid), lambda i, t: 1)  # fmt: skip
            g = {"job": "big", "node_rank": str(node), "hostname": f"gpu-node-{node}", "gpu": str(local),
                 "gpu_uuid": uuid}  # fmt: skip
            add(
                "orch_gpu_utilization_ratio",
                "gauge",
                g,
                lambda i, t, rank=rank: 0.3 if rank == STRAGGLER else 0.95,
            )
            add("orch_gpu_memory_used_bytes", "gauge", g, lambda i, t: 70e9)
    out = []
    for name, (kind, lines) in families.items():
        out += [f"# TYPE {name} {kind}", *lines]
    return "\n".join(out) + "\n# EOF\n"


@pytest.fixture(scope="module")
def big_job(tmp_path_factory):
    promtool, prometheus = require_tool("promtool"), require_tool("prometheus")
    tmp = tmp_path_factory.mktemp("top-scale")
    end = (int(time.time()) // 3600 - 3) * 3600  # well before the head block
    (tmp / "series.om").write_text(openmetrics(end))
    create = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(tmp / "series.om"), str(tmp / "data")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert create.returncode == 0, create.stdout + create.stderr
    server = Prometheus(prometheus, tmp / "server", {"scrape_configs": []}, storage=tmp / "data")
    yield server, end
    server.stop()


def test_summary_spread_and_worst_ranks_from_promql(big_job):
    prom, end = big_job
    summary = top.summary_from_prometheus(prom.url, "big", worst=3, at=end)
    assert summary.ranks == 64 and summary.step == (POINTS - 1) * 10
    assert summary.mfu == pytest.approx(0.4)
    assert summary.memory_used_bytes == pytest.approx(64 * 70e9)
    ready = summary.spread["ready_seconds"]
    assert (ready.min, ready.median, ready.max) == (
        pytest.approx(0.2),
        pytest.approx(0.201),
        pytest.approx(0.9),
    )
    utilization = summary.spread["gpu_utilization"]
    assert (utilization.min, utilization.max) == (pytest.approx(0.3), pytest.approx(0.95))
    assert summary.spread["since_last_step_seconds"].max == pytest.approx(8 * STEP)
    straggler = summary.slowest[0]
    assert (straggler.rank, straggler.node_rank, straggler.hostname, straggler.pod) == (
        str(STRAGGLER),
        "4",
        "gpu-node-4",
        "big-node-0-4-abcde",
    )
    assert len(summary.slowest) == 3 and summary.stopped[0].rank == str(STOPPED)
    shown = tables.format_summary(summary)
    assert shown.startswith("job big: 64 ranks, step 390, ")
    assert "time to reduction (s)  0.200  0.201   0.900" in shown
    assert f"{STRAGGLER}    4     big-node-0-4-abcde  gpu-node-4  0.900" in shown
    assert "orch top big --all" in shown


def test_the_summary_asks_prometheus_for_aggregates_not_every_series(big_job, monkeypatch):
    prom, end = big_job
    asked: list[str] = []
    query = top._prometheus_query

    def counting(base, expr, timeout, at=None):  # type: ignore[no-untyped-def]
        samples = query(base, expr, timeout, at)
        asked.append(expr)
        assert len(samples) <= 5, f"{expr} returned {len(samples)} series"
        return samples

    monkeypatch.setattr(top, "_prometheus_query", counting)
    top.summary_from_prometheus(prom.url, "big", worst=5, at=end)
    assert len(asked) <= 25  # a fixed number of queries, whatever the number of ranks


def test_top_local_refuses_another_jobs_metrics(answering):  # noqa: F811 (the fixture)
    url = answering(
        '# TYPE orch_train_step gauge\norch_train_step{job="someone-else",rank="0"} 5\n', "text/plain"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator", "top", "mine", "--exporter", f"{url}/metrics", "--once"],
        cwd=REPO, env=clean, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1
    assert "serves the metrics of someone-else, not of job mine" in result.stderr


def test_status_names_the_straggler(big_job):
    prom, end = big_job
    found = top.find_straggler("big", base=prom.url, at=end)
    assert found is not None and (found.rank, found.hostname) == (str(STRAGGLER), "gpu-node-4")
    assert tables.straggler_line(found, "big") == (
        f"straggler: rank {STRAGGLER} (pod big-node-0-4-abcde, host gpu-node-4) takes 0.900s per step to reach "
        "the gradient reduction, the job's median 0.201s: every other rank waits for it (orch top big)"
    )
    assert top.find_straggler("big", base=prom.url, at=end - 3 * 3600) is None  # no data then: no straggler


def test_top_once_with_nothing_of_the_job_fails(answering):  # noqa: F811 (the fixture)
    url = answering("# TYPE python_info gauge\npython_info 1\n", "text/plain")  # someone else's exporter
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator", "top", "mine", "--exporter", f"{url}/metrics", "--once"],
        cwd=REPO, env=clean, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1 and result.stderr == f"error: no metrics of job mine at {url}/metrics\n"
