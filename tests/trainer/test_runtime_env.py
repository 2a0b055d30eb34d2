"""The launcher -> trainer contract: what render and `orch run` write is what the trainer reads."""

from __future__ import annotations

import logging

from orchestrator import local, runtime_env
from orchestrator.job import loading
from orchestrator.rendering import pod, render
from orchestrator.runtime_env import RuntimeEnv
from tests.trainer.conftest import REPO


def test_written_env_reads_back_as_the_same_facts():
    facts = RuntimeEnv(
        job_name="gpt",
        output_dir="/orch/output",
        metrics_port=9555,
        metrics_addr="127.0.0.1",
        gpu_sample_seconds=2.5,
        peak_tflops=312.0,
        progress_file="/tmp/p.jsonl",
        log_lines=False,
        final_save=False,
    )
    assert RuntimeEnv.from_environ(facts.to_env()) == facts
    assert RuntimeEnv.from_environ({}) == RuntimeEnv()  # a bare `python -m orchestrator.trainer`


def test_defaults_are_the_job_specs():
    spec = loading.load_job(REPO / "examples" / "digits.yaml", [])
    assert spec.metrics.port == runtime_env.DEFAULT_METRICS_PORT
    assert spec.metrics.gpu_sample_seconds == runtime_env.DEFAULT_GPU_SAMPLE_SECONDS


def test_render_and_orch_run_give_the_trainer_the_same_facts(tmp_path):
    spec = loading.load_job(REPO / "examples" / "gpt.yaml", ["metrics.peak_tflops=312", "metrics.port=9555"])
    pod_env = {e.name: e.value for e in pod.env(spec, spec.name, "PyTorchJob") if e.value is not None}
    in_pod = RuntimeEnv.from_environ(pod_env)
    here = RuntimeEnv.from_environ(local.plan(spec, output_dir=str(tmp_path)).env)
    assert in_pod == RuntimeEnv(
        job_name=spec.name, output_dir="/orch/output", metrics_port=9555, peak_tflops=312.0
    )
    assert here == RuntimeEnv(
        job_name=spec.name, output_dir=str(tmp_path.resolve()), metrics_port=9555, peak_tflops=312.0
    )
    off = loading.load_job(REPO / "examples" / "gpt.yaml", ["metrics.enabled=false"])
    assert RuntimeEnv.from_environ(local.plan(off, output_dir=str(tmp_path)).env).metrics_port == 0


def test_train_json_round_trips_and_is_shared(tmp_path):
    spec = loading.load_job(REPO / "examples" / "digits.yaml", [])
    text = runtime_env.train_json(spec.train)
    assert runtime_env.load_train_json(text) == spec.train
    (config_map,) = [o for o in render.render(spec) if o["kind"] == "ConfigMap"]
    assert config_map["data"] == {"train.json": text}  # the ConfigMap holds exactly what `orch run` writes


def test_malformed_numbers_are_warned_about_and_defaulted(caplog):
    with caplog.at_level(logging.WARNING):
        facts = RuntimeEnv.from_environ(
            {"ORCH_METRICS_PORT": "94x0", "ORCH_GPU_SAMPLE_SECONDS": "0", "ORCH_PEAK_TFLOPS": "nan"}
        )
    assert (facts.metrics_port, facts.gpu_sample_seconds, facts.peak_tflops) == (0, 5.0, None)
    assert [r.getMessage().split("=")[0] for r in caplog.records] == [
        "ignoring ORCH_METRICS_PORT",
        "ignoring ORCH_GPU_SAMPLE_SECONDS",
        "ignoring ORCH_PEAK_TFLOPS",
    ]
