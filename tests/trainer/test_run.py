"""`orch run` end to end: real processes, real gloo, the trainer module a pod runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator import outputs
from tests.trainer.conftest import ORCH as ORCH_CMD
from tests.trainer.conftest import REPO, Run, job, orch_run, write_job

pytestmark = pytest.mark.slow
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
# Examples that can run here: a train section and no cluster volumes to read data from.
LOCAL_EXAMPLES = [
    p for p in EXAMPLES if "train" in (d := yaml.safe_load(p.read_text())) and not d.get("volumes")
]


# The demo's 300 steps to >= 95% accuracy are `make demo`'s to show (docs/testing.md): 4 steps of it run here.
@pytest.mark.parametrize("example", LOCAL_EXAMPLES, ids=lambda p: p.stem)
def test_each_local_example_runs(example, tmp_path):
    run = orch_run(example, tmp_path / "out", "--steps", "4")
    assert run.returncode == 0, run.stderr
    summary = run.summary
    assert summary["steps"] == 4 and summary["final_loss"] is not None
    if yaml.safe_load(example.read_text())["train"]["task"] == "gpt":
        assert summary["tokens_per_second"] > 0
    if example.stem == "gpt-fsdp":  # the gpt example under FSDP (was test_fsdp.py's own run of gpt.yaml)
        assert (summary["parallel"], summary["precision"]) == ("fsdp", "bf16")
        # the blocks and the root are sharded over the 2 processes: each holds about half the model
        state = run.state_dict()
        whole = sum(t.numel() * t.element_size() for t in state.values()) - (
            state["head.weight"].numel() * 4  # tied to tokens.weight: held once
        )
        assert 0.45 * whole <= summary["memory"]["parameter_bytes"] <= 0.55 * whole
    if "accuracy" in (summary.get("eval") or {}):  # make demo prints the accuracy reached, on the last line
        last = run.stdout.splitlines()[-1]
        assert last.startswith(f"result: eval accuracy {summary['eval']['accuracy']:.4f}, "), last


# test_equivalence_across_world_sizes_and_accumulation is in test_fsdp.py: it reads the runs at 1, 2 and 4
# processes that the FSDP comparison reads too.


def test_procs_that_do_not_divide_the_batch_are_refused(run_job):
    run = run_job(job("nodiv", batch_size=16, micro_batch_size=4), "--procs", "3")
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "error: --procs 3: batch_size 16 is not divisible by micro_batch_size 4 x world size 3; "
        "pick a batch_size that is a multiple of 12"
    ]
    assert not run.out.exists()  # nothing half-done


def test_a_failing_rank_is_reported_with_its_error(run_job):
    spec = job("fails", task="tests.trainer.plugin_tasks:fails_on_rank", task_args={"rank": 1})
    run = run_job(spec, "--procs", "2")
    assert run.returncode == 1
    # One line: the first failing rank, its exception, where it was raised, and its log; no tracebacks.
    assert run.stderr.strip().splitlines() == [
        "error: rank 1 failed (exit code 1): ValueError: deliberate failure on rank 1 "
        f"(at tests/trainer/plugin_tasks.py:42 in fails_on_rank); its output: {run.out}/logs/rank-1.log"
    ]
    assert "Traceback" not in run.stdout
    # Every rank's whole output is kept.
    log = (run.out / "logs" / "rank-1.log").read_text()
    assert "Traceback (most recent call last):" in log and "ValueError: deliberate failure on rank 1" in log
    assert (run.out / "logs" / "rank-0.log").exists()


def test_task_factories_that_do_not_fit_are_clear_errors():
    from orchestrator.trainer.tasks import build_task

    with pytest.raises(ValueError, match="returned dict, not orchestrator.trainer.tasks.Task"):
        build_task("tests.trainer.plugin_tasks:not_a_task", {})
    with pytest.raises(
        ValueError, match="task_args do not fit task 'digits'.*unexpected keyword argument 'layers'"
    ):
        build_task("digits", {"layers": 3})
    with pytest.raises(ValueError, match="cannot import tests.trainer.nowhere:make"):
        build_task("tests.trainer.nowhere:make", {})


def nan_job(name: str, **train) -> dict:
    return job(
        name,
        task="tests.trainer.plugin_tasks:poisoned",
        task_args={"step": 5, "accumulation": 2, "factor": 1e39},  # beyond float32: inf inputs
        micro_batch_size=4,
        batch_size=16,
        **train,
    )


def test_nonfinite_loss_stops_with_a_clear_message(run_job):
    run = run_job(nan_job("nanstop"), "--procs", "2")
    assert run.returncode == 1
    message = run.stderr.strip().splitlines()[-1]
    assert "loss or gradient is not finite at step 6" in message
    assert "train.nonfinite_loss: skip" in message


def test_nonfinite_loss_can_be_skipped(run_job):
    run = run_job(nan_job("nanskip", nonfinite_loss="skip"), "--procs", "2")
    assert run.returncode == 0, run.stderr
    assert run.summary["skipped_steps"] == 1 and run.summary["steps"] == 12


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])  # fsdp: ShardedGradScaler, fp16 MixedPrecisionPolicy
def test_fp16_overflow_is_skipped_and_counted(run_job, parallel):
    spec = job(
        "fp16",
        precision="fp16",
        parallel=parallel,
        task="tests.trainer.plugin_tasks:poisoned",
        # classification: its gradients stay within fp16 at the initial scale 2**16, so the only
        # overflow is the injected one (a regression with targets ~ N(0, 16) overflows a few times first)
        task_args={"step": 3, "accumulation": 2, "factor": 1e6, "kind": "classification"},
    )
    run = run_job(spec, "--procs", "2")
    assert run.returncode == 0, run.stderr
    assert run.summary["skipped_steps"] == 1
    assert run.summary["loss_scale"] == 32768.0  # 2**16 halved once


@pytest.mark.smoke  # the fast tier's end-to-end `orch run` (2 ranks)
def test_training_job_output_layout_and_plain_log_lines(run_job, tmp_path, monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    out = tmp_path / "layout"
    spec = job(
        "layout",
        task="tests.trainer.plugin_tasks:env_probe",  # the synthetic task, recording the trainer's env
        task_args={"names": ["PYTORCH_CUDA_ALLOC_CONF", "OMP_NUM_THREADS", *outputs.nccl_trace_env(".")]},
        eval_every=6,
        checkpoint={"every_steps": 4, "keep": 2},
    )
    run = run_job(spec, "--procs", "2", out=out)
    assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000008", "step-00000012"]
    summary = run.summary
    assert set(summary) >= {
        "steps", "samples", "final_loss", "eval", "samples_per_second", "wall_seconds", "world_size",
        "accumulation", "precision", "tokens_per_second",
    }  # fmt: skip
    assert summary["samples"] == 12 * 16 and set(summary["eval"]) == {"loss"}
    assert (out / "train.json").exists()
    import torch

    state = torch.load(out / "model.pt", weights_only=True)
    assert set(state) == {"0.weight", "0.bias", "2.weight", "2.bias"}  # unwrapped: no "module." prefix
    # The job's allocator setting, since the environment had none; a thread pool per share of the cores.
    assert json.loads((out / "env.json").read_text()) == {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // 2)),
        **outputs.nccl_trace_env(out.resolve()),  # NCCL's flight recorder, dumping into OUT (#31)
    }
    # The flight recorder's buffer under the name this torch reads without warning on every rank (#31).
    assert "is deprecated; use" not in run.stdout + run.stderr
    # Not a terminal: plain lines every log_every steps, the evals, and the result last.
    assert "\r" not in run.stdout
    lines = run.stdout.splitlines()
    assert [line.split("  ")[0] for line in lines if line.startswith(("step ", "eval "))] == [
        "step 4/12", "eval at step 6: loss " + f"{_eval_loss_at(out, 6):.4f}", "step 8/12", "step 12/12",
        "eval at step 12: loss " + f"{summary['eval']['loss']:.4f}",
    ]  # fmt: skip
    assert lines[-1].startswith("result: eval loss ")  # regression: no other eval metric


def _eval_loss_at(out: Path, step: int) -> float:
    events = [json.loads(line) for line in (out / "progress.jsonl").read_text().splitlines()]
    return next(e["loss"] for e in events if e["event"] == "eval" and e["step"] == step)


def test_default_output_directory(tmp_path):
    from datetime import datetime

    from orchestrator import local
    from orchestrator.job import loading
    from tests.trainer.conftest import write_job

    spec = loading.load_job(str(write_job(tmp_path, job("named"))))
    plan = local.plan(spec, now=datetime(2026, 1, 2, 3, 4, 5))
    assert plan.output_dir == Path("runs/named-20260102-030405")


def test_default_output_directories_are_unique_and_a_held_one_is_refused(tmp_path, monkeypatch):
    """Two runs of a job started in the same second get two directories; an --out in use is refused."""
    from datetime import datetime

    from orchestrator import local
    from orchestrator.job import loading
    from tests.trainer.conftest import write_job

    monkeypatch.chdir(tmp_path)
    spec = loading.load_job(str(write_job(tmp_path, job("twice"))))
    now = datetime(2026, 1, 2, 3, 4, 5)
    with local.claim(local.plan(spec, now=now)) as first, local.claim(local.plan(spec, now=now)) as second:
        assert (first.output_dir, second.output_dir) == (
            Path("runs/twice-20260102-030405"),
            Path("runs/twice-20260102-030405-2"),
        )
        assert second.env["ORCH_OUTPUT_DIR"] == str(tmp_path / "runs/twice-20260102-030405-2")
        # A chosen --out that a live run holds: refused before anything is written into it.
        held = local.plan(spec, output_dir=str(first.output_dir))
        with (
            pytest.raises(local.OutputDirBusy, match=r"twice-20260102-030405/ is in use by another orch run"),
            local.claim(held),
        ):
            pass
        run = orch_run(tmp_path / "twice.yaml", tmp_path / first.output_dir)
        assert run.returncode == 2
        assert run.stderr.strip().splitlines() == [
            f"error: {tmp_path / first.output_dir}/ is in use by another orch run: wait for it to finish, "
            "or pass another --out"
        ]
        assert sorted(p.name for p in first.output_dir.iterdir()) == ["run.lock"]
    with local.claim(held) as again:  # released with the run
        assert again.output_dir == first.output_dir


def test_an_output_directory_that_cannot_be_created_is_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    run = orch_run(REPO / "examples" / "digits.yaml", tmp_path / "file" / "out")
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        f"error: --out {tmp_path}/file/out: cannot create it: Not a directory"
    ]


def test_a_gpu_job_on_a_machine_without_gpus_says_so_once_and_leaves_nothing_in_tmp(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    spec = job("gpuless", max_steps=2, log_every=1)
    spec["gpus_per_node"] = 1
    run = orch_run(write_job(tmp_path, spec), tmp_path / "out", env={"TMPDIR": str(scratch)})
    assert run.returncode == 0, run.stderr
    warning = (
        "warning: the job asks for 1 GPU per node but this machine has none (torch sees no CUDA device): "
        "running 1 process on the CPU with gloo"
    )
    assert run.stderr.splitlines().count(warning) == 1, run.stderr
    assert run.summary["device"] == "cpu"
    # torch's elastic log folders (torchelastic_*), metrics files, the live-run index: none left behind.
    # (torchinductor_USER is torch's compile cache, one per user and reused by every run: not a leftover.)
    assert [p.name for p in scratch.iterdir() if not p.name.startswith("torchinductor_")] == []
    assert not (tmp_path / "out" / ".metrics").exists()


def test_command_jobs_run_under_the_launcher_with_the_job_environment(tmp_path):
    script = (
        "import os, pathlib; "
        "pathlib.Path(os.environ['ORCH_OUTPUT_DIR'], 'rank-' + os.environ['RANK']).write_text("
        "os.environ['WORLD_SIZE'] + ' ' + os.environ['ORCH_JOB_NAME'] + ' ' + os.environ['GREETING'])"
    )
    spec = {"name": "byo", "nodes": 1, "procs_per_node": 2, "command": [sys.executable, "-c", script],
            "env": {"GREETING": "hello"}}  # fmt: skip
    job_file = tmp_path / "byo.yaml"
    job_file.write_text(yaml.safe_dump(spec))
    run = orch_run(job_file, tmp_path / "out")
    assert run.returncode == 0, run.stderr
    assert {p.name: p.read_text() for p in (tmp_path / "out").glob("rank-*")} == {
        "rank-0": "2 byo hello",
        "rank-1": "2 byo hello",
    }
    assert "metrics:" not in run.stdout  # only the trainer serves metrics


def test_the_rendered_pod_command_trains(tmp_path):
    """Run the container command of the rendered PyTorchJob, with the operator's pod env, on this machine."""
    import socket

    from orchestrator.job import loading
    from orchestrator.rendering import render

    objects = render.render(loading.load_job(str(REPO / "examples" / "digits.yaml")))
    config_map = next(o for o in objects if o["kind"] == "ConfigMap")
    pytorchjob = next(o for o in objects if o["kind"] == "PyTorchJob")
    container = pytorchjob["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    train = json.loads(config_map["data"]["train.json"])
    train["max_steps"] = 20  # short; everything else as rendered
    (tmp_path / "train.json").write_text(json.dumps(train))
    command = [
        str(tmp_path / "train.json") if arg == "/etc/orch/train.json" else arg for arg in container["command"]
    ]
    assert command[:3] == ["python", "-m", "orchestrator.launch"]
    command[0] = sys.executable
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {
        **os.environ,
        **{e["name"]: e["value"] for e in container["env"] if "value" in e},
        "ORCH_OUTPUT_DIR": str(tmp_path / "output"),  # an emptyDir in the pod
        "ORCH_METRICS_PORT": "0",  # the metrics tests own the exporter
        "TMPDIR": str(tmp_path),  # torchrun's log folder (torchelastic_*) goes with the test's
        # What the training operator sets on the Master pod: RANK is the pod's index, not a process rank.
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "2",
        "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port), "PET_NNODES": "1", "PET_NODE_RANK": "0",
    }  # fmt: skip
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "output" / "summary.json").read_text())
    assert (summary["steps"], summary["world_size"], summary["accumulation"]) == (20, 2, 2)
    assert summary["job"] == "digits-ddp"
    assert (tmp_path / "output" / "checkpoints" / "step-00000020").is_dir()


@pytest.fixture(scope="module")
def plateau_run(tmp_path_factory) -> Run:
    """One run for the plateau schedule and the on_eval string (two features of the eval, one launch).
    threshold 0.99: only a 99% lower loss counts as better, so every eval after the first is a bad one."""
    tmp = tmp_path_factory.mktemp("plateau")
    spec = job(
        "plateau",
        eval_every=3,
        schedule={"name": "plateau", "patience": 0, "factor": 0.5, "threshold": 0.99},
        task="tests.trainer.plugin_tasks:eval_says",
        task_args={"value": "good", "samples": 256, "eval_samples": 64},
    )
    run = orch_run(write_job(tmp, spec), tmp / "out")
    assert run.returncode == 0, run.stderr[-2000:]
    return run


def test_plateau_lowers_the_rate_when_the_eval_loss_stops_improving(plateau_run):
    events = [json.loads(line) for line in (plateau_run.out / "progress.jsonl").read_text().splitlines()]
    # evals after steps 3 (best), 6 (bad: x 0.5) and 9 (bad: x 0.5); lr is logged at steps 4, 8, 12
    assert [e["lr"] for e in events if e["event"] == "step"] == [0.05, 0.025, 0.0125]
    assert plateau_run.stdout.count("loss plateaued: learning rate x 0.5") == 2


def test_plan_resolves_steps_procs_and_refuses_what_cannot_run(tmp_path):
    from orchestrator import local
    from orchestrator.errors import UsageError
    from orchestrator.job import loading
    from tests.trainer.conftest import write_job

    spec = loading.load_job(str(write_job(tmp_path, job("plan", epochs=3, max_steps=None))))
    plan = local.plan(spec, procs=4, steps=7, output_dir=str(tmp_path / "o"))
    assert (plan.world_size, plan.accumulation, plan.train.max_steps, plan.train.epochs) == (4, 1, 7, None)
    assert plan.env["ORCH_OUTPUT_DIR"] == str(tmp_path / "o") and plan.env["ORCH_JOB_NAME"] == "plan"
    with pytest.raises(UsageError, match="--procs 3: batch_size 16 is not divisible"):
        local.plan(spec, procs=3)
    command = loading.load_job(str(REPO / "examples" / "custom-command.yaml"))
    with pytest.raises(UsageError, match="--steps applies to train jobs only"):
        local.plan(command, steps=5)


def test_plan_gives_the_processes_the_jobs_exporter_settings(tmp_path):
    from orchestrator import local
    from orchestrator.job import loading
    from tests.trainer.conftest import write_job

    path = str(write_job(tmp_path, job("metered")))
    spec = loading.load_job(path, ["metrics.port=9555", "metrics.peak_tflops=312"])
    env = local.plan(spec, output_dir=str(tmp_path / "o")).env
    assert (env["ORCH_METRICS_PORT"], env["ORCH_GPU_SAMPLE_SECONDS"], env["ORCH_PEAK_TFLOPS"]) == (
        "9555", "5.0", "312.0",
    )  # fmt: skip
    off = loading.load_job(path, ["metrics.enabled=false"])
    assert local.plan(off, output_dir=str(tmp_path / "o")).env["ORCH_METRICS_PORT"] == "0"


def test_local_metrics_listen_on_loopback_move_off_a_taken_port_and_top_finds_them(tmp_path):
    import re
    import signal
    import socket

    from tests.trainer.test_faults import steps_logged, wait_for

    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "PROMETHEUS_MULTIPROC"))}
    env["XDG_RUNTIME_DIR"] = str(tmp_path)  # the live-run index `orch top --local` reads
    spec = job("metered", max_steps=100000, task_args={"samples": 256, "sample_delay": 0.01})
    with socket.socket() as busy:  # another program holds the job's port
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        spec["metrics"] = {"port": port}
        process = subprocess.Popen(
            [*ORCH_CMD, "run", str(write_job(tmp_path, spec)), "--out", str(tmp_path / "out"), "--procs", "2"],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            # Rank 0 says where it serves once it listens there (#24: bound before announced, no race)
            lines = [process.stdout.readline().strip()]
            while not lines[-1].startswith("metrics: ") and len(lines) < 5:
                lines.append(process.stdout.readline().strip())
            line = lines[-1]
            match = re.fullmatch(
                rf"metrics: http://127\.0\.0\.1:(\d+)/metrics \(port {port} is in use\)", line
            )
            assert match, line
            chosen = int(match.group(1))
            assert chosen != port
            with socket.socket() as late, pytest.raises(OSError, match="in use"):
                late.bind(("127.0.0.1", chosen))  # already the exporter's: nobody can take it now

            def top() -> dict:
                result = subprocess.run(
                    [*ORCH_CMD, "top", "metered", "--local", "--once", "-o", "json"],
                    cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
                )  # fmt: skip
                return json.loads(result.stdout) if result.returncode == 0 else {}

            # Training first (a file to read), then `orch top` (a Python start each, ~0.5 CPU-s: not a poll
            # to repeat through the ranks' torch imports)
            wait_for(lambda: steps_logged(tmp_path / "out" / "progress.jsonl") > 0, what="the first steps")
            wait_for(lambda: {r["rank"] for r in top().get("rows", [])} == {0, 1}, what="orch top --local")
            # The exporter listens on the loopback address only (/proc/net/tcp: 0100007F, state 0A = LISTEN).
            listening = [
                fields[1]
                for fields in (row.split() for row in Path("/proc/net/tcp").read_text().splitlines()[1:])
                if fields[3] == "0A" and int(fields[1].split(":")[1], 16) == chosen
            ]
            assert listening == [f"0100007F:{chosen:04X}"]
        finally:
            process.send_signal(signal.SIGINT)
            process.communicate(timeout=120)
    assert list(tmp_path.glob("orch-*")) == []  # the index entry went with the run
    assert not (tmp_path / "out" / ".metrics").exists()


def test_the_rank_that_failed_is_named_not_one_the_launcher_stopped(tmp_path):
    """#24.3: rank 0 stopped by the launcher (SIGTERM: -15, or the trainer's 143 after its stop checkpoint)
    and rank 1 failing with exit code 3, neither with an error file (a `command:` job): rank 1 is named.
    torch's own ProcessFailure/ChildFailedError records, as the launcher hands them over."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from orchestrator import local
    from orchestrator.local.processes import _failure_message

    plan = local.plan(load_spec(tmp_path))
    for stopped in (-15, 143):
        failures = {
            0: ProcessFailure(local_rank=0, pid=10, exitcode=stopped, error_file=str(tmp_path / "none-0")),
            1: ProcessFailure(local_rank=1, pid=11, exitcode=3, error_file=str(tmp_path / "none-1")),
        }
        message, code = _failure_message(ChildFailedError("w", failures), plan, tmp_path)
        assert message == f"rank 1 failed (exit code 3): no error recorded; its output: {tmp_path}/rank-1.log"
        assert code == 3  # orch run's exit code: the named rank's (#33)


def load_spec(tmp_path: Path):
    from orchestrator.job import loading

    path = tmp_path / "job.yaml"
    path.write_text("name: t\ncommand: [python, x.py]\nprocs_per_node: 2\n")
    return loading.load_job(path)


def test_extending_a_run_says_the_schedule_is_stretched(run_job, tmp_path):
    """#24.3: --steps 10 after a run of 6 with a linear schedule: the resume names the jump in the rate."""
    spec = job("stretch", max_steps=6, schedule={"name": "linear"}, checkpoint={"every_steps": 3})
    out = tmp_path / "stretch"
    assert run_job(spec, out=out).returncode == 0
    again = run_job(spec, "--steps", "10", out=out)
    assert again.returncode == 0, again.stderr
    assert (
        "note: the linear schedule now decays over 10 steps, not the 6 of the run that wrote the checkpoint "
        "(train.max_steps or --steps changed): the rate is recomputed for the new length; learning rate at "
        "step 6: 0 -> 0.02"
    ) in again.stdout


# --- the launcher trusts nothing the trainer leaves (#25, class 8) -------------------------------------


def test_a_task_that_calls_sys_exit_0_is_one_line_not_a_traceback(run_job):
    spec = job("exits", task="tests.trainer.plugin_tasks:exits_early", task_args={"at_step": 3})
    run = run_job(spec, "--procs", "2")
    assert "Traceback" not in run.stderr, run.stderr[-2000:]
    assert run.returncode == 1
    assert run.stderr.strip().splitlines()[-1] == (
        "error: every process exited 0 but the trainer wrote no summary.json: the run did not finish "
        f"(does the task call sys.exit()?); their output: {run.out}/logs/"
    )


def test_one_rank_that_exits_0_early_is_named_as_what_its_peer_failed_waiting_for(run_job):
    """#33: rank 1 ends with exit code 0 at its third step while rank 0 goes on; rank 0 fails in its next
    collective. The line named rank 0's connection error alone; it now names rank 1 first, and exits 1
    (rank 0's exception: permanent), not after train.collective_timeout."""
    spec = job("early", task="tests.spec.exit_code_tasks:exits_0_on_rank", task_args={"rank": 1, "at_step": 3},
               max_steps=40, collective_timeout="10m")  # fmt: skip
    run = run_job(spec, "--procs", "2", timeout=240)
    assert run.returncode == 1, run.stderr[-2000:]
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith(
        f"error: rank 1 exited 0 while the other ranks still ran (output: {run.out}/logs/rank-1.log), and a "
        "rank that ends early leaves its peers waiting for it in their next collective; then rank 0 failed "
        "(exit code 1): "
    ), line


def test_an_on_eval_string_reaches_the_result_line(plateau_run):
    assert "eval verdict good" in plateau_run.stdout.splitlines()[-1]


def test_an_on_eval_value_of_another_kind_fails_where_it_enters(run_job):
    spec = job("says", task="tests.trainer.plugin_tasks:eval_says", task_args={"value": [1, 2]})
    run = run_job(spec)
    assert run.returncode == 1
    assert "TypeError: Task.on_eval returned 'verdict': [1, 2], not a number or a string" in run.stderr


def test_two_runs_with_one_absolute_checkpoint_dir_cannot_both_run(tmp_path):
    """Issue #25, class 10: different --out, the same train.checkpoint.dir. The second used to resume from
    the first's live checkpoints and delete its writes in flight; now it stops before touching anything."""
    import time

    shared, release = tmp_path / "shared-checkpoints", tmp_path / "release"
    first_spec = job(
        "first",
        max_steps=12,
        checkpoint={"every_steps": 4, "dir": str(shared)},
        task="tests.trainer.plugin_tasks:held_in",
        task_args={"directory": str(shared), "step": 4, "release": str(release), "samples": 256},
    )
    first = subprocess.Popen(
        [*ORCH_CMD, "run", str(write_job(tmp_path, first_spec)), "--out", str(tmp_path / "a")],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not (shared / "step-00000004").exists():
            assert first.poll() is None and time.monotonic() < deadline, "the first run never checkpointed"
            time.sleep(0.1)
        second = orch_run(
            write_job(tmp_path, job("second", checkpoint={"every_steps": 4, "dir": str(shared)})),
            tmp_path / "b",
        )
        assert second.returncode == 1
        (line,) = second.stderr.strip().splitlines()
        assert f"checkpoint directory {shared} is in use by another run (job first, host " in line, line
        assert sorted(p.name for p in shared.iterdir()) == ["step-00000004"]  # nothing of the first's touched
    finally:
        release.touch()
        out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-3000:]
