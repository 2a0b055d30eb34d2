"""Issue #25, class 6: a checkpoint never waits for MLflow, and a resume still continues the same run.

A checkpoint taken before the MLflow run exists (the server is slow to answer the first requests) cannot name
the run; it keeps the run's key instead (a random id drawn when the training run starts, tagged on the MLflow
run when it is created), and a resume from it finds the run by that tag. Against a real MLflow server.
"""

from __future__ import annotations

import time

import pytest

from orchestrator.trainer import tracking
from tests.tracking.conftest import metric_history
from tests.trainer.conftest import REPO, orch_run

pytestmark = pytest.mark.slow


def mlflow_tracker(uri: str, experiment: str, **options) -> tracking.MlflowTracker:
    return tracking.MlflowTracker(
        tracking_uri=uri, experiment=experiment, run_name="keyed", tags={"orch.job": "keyed"}, **options
    )


def test_a_checkpoint_before_the_run_exists_returns_at_once(silent_server, monkeypatch):
    """The first checkpoint comes before the server answered: state() keeps the run's key, without waiting
    (rank 0 would hold the other ranks in the checkpoint's collectives)."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "600")
    tracker = mlflow_tracker(silent_server, "stalled", close_seconds=30)
    tracker.start()
    started = time.monotonic()
    state = tracker.state()
    assert time.monotonic() - started < 1
    assert state == {"mlflow_run_key": state["mlflow_run_key"]} and len(state["mlflow_run_key"]) >= 16
    tracker.close_seconds = 0.1
    tracker.close()


def test_a_resume_from_a_checkpoint_without_the_run_id_continues_the_run(mlflow_server):
    first = mlflow_tracker(mlflow_server.uri, "keyed-resume")
    first.start()
    first.log_params({"a": 1})
    first.log_metrics(5, {"train/loss": 2.0})
    assert first.close(failed=True) == []
    # What a checkpoint taken before the run was created holds (the test above): the key, no run id.
    saved = {k: v for k, v in first.state().items() if k != "mlflow_run_id"}
    assert saved.keys() == {"mlflow_run_key"}

    second = mlflow_tracker(mlflow_server.uri, "keyed-resume")
    second.start(saved=saved, step=5)
    second.log_params({"a": 2, "b": 3})
    second.log_metrics(10, {"train/loss": 1.0})
    assert second.close() == []
    assert second.state() == {"mlflow_run_id": first.run_id, "mlflow_run_key": saved["mlflow_run_key"]}

    client = mlflow_server.client()
    runs = client.search_runs([client.get_experiment_by_name("keyed-resume").experiment_id])
    assert [r.info.run_id for r in runs] == [first.run_id]
    assert runs[0].info.status == "FINISHED" and runs[0].data.params == {"a": "1", "b": "3"}
    assert runs[0].data.tags[tracking.TAG_RUN_KEY] == saved["mlflow_run_key"]
    assert metric_history(client, first.run_id) == {"train/loss": [(5, 2.0), (10, 1.0)]}


def test_another_training_run_gets_its_own_mlflow_run(mlflow_server):
    """Keys are drawn per training run: a fresh start in the same experiment never picks up an old run."""
    first = mlflow_tracker(mlflow_server.uri, "keyed-fresh")
    first.start()
    assert first.close() == []
    second = mlflow_tracker(mlflow_server.uri, "keyed-fresh")
    second.start()
    assert second.close() == []
    assert second.run_id != first.run_id
    assert second.state()["mlflow_run_key"] != first.state()["mlflow_run_key"]


def test_a_stalled_server_does_not_hold_the_first_checkpoint_past_the_collective_timeout(
    silent_server, tmp_path
):
    """End to end: MLflow never answers, the end waits for it 15 s, and the collective timeout is 10 s. Rank
    0 used to wait (up to that end's deadline) inside the first checkpoint for the run to be created, while
    rank 1 waited in the checkpoint's collectives: the job died of the collective timeout. (Also what
    test_orch_run.py's "server that never answers" run checked, with an end wait shorter than the collective
    timeout: this one is the stricter case, so that run was folded into it.)"""
    out = tmp_path / "run"
    run = orch_run(
        REPO / "examples" / "digits.yaml", out, "--steps", "10",
        "--set", "train.checkpoint.every_steps=5", "--set", "train.collective_timeout=10",
        "--set", f"tracking.mlflow.tracking_uri={silent_server}",
        env={"MLFLOW_HTTP_REQUEST_TIMEOUT": "300", "ORCH_TRACKING_CLOSE_SECONDS": "15"},
        timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert run.summary["steps"] == 10
    assert f"tracking: MLflow: not sent to {silent_server}: " in run.stdout + run.stderr
