"""`orch run` with tracking, end to end: the demo job, a real MLflow server, TensorBoard's own reader.

Each record is compared with what the run itself reported: rank 0's progress events (the values behind its
log lines, exact), its log lines (4 decimals) and summary.json. Resuming (a second `orch run` with the same
--out, or a worker restart) must continue the same record.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from orchestrator import outputs
from orchestrator.imaging.builder import git_revision
from orchestrator.trainer import tracking
from tests.tracking.conftest import metric_history, running, tensorboard_scalars
from tests.trainer.conftest import REPO, Run, orch_run

pytestmark = pytest.mark.slow
DIGITS = REPO / "examples" / "digits.yaml"
HOOKS = "tests.tracking.hook_tasks:digits_with_hooks"
TRAIN_KEYS = ("loss", "lr", "grad_norm", "samples_per_second")


def run_digits(out: Path, steps: int, *sets: str) -> Run:
    args = ["--steps", str(steps)]
    for value in sets:
        args += ["--set", value]
    run = orch_run(DIGITS, out, *args, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run


def events(out: Path, kind: str) -> list[dict]:
    lines = (out / "progress.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def where_params() -> dict[str, str]:
    return {
        "nodes": "1",
        "gpus_per_node": "0",
        "procs_per_node": "2",
        "world_size": "2",
        "image": "(none: orch run)",
    }


@dataclass
class DemoAndResume:
    """The demo run to step 50 and its resume to 100 in the same --out, recorded by MLflow and TensorBoard."""

    out: Path
    first: Run
    first_steps: list[dict]
    first_train: dict
    first_eval: dict
    first_links: dict
    second: Run
    second_steps: list[dict]
    first_goodput: dict

    def goodput_history(self, kind=float) -> dict[str, list]:
        """What each run logs as it ends: summary.json's goodput (#31), at its last step."""
        ends = [(50, self.first_goodput), (100, self.second.summary["goodput"])]
        history = {
            "goodput/ratio": [(step, kind(g["ratio"])) for step, g in ends],
            "goodput/seconds": [(step, kind(g["goodput_seconds"])) for step, g in ends],
        }
        for cause in self.first_goodput["badput_seconds"]:
            history[f"badput/{cause}"] = [(step, kind(g["badput_seconds"][cause])) for step, g in ends]
        return history


@pytest.fixture(scope="module")
def demo_and_resume(_session_mlflow_server, tmp_path_factory) -> DemoAndResume:
    """One pair of runs for both sinks' tests (docs/testing.md, "Shared training runs")."""
    server = running(_session_mlflow_server)
    out = tmp_path_factory.mktemp("demo") / "run"
    sets = (f"tracking.mlflow.tracking_uri={server.uri}", "tracking.mlflow.experiment=e2e",
            "tracking.tensorboard=true")  # fmt: skip
    first = run_digits(out, 50, *sets)
    first_steps, first_train = events(out, "step"), json.loads((out / "train.json").read_text())
    first_eval = first.summary["eval"]  # read now: the second run rewrites summary.json
    first_goodput = first.summary["goodput"]
    first_links = json.loads((out / outputs.LINKS).read_text())
    second = run_digits(out, 100, *sets)  # the same --out: resumes from step 50
    second_steps = events(out, "step")[len(first_steps) :]  # progress.jsonl keeps every run's (appended)
    return DemoAndResume(out, first, first_steps, first_train, first_eval, first_links, second, second_steps,
                         first_goodput)  # fmt: skip


def test_mlflow_records_the_demo_and_its_resume_as_one_run(demo_and_resume, mlflow_server, tmp_path):
    demo = demo_and_resume
    out, first, second, links = demo.out, demo.first, demo.second, demo.first_links
    first_steps, first_train, first_eval, second_steps = (
        demo.first_steps, demo.first_train, demo.first_eval, demo.second_steps,
    )  # fmt: skip
    assert first.stdout.splitlines()[-1] == (
        f"tracking: mlflow {links['mlflow']}, tensorboard --logdir {out / 'tensorboard'}"
    )

    client = mlflow_server.client()  # running again if a test stopped it since
    runs = client.search_runs([client.get_experiment_by_name("e2e").experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert (
        links["mlflow"]
        == f"{mlflow_server.uri}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
    )
    assert json.loads((out / outputs.LINKS).read_text()) == links
    assert (run.info.status, run.info.run_name) == ("FINISHED", "digits-ddp")
    # params: the train section the first attempt ran with (params are immutable), and where it ran
    assert run.data.params == {
        **{k: str(v) for k, v in tracking.flatten(first_train).items()},
        **where_params(),
    }
    assert run.data.params["optimizer.lr"] == "0.003" and run.data.params["max_steps"] == "50"
    commit = git_revision(str(REPO))  # None in a checkout git_revision cannot read (a worktree): no tag
    assert {k: v for k, v in run.data.tags.items() if k.startswith(("orch.", "mlflow.source.git"))} == {
        "orch.job": "digits-ddp",
        "orch.api_kind": "local",
        "orch.run_key": run.data.tags["orch.run_key"],  # drawn at the start (tests/tracking/test_run_key.py)
        **({"mlflow.source.git.commit": commit} if commit else {}),
    }
    history = metric_history(client, run.info.run_id)
    steps = first_steps + second_steps
    assert [e["step"] for e in steps] == [25, 50, 75, 100]
    assert history == {
        **{f"train/{key}": [(e["step"], e[key]) for e in steps] for key in TRAIN_KEYS},
        "eval/loss": [(50, first_eval["loss"]), (100, second.summary["eval"]["loss"])],
        "eval/accuracy": [(50, first_eval["accuracy"]), (100, second.summary["eval"]["accuracy"])],
        **demo.goodput_history(),
    }
    # ... and the log lines show the same numbers
    assert [line.split("  ")[1] for line in second.stdout.splitlines() if line.startswith("step ")] == [
        f"loss {e['loss']:.4f}" for e in second_steps
    ]
    assert history["train/loss"][-1][1] == second.summary["final_loss"]

    assert sorted(a.path for a in client.list_artifacts(run.info.run_id)) == ["model.pt", "summary.json"]
    back = tmp_path / "back"
    summary = client.download_artifacts(run.info.run_id, "summary.json", str(back))
    assert json.loads(Path(summary).read_text()) == second.summary
    model = client.download_artifacts(run.info.run_id, "model.pt", str(back))
    assert Path(model).read_bytes() == (out / "model.pt").read_bytes()


def test_tensorboard_records_the_demo_and_its_resume(demo_and_resume):
    demo = demo_and_resume
    out, first, second, first_eval = demo.out, demo.first, demo.second, demo.first_eval
    assert f"tensorboard --logdir {out / 'tensorboard'}" in first.stdout.splitlines()[:3]
    assert first.stdout.splitlines()[-1].endswith(f", tensorboard --logdir {out / 'tensorboard'}")
    steps = events(out, "step")  # progress.jsonl keeps every run's events (appended): both runs'

    scalars = tensorboard_scalars(out / "tensorboard")
    f32 = np.float32  # TensorBoard's scalars are 32-bit floats
    assert scalars == {
        **{f"train/{key}": [(e["step"], f32(e[key])) for e in steps] for key in TRAIN_KEYS},
        "eval/loss": [(50, f32(first_eval["loss"])), (100, f32(second.summary["eval"]["loss"]))],
        "eval/accuracy": [
            (50, f32(first_eval["accuracy"])),
            (100, f32(second.summary["eval"]["accuracy"])),
        ],
        **demo.goodput_history(f32),
    }


def test_task_hooks_reach_every_sink(mlflow_server, tmp_path):
    out = tmp_path / "run"
    scrape = tmp_path / "scrape.txt"
    run = run_digits(
        out, 50,
        f"train.task={HOOKS}", f"train.task_args={{scrape_at: 50, scrape_file: {scrape}}}",
        f"tracking.mlflow.tracking_uri={mlflow_server.uri}", "tracking.mlflow.experiment=hooks",
        "tracking.tensorboard=true",
    )  # fmt: skip
    steps, evals = events(out, "step"), events(out, "eval")
    # reporter: the task's numbers after orch's, on the lines and in the events; on_eval's in summary.json
    assert [e["extra"] for e in steps] == [
        {"loss_x2": 2 * steps[0]["loss"], "phase": "main"},
        {"loss_x2": 2 * steps[1]["loss"], "phase": "main"},
    ]
    assert f"loss_x2 {2 * steps[0]['loss']:.4f}  phase main" in run.stdout
    error_rate = 1.0 - run.summary["eval"]["accuracy"]
    assert run.summary["eval"]["error_rate"] == evals[-1]["error_rate"] == error_rate
    # MLflow and TensorBoard: the numbers, not the text
    client = mlflow_server.client()
    (mlflow_run,) = client.search_runs([client.get_experiment_by_name("hooks").experiment_id])
    history = metric_history(client, mlflow_run.info.run_id)
    assert history["train/loss_x2"] == [(e["step"], 2 * e["loss"]) for e in steps]
    assert history["eval/error_rate"] == [(50, error_rate)]
    assert not any("phase" in key for key in history)
    scalars = tensorboard_scalars(out / "tensorboard")
    assert scalars["train/loss_x2"] == [(e["step"], np.float32(2 * e["loss"])) for e in steps]
    assert scalars["eval/error_rate"] == [(50, np.float32(error_rate))]
    # Prometheus: rank 0's exporter at step 50 serves what on_log returned at step 25 (numbers only)
    served = {
        (s.labels["name"], s.labels["rank"]): s.value
        for family in text_string_to_metric_families(scrape.read_text())
        for s in family.samples
        if s.name == "orch_task_metric"
    }
    assert served[("loss_x2", "0")] == 2 * steps[0]["loss"]
    assert "phase" not in {name for name, _ in served}


def test_a_restarted_worker_continues_the_same_run(mlflow_server, tmp_path):
    """Rank 0 fails once at step 50 (before logging it); the launcher restarts both ranks (restart.policy
    job), they resume from the checkpoint at step 25, and the MLflow run goes on."""
    out = tmp_path / "run"
    run = run_digits(
        out, 75,
        f"train.task={HOOKS}", f"train.task_args={{fail_once_at: 50, marker: {tmp_path / 'failed'}}}",
        "train.checkpoint.every_steps=25", "restart.policy=job", "restart.max_restarts=1",
        f"tracking.mlflow.tracking_uri={mlflow_server.uri}", "tracking.mlflow.experiment=restart",
    )  # fmt: skip
    assert (tmp_path / "failed").exists() and run.summary["resumed_from_step"] == 25
    client = mlflow_server.client()
    runs = client.search_runs([client.get_experiment_by_name("restart").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    steps = events(out, "step")
    assert [e["step"] for e in steps] == [25, 50, 75]
    history = metric_history(client, runs[0].info.run_id)
    assert history["train/loss"] == [(e["step"], e["loss"]) for e in steps]
    assert history["eval/accuracy"] == [(75, run.summary["eval"]["accuracy"])]


def test_a_tracking_server_stopped_mid_run(mlflow_server, tmp_path):
    """The server goes away at step 25 of 50 (the task's hook stops it): the run finishes with a correct
    summary, one warning, and a last word on what MLflow did not get."""
    out = tmp_path / "run"
    run = run_digits(
        out, 50,
        f"train.task={HOOKS}",
        f"train.task_args={{stop_server_pgid: {mlflow_server.process.pid}, stop_server_url: '{mlflow_server.uri}', "
        "stop_at: 25}",
        f"tracking.mlflow.tracking_uri={mlflow_server.uri}", "tracking.mlflow.experiment=outage",
    )  # fmt: skip
    output = run.stdout + run.stderr
    assert output.count("warning: MLflow") == 1, output
    assert f"warning: MLflow at {mlflow_server.uri} did not answer" in output
    assert f"tracking: MLflow: not sent to {mlflow_server.uri}: " in output
    summary = run.summary
    assert summary["steps"] == 50 and summary["final_loss"] == events(out, "step")[-1]["loss"]
    assert summary["eval"]["accuracy"] > 0.1
    # everything else of the run is there, as without tracking
    assert torch.load(out / "model.pt", weights_only=True).keys() == run.state_dict().keys()
