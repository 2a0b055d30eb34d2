"""The rendered container command's exit code carries the failure's class (issue #19, points 6 and 7).

torch is real: each "pod" is the rendered PyTorchJob container command (orchestrator.launch over torchrun,
the trainer, 2 processes on CPU/gloo) with its rendered env, run on 127.0.0.1. The operator is not: its env
for a Master pod (v1.9 envvar.go) is played as a dict, and its reaction to the exit code (ExitCode policy:
>= 128 recreates the pod, 1-127 fails the job; pkg/controller.v1/common/pod.go) is what the asserts check.
A pod that is recreated is played by running the command again on the same output folder (a PVC).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator import exit_codes, launch, naming, outputs
from orchestrator.job.spec import JobSpec
from orchestrator.rendering import render
from orchestrator.rendering.pod import LAUNCHER
from tests.spec.test_restart_launch import elastic_operator_env, finish, kill_all, pod_command
from tests.spec.test_torchrun_launch import free_port
from tests.trainer.conftest import REPO, job, orch_run, write_job
from tests.trainer.test_faults import wait_for

pytestmark = pytest.mark.slow


def pod(tmp_path: Path, task: str, task_args: dict, **spec_fields) -> tuple[list[str], dict[str, str], Path]:
    """The Master pod's command and env for a 1-node, 2-process exit-code job running `task`."""
    spec_dict = job(
        "exits", procs=2, max_steps=40, task=f"tests.spec.exit_code_tasks:{task}", task_args=task_args
    )
    spec_dict |= {"image": "i:1", "metrics": {"enabled": False}, "restart": {"policy": "exit-code"}}
    spec = JobSpec.model_validate(spec_dict | spec_fields)
    found = {o["kind"]: o for o in render.render(spec, api="pytorchjob")}
    job_spec = found["PyTorchJob"]["spec"]
    (container,) = job_spec["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
    folder = tmp_path / f"etc-orch-{time.monotonic_ns()}"
    command = pod_command(container["command"], found["ConfigMap"], folder)
    out = tmp_path / "out"
    operator_env = {  # the v1.9 operator's env on the Master of a 1-replica job
        "PYTHONUNBUFFERED": "1",
        "PET_NPROC_PER_NODE": job_spec["nprocPerNode"],
        "PET_NNODES": "1",
        "PET_NODE_RANK": "0",
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(free_port()),
    }
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env |= operator_env | {"ORCH_OUTPUT_DIR": str(out), "TMPDIR": str(tmp_path)}
    return command, env, out


def run_pod(
    command: list[str], env: dict[str, str], out: Path, timeout: float = 240
) -> subprocess.CompletedProcess:
    path = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    try:
        return subprocess.run(
            command, env={**os.environ, **env, "PATH": path}, cwd=REPO, capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip
    finally:
        kill_all(out)


def test_the_container_command_is_orchs_launcher(tmp_path):
    command, _, _ = pod(tmp_path, "raises", {"rank": 1})
    assert command[:4] == ["python", "-m", "orchestrator.launch", "--nproc-per-node=2"]


# SIGKILL (137, an OOM kill) is the first pod of test_pytorchjob_exit_code_retries_stop_at_backoff_limit.
def test_a_worker_killed_by_a_signal_ends_the_container_retryable(tmp_path):
    command, env, out = pod(tmp_path, "dies_by_signal", {"rank": 1, "signal_name": "SIGSEGV"})
    result = run_pod(command, env, out)
    assert result.returncode == 139, result.stderr[-3000:]
    assert "exit code 139 (retryable)" in result.stderr


def test_a_python_exception_ends_the_container_permanent(tmp_path):
    command, env, out = pod(tmp_path, "raises", {"rank": 1})
    result = run_pod(command, env, out)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "deliberate error on rank 1" in result.stderr  # torch's failure summary is still printed
    assert "exit code 1 (permanent)" in result.stderr


def test_a_worker_that_exits_0_early_is_named_and_the_failure_it_causes_stays_permanent(tmp_path):
    """#33: rank 1 ends with exit code 0 at its third step; rank 0 then fails in its next collective (gloo: the
    connection is gone). torch lists only rank 0's failure, so orch says which worker had exited 0, and the
    container ends as rank 0's exception does: 1, permanent (a retry would repeat it)."""
    command, env, out = pod(tmp_path, "exits_0_on_rank", {"rank": 1, "at_step": 3, "samples": 256})
    result = run_pod(command, env, out)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "orch: local rank 1 had exited 0 while the other workers still ran" in result.stderr
    assert "exit code 1 (permanent)" in result.stderr
    assert "Traceback" not in result.stderr.split("orch: local rank 1")[1]  # orch's own lines end the output


def test_sigterm_to_the_pod_ends_the_container_retryable(tmp_path):
    """The kubelet's SIGTERM (eviction, preemption, delete) goes to the container's main process only; the
    pod's next start is not counted as a retry (backoff_limit 0 and a claim: it would be refused)."""
    command, env, out = pod(
        tmp_path, "slow", {"samples": 256, "eval_samples": 64, "sample_delay": 0.05},
        restart={"policy": "exit-code", "backoff_limit": 0}, output={"pvc": "claim"},
    )  # fmt: skip
    path = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    main = subprocess.Popen(
        command, env={**os.environ, **env, "PATH": path}, cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: (out / "started-0").exists() and (out / "started-1").exists(), timeout=180,
                 what="both ranks training")  # fmt: skip
        main.send_signal(signal.SIGTERM)
    finally:
        (output,) = finish([main], out, timeout=120)
    assert main.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert "stopped by SIGTERM; exit code 143 (retryable)" in output
    (count,) = (out / outputs.STARTS / "unsubmitted").iterdir()
    assert count.read_text() == "1 1\n"  # one start, ended by the pod's SIGTERM


def test_pytorchjob_exit_code_retries_stop_at_backoff_limit(tmp_path):
    """The operator recreates the pod after each 137 without limit (kubeflow/trainer#2045); the launcher
    counts the starts on the output claim and the start after backoff_limit retries fails for good."""
    command, env, out = pod(
        tmp_path, "dies_by_signal", {"rank": 0, "signal_name": "SIGKILL"}, restart={"policy": "exit-code",
        "backoff_limit": 1}, output={"pvc": "claim"},
    )  # fmt: skip
    assert env[launch.ENV_RETRY_LIMIT] == "1"
    first = run_pod(
        command, env, out
    )  # a worker killed by SIGKILL (an OOM kill) ends the container retryable
    assert first.returncode == 137, first.stderr[-3000:]
    assert "exit code 137 (retryable)" in first.stderr
    codes = [run_pod(command, env, out).returncode for _ in range(2)]
    assert codes == [137, launch.RETRIES_EXHAUSTED]
    # another submission of the job (a new orch.dev/submission id on its pods) starts with a fresh count
    fresh = run_pod(command, env | {launch.ENV_SUBMISSION: "other-submission"}, out)
    assert fresh.returncode == 137


def test_the_start_count_adds_up_every_pod_of_the_job(tmp_path):
    """Master and workers share the claim: their retries are summed, as backoffLimit sums restarts."""

    def start(pod: str) -> str | None:
        return launch.count_start(tmp_path, "s1", pod, limit=2)[1]

    assert [start("exits-master-0"), start("exits-master-0")] == [None, None]  # retries: 1
    assert [start("exits-worker-0"), start("exits-worker-0")] == [None, None]  # retries: 1 + 1
    assert start("exits-worker-1") is None  # a first start is no retry
    refused = start("exits-worker-1")  # 3 retries > 2
    assert refused is not None and "3 times, more than restart.backoff_limit (2)" in refused


def test_a_start_after_the_pods_sigterm_is_not_a_retry(tmp_path):
    """Issue #19 point 9 on a PyTorchJob: preemption (the pod's SIGTERM) does not spend backoff_limit."""
    count, refused = launch.count_start(tmp_path, "s1", "exits-master-0", limit=0)
    assert refused is None
    starts, stops = count.read()
    count.write(starts, stops + 1)  # what main() records when the pod's SIGTERM ended the run
    assert launch.count_start(tmp_path, "s1", "exits-master-0", limit=0)[1] is None
    assert launch.count_start(tmp_path, "s1", "exits-master-0", limit=0)[1] is not None  # a real retry


def test_pytorchjob_exit_code_renders_the_retry_limit_and_the_submission_key():
    spec = JobSpec.model_validate(
        {
            "name": "e",
            "image": "i:1",
            "command": ["python", "t.py"],
            "restart": {"policy": "exit-code", "backoff_limit": 4},
        }
    )
    (pytorchjob,) = [o for o in render.render(spec, api="pytorchjob") if o["kind"] == "PyTorchJob"]
    (container,) = pytorchjob["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env[launch.ENV_RETRY_LIMIT]["value"] == "4"
    assert env[launch.ENV_SUBMISSION]["valueFrom"] == {
        "fieldRef": {"fieldPath": f"metadata.annotations['{naming.ANNOTATION_SUBMISSION}']"}
    }
    assert container["command"][:3] == LAUNCHER  # a command job too: the exit code decides here
    (trainjob,) = [o for o in render.render(spec, api="trainjob") if o["kind"] == "TrainJob"]
    names = {e["name"] for e in trainjob["spec"]["trainer"]["env"]}
    assert launch.ENV_RETRY_LIMIT not in names  # the Job's backoffLimit bounds a TrainJob's retries


def test_the_exit_code_is_the_cause_not_the_ranks_torch_stopped_after_it():
    class Failure:
        def __init__(self, exitcode: int) -> None:
            self.exitcode = exitcode

    # torch lists the failure it saw first, then the workers it stopped (SIGTERM; 143 from a trainer that
    # checkpointed on it; SIGKILL after the shutdown timeout)
    assert launch.exit_code({1: Failure(1), 0: Failure(-signal.SIGTERM)}) == 1
    assert launch.exit_code({1: Failure(2), 0: Failure(143)}) == 2
    assert launch.exit_code({0: Failure(-signal.SIGKILL), 1: Failure(-signal.SIGTERM)}) == 137  # an OOM kill
    assert (
        launch.exit_code({0: Failure(1), 1: Failure(-signal.SIGABRT)}) == 134
    )  # a crash anywhere is a cause
    assert launch.exit_code({0: Failure(143)}) == 143  # a worker that says it was stopped


def test_a_sigkill_seen_with_a_raise_is_the_cause_unless_the_agent_sent_it_after_the_timeout():
    class Failure:
        def __init__(self, exitcode: int, timestamp: int) -> None:
            self.exitcode, self.timestamp = exitcode, timestamp

    # one poll, in rank order: rank 0 raised on the connection its SIGKILLed peer reset
    assert launch.exit_code({0: Failure(1, 100), 1: Failure(-signal.SIGKILL, 101)}) == 137
    # rank 0 raised; rank 1 ignored the agent's SIGTERM and was SIGKILLed after the shutdown timeout
    assert launch.exit_code({0: Failure(1, 100), 1: Failure(-signal.SIGKILL, 131)}) == 1
    assert launch.exit_code({0: Failure(1, 100), 1: Failure(-signal.SIGTERM, 100)}) == 1


def test_the_pod_launcher_turns_on_nccls_flight_recorder_dumping_into_the_output_dir():
    """#31: env only (no GPU here): what the ranks inherit; a value the job's env sets is kept, under either of
    the buffer size's names (torch 2.11's would take precedence over the job's old one)."""
    env = {"ORCH_OUTPUT_DIR": "/orch/output", "TORCH_NCCL_TRACE_BUFFER_SIZE": "50"}
    launch.set_worker_env(env)
    assert env == {
        "ORCH_OUTPUT_DIR": "/orch/output",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "50",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": "/orch/output/nccl-traces/rank_",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/orch/output/nccl-traces/rank_",
    }
    env = {"ORCH_OUTPUT_DIR": "/orch/output", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}
    launch.set_worker_env(env)
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "0" and len(set(env) & set(outputs.TRACE_BUFFER_NAMES)) == 1


@pytest.mark.parametrize(
    "version, name",
    [
        ("2.13.0+cpu", "TORCH_FR_BUFFER_SIZE"),
        ("2.11.0a0+git1234", "TORCH_FR_BUFFER_SIZE"),
        ("3.0.0", "TORCH_FR_BUFFER_SIZE"),
        ("2.10.1", "TORCH_NCCL_TRACE_BUFFER_SIZE"),  # ProcessGroupNCCL read only the old name
        ("2.4.0", "TORCH_NCCL_TRACE_BUFFER_SIZE"),
        # a torch whose version cannot be read: the name every release reads
        ("", "TORCH_NCCL_TRACE_BUFFER_SIZE"),
    ],
)
def test_the_flight_recorders_buffer_goes_under_the_name_the_torch_reads_without_a_warning(version, name):
    """torch 2.11+ warns on every rank that TORCH_NCCL_TRACE_BUFFER_SIZE is deprecated (c10d/Utils.hpp's
    WARN_ENV_VAR_ONCE from FlightRecorder.hpp's getCvarInt); exactly one of the two names is set."""
    settings = outputs.nccl_trace_env("/out", torch_version=version)
    assert settings[name] == str(outputs.NCCL_TRACE_ENTRIES)
    assert len(set(settings) & set(outputs.TRACE_BUFFER_NAMES)) == 1


# --- one restart rule for both launchers (#33) ------------------------------------------------------------------


def refusing_job(name: str) -> dict:
    """One process whose task refuses its input (exit 2) under restart.policy job, 2 restarts allowed."""
    spec = job(name, max_steps=4, task="tests.spec.exit_code_tasks:refuses", task_args={"rank": 0})
    return spec | {
        "image": "i:1",
        "metrics": {"enabled": False},
        "restart": {"policy": "job", "max_restarts": 2},
    }


def test_orch_run_does_not_restart_a_refusal_under_restart_policy_job(tmp_path):
    """#33: `orch run` restarted a rank that exited 2, so the refusal (a resume on changed data, say) happened
    max_restarts + 1 times. A refusal ends the run at once, and the line says why it was not restarted."""
    out = tmp_path / "out"
    run = orch_run(write_job(tmp_path, refusing_job("refused")), out, env={"ORCH_METRICS_PORT": "0"})
    assert run.returncode == exit_codes.REFUSED, run.stderr  # the rank's own code (its class kept)
    assert (out / "starts-0").read_text() == "started\n"  # one start: not restarted
    tasks = Path(REPO, "tests", "spec", "exit_code_tasks.py").read_text().splitlines()
    raised = next(n for n, text in enumerate(tasks, 1) if "raise DataError" in text)
    assert run.stderr.splitlines()[-1] == (
        "error: rank 0 failed (exit code 2, not restarted: a restart would end the same way): DataError: "
        f"deliberate refusal on rank 0 (at tests/spec/exit_code_tasks.py:{raised} in refuses); its output: "
        f"{out}/logs/rank-0.log"
    )
    assert (
        "restarting all" not in run.stdout and "error: deliberate" not in run.stdout
    )  # said once, at the end


def test_a_pods_torchrun_does_not_restart_a_refusal_under_restart_policy_job(tmp_path):
    """The same rule in a pod: a PyTorchJob's restart.policy job is torchrun's elastic agent with
    maxRestarts, whose restarts the launcher ends on a refusal; the container exits 2 (permanent)."""
    spec = JobSpec.model_validate(refusing_job("refused-pod"))
    found = {o["kind"]: o for o in render.render(spec, api="pytorchjob")}
    job_spec = found["PyTorchJob"]["spec"]
    elastic = job_spec["elasticPolicy"]
    assert elastic["maxRestarts"] == 2
    (container,) = job_spec["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    command = pod_command(container["command"], found["ConfigMap"], tmp_path / "etc-orch")
    out = tmp_path / "out"
    operator_env = elastic_operator_env(job_spec)  # as tests/spec/test_restart_launch.py plays the operator
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    result = run_pod(
        command, env | operator_env | {"ORCH_OUTPUT_DIR": str(out), "TMPDIR": str(tmp_path)}, out
    )
    assert result.returncode == exit_codes.REFUSED, result.stderr[-3000:]
    assert (out / "starts-0").read_text() == "started\n"
    assert "exit code 2 (permanent)" in result.stderr
