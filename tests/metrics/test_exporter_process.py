"""The exporter in real processes, scraped over HTTP (no Prometheus needed): sharing, failures, NVML absence."""

from __future__ import annotations

import json
import socket
import time

import pytest

from orchestrator import goodput
from orchestrator.runtime_env import RuntimeEnv
from orchestrator.trainer.metrics import NullMetrics, build_metrics
from orchestrator.trainer.report import StepStats, Workload
from tests.metrics.conftest import free_port
from tests.metrics.helpers import scrape, start_driver


def _finish(process, timeout=30) -> tuple[dict, str]:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1]), err


def test_no_port_gives_null_metrics():
    # metrics.enabled: false renders ORCH_METRICS_PORT=0; unset is the same
    for environ in ({"ORCH_METRICS_PORT": "0"}, {}):
        runtime = RuntimeEnv.from_environ(environ)
        metrics = build_metrics(runtime, rank=0, local_rank=0, node_rank=0, device="cpu")
        assert type(metrics) is NullMetrics
        stats = StepStats(step=1, max_steps=1, lr=0.1, grad_norm=1.0, seconds=0.1, data_wait_seconds=0.0,
                          skipped=False, skipped_total=0, work=Workload(samples=1))  # fmt: skip
        metrics.on_step(stats)  # the trainer calls it unconditionally
        metrics.close()


def test_local_ranks_share_one_endpoint_and_counts_add_up(tmp_path):
    port, stop = free_port(), tmp_path / "stop"
    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "mp"), "TORCHELASTIC_RESTART_COUNT": "2"}
    ranks = [
        start_driver(
            "--port",
            str(port),
            "--job",
            "share",
            "--rank",
            str(r),
            "--local-rank",
            str(r),
            "--node-rank",
            "1",
            "--steps",
            str(20 + 5 * r),
            "--stop-file",
            str(stop),
            env=env,
        )
        for r in (0, 1)
    ]
    try:
        # Each driver prints its report after its last on_step returned. Waiting for the step gauge instead
        # raced: on_step sets it first, so a scrape could see step 25 before that step's samples were added.
        reports = [json.loads(p.stdout.readline() or "null") for p in ranks]
        series = scrape(port)
        steps = {labels["rank"]: value for labels, value in series.get("orch_train_step", [])}
        assert steps == {"0": 20.0, "1": 25.0}
        samples = {labels["rank"]: value for labels, value in series["orch_train_samples_total"]}
        assert samples == {"0": 20 * 32.0, "1": 25 * 32.0}
        skipped = {labels["rank"]: value for labels, value in series["orch_train_amp_skipped_steps_total"]}
        assert skipped == {"0": 2.0, "1": 2.0}
        count = {labels["rank"]: value for labels, value in series["orch_train_step_duration_seconds_count"]}
        assert count == {"0": 20.0, "1": 25.0}
        labels = {tuple(sorted(lab.items())) for lab, _ in series["orch_train_loss"]}
        assert {dict(lab)["node_rank"] for lab in labels} == {"1"} and {
            dict(lab)["job"] for lab in labels
        } == {"share"}
        assert {value for _, value in series["orch_train_elastic_restarts"]} == {2.0}
        assert "orch_train_mfu_ratio" not in series  # no peak known on a CPU without ORCH_PEAK_TFLOPS
        state = {(lab["rank"], lab["kind"]): value for lab, value in series["orch_train_state_bytes"]}
        assert state == {
            ("0", "parameter"): 1000.0, ("0", "gradient"): 1000.0, ("0", "optimizer"): 2000.0,
            ("1", "parameter"): 2000.0, ("1", "gradient"): 2000.0, ("1", "optimizer"): 4000.0,
        }  # fmt: skip
        # ... and the metrics say why, per rank
        unknown = {lab["rank"]: (lab["device_name"], v) for lab, v in series["orch_train_peak_flops_unknown"]}
        assert unknown == {"0": ("cpu", 1.0), "1": ("cpu", 1.0)}
        # the job's goodput: rank 0's alone; the counter holds the job's total, not a sum of totals (#31)
        assert [(lab["rank"], v) for lab, v in series["orch_goodput_ratio"]] == [("0", 0.5)]
        badput = {(lab["rank"], lab["cause"]): v for lab, v in series["orch_badput_seconds_total"]}
        assert badput == {("0", cause): (0.25 * 20 if cause == "data_loading_sync" else 0.0)
                          for cause in goodput.CAUSES}  # fmt: skip
    finally:
        stop.touch()
    for p in ranks:
        _, err = p.communicate(timeout=30)
        assert p.returncode == 0, err
    assert [r["serving_port"] for r in reports] == [port, None]  # local rank 0 serves, rank 1 only writes
    assert not (tmp_path / "mp").exists()  # the last one out removed its files and the directory


def test_mfu_with_peak_override(tmp_path):
    port, stop = free_port(), tmp_path / "stop"
    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "mp"), "ORCH_PEAK_TFLOPS": "1"}
    process = start_driver("--port", str(port), "--steps", "3", "--stop-file", str(stop), env=env)
    try:
        deadline = time.monotonic() + 20
        while not (series := scrape(port)).get("orch_train_mfu_ratio") and time.monotonic() < deadline:
            time.sleep(0.1)
        # 4e9 FLOPs in a 0.02 s step on a 1 TFLOP/s device
        assert series["orch_train_mfu_ratio"][0][1] == pytest.approx(4e9 / 0.02 / 1e12)
        assert series["orch_train_peak_flops"][0][1] == 1e12
        assert "orch_train_peak_flops_unknown" not in series
    finally:
        stop.touch()
    _finish(process)


def test_port_in_use_warns_and_training_goes_on(tmp_path):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = start_driver(
            "--port",
            str(port),
            "--steps",
            "5",
            "--hold-seconds",
            "0",
            env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "mp")},
        )
        report, err = _finish(process)
    assert report["steps"] == 5 and report["serving_port"] is None
    assert "cannot listen" in err and "training goes on" in err


def test_no_nvml_means_no_gpu_series_and_training_series_present(tmp_path):
    """NVML is absent on this machine (no driver library): the sampler is asked for but yields nothing."""
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("NVML works here (a GPU machine): absence cannot be tested")
    port, stop = free_port(), tmp_path / "stop"
    process = start_driver(
        "--port",
        str(port),
        "--steps",
        "4",
        "--sample-gpus",
        "--stop-file",
        str(stop),
        env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "mp")},
    )
    try:
        deadline = time.monotonic() + 20
        while (series := scrape(port)).get("orch_train_step", [({}, 0)])[0][
            1
        ] < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stop.touch()
    _, err = _finish(process)
    assert series["orch_train_step"][0][1] == 4
    assert not [name for name in series if name.startswith("orch_gpu_")]
    assert "GPU metrics off" in err


def test_a_crashed_rank_drops_out(tmp_path):
    """A rank killed mid-run leaves its files; the next scrape forgets it (elastic restarts start clean)."""
    port, stop, mp = free_port(), tmp_path / "stop", tmp_path / "mp"
    env = {"PROMETHEUS_MULTIPROC_DIR": str(mp)}
    server = start_driver("--port", str(port), "--steps", "3", "--stop-file", str(stop), env=env)
    try:
        scrape(port)  # rank 0 is serving
        crashed = start_driver(
            "--port", str(port), "--rank", "1", "--local-rank", "1", "--steps", "3", "--crash", env=env
        )
        crashed.communicate(timeout=30)
        assert crashed.returncode == 3
        assert any(f"_{crashed.pid}.db" in p.name for p in mp.iterdir())  # it left files behind
        series = scrape(port)
        assert {labels["rank"] for labels, _ in series["orch_train_samples_total"]} == {"0"}
        assert not any(f"_{crashed.pid}.db" in p.name for p in mp.iterdir())
    finally:
        stop.touch()
    _finish(server)
