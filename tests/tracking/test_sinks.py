"""The tracking sinks on their own, against a real MLflow server and TensorBoard's own reader."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from orchestrator.trainer import tracking
from tests.tracking.conftest import free_port, metric_history, tensorboard_scalars

pytestmark = pytest.mark.slow

STEPS = {4: {"train/loss": 2.25, "train/lr": 0.1}, 8: {"train/loss": 1.125, "train/lr": 0.05}}


def mlflow_tracker(uri: str, experiment: str = "sinks", **options) -> tracking.MlflowTracker:
    return tracking.MlflowTracker(
        tracking_uri=uri, experiment=experiment, run_name="one", tags={"orch.job": "one"}, **options
    )


def test_mlflow_records_params_metrics_artifacts_and_finishes(mlflow_server, tmp_path, capsys):
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"steps": 8}))
    tracker = mlflow_tracker(mlflow_server.uri)
    tracker.start()
    tracker.log_params({"optimizer.lr": 0.1, "nodes": 1})
    for step, values in STEPS.items():
        tracker.log_metrics(step, values)
    tracker.log_artifacts([summary])
    assert tracker.close() == []
    assert "warning" not in capsys.readouterr().err

    client = mlflow_server.client()
    run = client.get_run(tracker.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "one"
    assert run.data.params == {"optimizer.lr": "0.1", "nodes": "1"}
    assert run.data.tags["orch.job"] == "one"
    assert metric_history(client, tracker.run_id) == {
        "train/loss": [(4, 2.25), (8, 1.125)],
        "train/lr": [(4, 0.1), (8, 0.05)],
    }
    assert [a.path for a in client.list_artifacts(tracker.run_id)] == ["summary.json"]
    downloaded = client.download_artifacts(tracker.run_id, "summary.json", str(tmp_path / "back"))
    assert json.loads(Path(downloaded).read_text()) == {"steps": 8}
    assert tracker.links() == {
        "mlflow": f"{mlflow_server.uri}/#/experiments/{run.info.experiment_id}/runs/{tracker.run_id}"
    }
    assert tracker.state() == {"mlflow_run_id": tracker.run_id, "mlflow_run_key": tracker.run_key}


def test_a_resumed_tracker_continues_the_same_run(mlflow_server):
    first = mlflow_tracker(mlflow_server.uri, "sinks-resume")
    first.start()
    first.log_params({"a": 1})
    first.log_metrics(4, {"train/loss": 2.0})
    assert first.close(failed=True) == []
    client = mlflow_server.client()
    assert client.get_run(first.run_id).info.status == "FAILED"

    second = mlflow_tracker(mlflow_server.uri, "sinks-resume")
    second.start(saved={"mlflow_run_id": first.run_id}, step=4)
    second.log_params({"a": 2, "b": 3})  # `a` is kept from the first attempt (params are immutable)
    second.log_metrics(8, {"train/loss": 1.0})
    assert second.close() == []

    assert second.run_id == first.run_id
    runs = client.search_runs([client.get_experiment_by_name("sinks-resume").experiment_id])
    assert [r.info.run_id for r in runs] == [first.run_id]
    assert runs[0].info.status == "FINISHED"
    assert runs[0].data.params == {"a": "1", "b": "3"}
    assert metric_history(client, first.run_id) == {"train/loss": [(4, 2.0), (8, 1.0)]}


def test_a_server_that_is_down_is_one_warning_and_the_loss_is_said_at_the_end(capsys):
    uri = f"http://127.0.0.1:{free_port()}"
    tracker = mlflow_tracker(uri, retry_seconds=0.01, close_seconds=60)
    tracker.start()
    tracker.log_params({"a": 1})
    for step in range(1, 21):
        tracker.log_metrics(step, {"train/loss": 1.0 / step, "train/lr": 0.1})
    unsent = tracker.close()
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and f"MLflow at {uri} did not answer" in err
    assert len(unsent) == 1
    assert unsent[0].startswith("MLflow: not sent to http://127.0.0.1:")
    assert "40 metric values, 1 params" in unsent[0]


def test_values_missed_while_the_server_was_down_are_sent_when_it_is_back(mlflow_server, capsys):
    tracker = mlflow_tracker(
        mlflow_server.uri, "sinks-outage", retry_seconds=3600
    )  # only close() tries again
    tracker.start()
    tracker.log_metrics(1, {"train/loss": 3.0})
    _wait_for(lambda: tracker.run_id is not None and not tracker._pending.metrics)
    mlflow_server.stop()
    tracker.log_metrics(2, {"train/loss": 2.0})
    _wait_for(lambda: "did not answer" in capsys.readouterr().err)
    tracker.log_metrics(3, {"train/loss": 1.0})  # queued behind the failure, not sent
    mlflow_server.start()
    assert tracker.close() == []
    client = mlflow_server.client()
    assert metric_history(client, tracker.run_id) == {"train/loss": [(1, 3.0), (2, 2.0), (3, 1.0)]}
    assert client.get_run(tracker.run_id).info.status == "FINISHED"


def test_tensorboard_scalars_read_back_and_resume_purges_the_replayed_steps(tmp_path):
    log_dir = tmp_path / "tensorboard"
    first = tracking.TensorBoardTracker(log_dir)
    first.start()
    for step in (4, 8, 12):
        first.log_metrics(step, {"train/loss": 1.0 / step})
    assert first.close() == []
    # The checkpoint was at step 8: the resumed attempt writes 12 again (another value) and 16.
    second = tracking.TensorBoardTracker(log_dir)
    second.start(step=8)
    for step in (12, 16):
        second.log_metrics(step, {"train/loss": 2.0 / step})
    second.close()
    assert tensorboard_scalars(log_dir) == {
        "train/loss": [
            (4, np.float32(1 / 4)),
            (8, np.float32(1 / 8)),
            (12, np.float32(2 / 12)),
            (16, np.float32(2 / 16)),
        ]
    }


def test_a_tensorboard_dir_that_cannot_be_written_is_one_warning(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    tracker = tracking.TensorBoardTracker(blocker / "tensorboard")
    tracker.start()
    tracker.log_metrics(1, {"train/loss": 1.0})
    tracker.log_metrics(2, {"train/loss": 1.0})
    unsent = tracker.close()
    assert capsys.readouterr().err.count("warning: TensorBoard") == 1
    assert len(unsent) == 1 and unsent[0].startswith("TensorBoard: 2 values not written")


def test_fan_out_and_null():
    null = tracking.NullTracker()
    both = tracking.Trackers([null, tracking.NullTracker()])
    both.start(saved={"mlflow_run_id": "x"}, step=3)
    both.log_metrics(1, {"a": 1.0})
    assert both.close() == [] and both.links() == {} and both.state() == {}


def test_flatten_the_train_section():
    assert tracking.flatten(
        {"task": "digits", "task_args": {}, "optimizer": {"lr": 0.1, "betas": [0.9, 0.99]}, "seed": 0}
    ) == {
        "task": "digits",
        "task_args": "{}",
        "optimizer.lr": 0.1,
        "optimizer.betas": "[0.9, 0.99]",
        "seed": 0,
    }


def _wait_for(condition, timeout: float = 120) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.1)


# --- a server that never answers, permanent errors, file stores (#25 class 6, #24) ------------------------


def test_a_server_that_never_answers_blocks_neither_a_checkpoint_nor_the_end(silent_server, monkeypatch):
    """Checkpoints call state() on rank 0 while the other ranks wait in collectives: it answers at once;
    close() keeps to its own deadline."""
    import time

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "600")
    tracker = mlflow_tracker(silent_server, close_seconds=2)
    tracker.start(saved={"mlflow_run_id": "abc", "mlflow_run_key": "k"})
    tracker.log_metrics(1, {"train/loss": 1.0})
    started = time.monotonic()
    assert tracker.state() == {
        "mlflow_run_id": "abc",
        "mlflow_run_key": "k",
    }  # the run it resumes, known without the server
    assert time.monotonic() - started < 1
    unsent = tracker.close()
    assert time.monotonic() - started < 10
    (line,) = unsent
    assert line.startswith(f"MLflow: not sent to {silent_server}: ") and line.endswith("(timed out)")


def test_a_permanent_error_is_said_once_in_full_and_not_retried(tmp_path, monkeypatch, capsys):
    """MLflow refuses a file store unless allowed: trying again every 30 s cannot help, and the fix is at the
    end of its message."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "false")
    tracker = mlflow_tracker(f"file:{tmp_path / 'mlruns'}", retry_seconds=0.01, close_seconds=30)
    tracker.start()
    for step in range(1, 6):
        tracker.log_metrics(step, {"train/loss": 1.0})
    _wait_for(lambda: "refused the run" in capsys.readouterr().err)
    tracker.log_metrics(6, {"train/loss": 1.0})
    (unsent,) = tracker.close()
    err = capsys.readouterr().err
    assert "did not answer" not in err and err.count("warning:") == 0  # said once, above, and no retry
    assert unsent.endswith("set `MLFLOW_ALLOW_FILE_STORE=true` to opt out of this exception.)"), unsent
    assert "6 metric values" in unsent


def test_a_file_store_records_the_run(tmp_path):
    tracker = mlflow_tracker(f"file:{tmp_path / 'mlruns'}", "files")
    tracker.start()
    tracker.log_metrics(4, {"train/loss": 2.0})
    assert tracker.close() == []
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"file:{tmp_path / 'mlruns'}")
    assert metric_history(client, tracker.run_id) == {"train/loss": [(4, 2.0)]}


def test_user_code_importing_mlflow_while_the_tracker_starts(tmp_path):
    """In a fresh interpreter, as in a trainer: the user's code imports mlflow on the main thread right after the
    tracker started. mlflow's import cycle made two threads importing it from two entry points fail."""
    script = f"""
import sys
from orchestrator.trainer import tracking
trackers = [
    tracking.MlflowTracker(tracking_uri="file:{tmp_path}/mlruns-" + str(i), experiment="x", run_name="r", tags={{}})
    for i in range(2)
]
for tracker in trackers:
    tracker.start()
    tracker.log_metrics(1, {{"loss": 1.0}})
import mlflow.entities
print([tracker.close() for tracker in trackers], all(tracker.run_id for tracker in trackers))
"""
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parents[2],
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[[], []] True", result.stdout + result.stderr
    assert "warning" not in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("error", "retry"),
    [
        (ConnectionRefusedError(111, "refused"), True),
        (TimeoutError(), True),
        (
            RuntimeError("API request to endpoint /x failed with error code 503 != 200. Response body: ''"),
            True,
        ),
        (RuntimeError("The filesystem tracking backend (e.g., './mlruns') is in maintenance mode"), False),
        (ValueError("bad"), False),
    ],
)
def test_which_errors_are_worth_a_retry(error, retry):
    assert tracking.transient(error) is retry


def test_a_wrapped_connection_error_is_worth_a_retry():
    try:
        try:
            raise ConnectionResetError(104, "reset")
        except OSError as cause:
            raise RuntimeError("API request to http://x failed with exception ...") from cause
    except RuntimeError as error:
        assert tracking.transient(error)


def test_a_stalled_tensorboard_volume_holds_neither_the_loop_nor_the_end(tmp_path, monkeypatch):
    """A volume that hangs (an NFS server gone) cannot exist here: the writer is replaced by one that blocks
    the way a write to it would. The loop's calls return at once; close() keeps to its deadline."""
    import threading
    import time

    import torch.utils.tensorboard

    released = threading.Event()

    class HangingWriter:
        def __init__(self, *args, **kwargs) -> None:
            pass

        def add_scalar(self, *args, **kwargs) -> None:
            released.wait()

        def flush(self) -> None:
            pass

        def close(self) -> None:
            pass

    monkeypatch.setattr(torch.utils.tensorboard, "SummaryWriter", HangingWriter)
    tracker = tracking.TensorBoardTracker(tmp_path / "tensorboard", close_seconds=1)
    tracker.start()
    started = time.monotonic()
    for step in range(1, 4):
        tracker.log_metrics(step, {"train/loss": 1.0, "train/lr": 0.1})
    assert time.monotonic() - started < 1
    assert tracker.close() == [f"TensorBoard: 6 values not written to {tmp_path / 'tensorboard'} (timed out)"]
    released.set()
