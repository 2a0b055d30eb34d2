"""The pre-flight check (train.preflight, orchestrator/trainer/preflight.py): a bad or far slower rank stops the
job before step 0, named, and a pod's launcher leaves the verdict where `orch status` reads it.

There is no GPU here: a GPU rank's health comes from the fake NVML of tests/metrics/fake_gpu.py (FakeGpuReader,
standing in for gpu.NvmlReader) and NvmlReader's own calls are checked against a stand-in `pynvml` module. The
barrier and the verdict run for real on torch's c10d HashStore, one thread per rank (a store is what the ranks
of a job meet through). One real run of the rendered pod command (orchestrator.launch over torchrun, 2 CPU
processes on gloo) injects a slow rank through the check's test hook (ORCH_PREFLIGHT_SLOW_RANK).
"""

from __future__ import annotations

import json
import threading
import types

import pytest
import torch.distributed as torch_dist

from orchestrator import hardware, launch, outputs, runtime_env
from orchestrator.job.spec import JobSpec
from orchestrator.rendering import render
from orchestrator.trainer import gpu, preflight
from orchestrator.trainer.config import TrainSpec
from orchestrator.trainer.preflight import Identity, Report, Suspect
from tests.metrics.fake_gpu import FAKE_DEVICES, FakeGpuReader
from tests.metrics.test_gpu import FakeNvml
from tests.spec.test_exit_codes import run_pod
from tests.spec.test_restart_launch import pod_command
from tests.spec.test_torchrun_launch import free_port
from tests.trainer.conftest import job


def who(rank: int, node_rank: int = 0, gpu_uuid: str = "") -> Identity:
    return Identity(rank, node_rank, rank % 8, f"host-{node_rank}", f"cuda:{rank % 8}", gpu_uuid)


def report(rank: int, matmul: float, *, node_rank: int = 0, problems: tuple[str, ...] = ()) -> Report:
    return Report(who(rank, node_rank), {"matmul": matmul, "h2d_copy": 0.01}, problems)


# --- the judgement: far slower, GPU problems -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("matmuls", "slow"),
    [
        ([0.10, 0.10], []),
        ([0.10, 0.149], []),  # 1.49 x the other's: within max_slowdown 1.5
        ([0.10, 0.16], [1]),  # two ranks: each compared with the other alone
        ([0.10, 0.11, 0.09, 0.30], [3]),
        ([0.10, 0.30, 0.31, 0.29], []),  # one rank faster than the rest is no suspect, nor are they
        ([0.10, 0.30, 0.31, 0.10], [1, 2]),  # two slow ranks of four: both named
        ([0.50, 0.10, 0.10, 0.10, 0.10, 0.10, 0.10, 0.70], [0, 7]),
    ],
)
def test_a_rank_far_slower_than_the_median_of_the_others_is_a_suspect(matmuls, slow):
    reports = [report(rank, seconds) for rank, seconds in enumerate(matmuls)]
    verdict = preflight.judge(reports, [], max_slowdown=1.5, timeout=60)
    assert [s.identity.rank for s in verdict.suspects] == slow
    assert verdict.ok == (not slow)
    for suspect in verdict.suspects:
        assert suspect.reason.startswith("far slower: matmul") and "max_slowdown 1.5" in suspect.reason


def test_every_part_of_the_work_is_compared_on_its_own():
    reports = [report(0, 0.1), report(1, 0.1), Report(who(2), {"matmul": 0.1, "h2d_copy": 0.05})]
    (suspect,) = preflight.judge(reports, [], max_slowdown=2, timeout=60).suspects
    assert suspect.identity.rank == 2 and suspect.reason.startswith("far slower: h2d_copy 0.05 s, 5.0x")


def test_a_gpu_problem_and_a_missing_rank_are_suspects_and_the_line_names_them():
    missing = Suspect(who(3, node_rank=1), "started its checks but did not report within 60 s")
    reports = [
        report(0, 0.1),
        report(1, 0.1, problems=("2 uncorrected ECC error(s) since the driver loaded",)),
    ]
    verdict = preflight.judge(reports, [missing], max_slowdown=1.5, timeout=60)
    assert [s.identity.rank for s in verdict.suspects] == [1, 3]
    assert verdict.failure() == (
        "preflight: 2 bad ranks: rank 1 (node rank 0, host host-0, cuda:1): 2 uncorrected ECC error(s) since "
        "the driver loaded; rank 3 (node rank 1, host host-1, cuda:3): started its checks but did not report "
        "within 60 s"
    )
    assert preflight.from_dict(json.loads(json.dumps(verdict.to_dict()))) == verdict  # as the others read it


# --- a GPU's health, from the fake NVML ------------------------------------------------------------------------


def test_a_healthy_gpu_passes_and_a_bad_one_is_named_by_what_nvml_says():
    """FakeGpuReader (tests/metrics/fake_gpu.py) stands in for NVML: there is no GPU here."""
    bad = gpu.GpuHealth(uncorrected_ecc=2, remapped_rows_pending=True, remapping_failed=True,
                        clock_event_reasons=0x8 | 0x40 | 0x4, sm_clock_hertz=0.6e9, sm_clock_max_hertz=1.98e9)  # fmt: skip
    reader = FakeGpuReader(health={1: bad}, xids={1: [79, 79]})
    healthy = FakeGpuReader()
    work = lambda: {"matmul": 0.004, "h2d_copy": 0.011}  # noqa: E731
    fine = preflight.check_gpu(who(0, gpu_uuid=FAKE_DEVICES[0].uuid), healthy, work)
    assert fine.problems == () and fine.unchecked == () and fine.seconds == work()
    assert healthy.closed
    broken = preflight.check_gpu(who(1, gpu_uuid=FAKE_DEVICES[1].uuid), reader, work)
    assert broken.problems == (
        "2 uncorrected ECC error(s) since the driver loaded",
        "a memory row remapping waits for a GPU reset",
        "a memory row could not be remapped (the GPU needs replacing)",
        "clocks held down by hw_slowdown, hw_thermal_slowdown (SM 600 of 1980 MHz)",
        "Xid 79 reported during the check",
    )
    (suspect,) = preflight.judge([fine, broken], [], max_slowdown=1.5, timeout=60).suspects
    assert suspect.identity.gpu_uuid == FAKE_DEVICES[1].uuid


def test_what_nvml_cannot_tell_is_said_not_failed():
    no_events = preflight.check_gpu(
        who(0, gpu_uuid="GPU-x"), FakeGpuReader(xids={0: None}), lambda: {"matmul": 1.0}
    )
    assert no_events.problems == () and no_events.unchecked == ("Xid events",)
    no_nvml = preflight.check_gpu(who(0, gpu_uuid="GPU-x"), None, lambda: {"matmul": 1.0})
    assert no_nvml.unchecked == ("GPU health (no NVML)",)
    verdict = preflight.judge([no_events, no_nvml], [], max_slowdown=1.5, timeout=60)
    assert verdict.ok and verdict.summary().endswith("not checked: GPU health (no NVML), Xid events")


class HealthNvml(FakeNvml):
    """The pynvml stand-in of tests/metrics/test_gpu.py, with the health calls (NVML's own return values)."""

    NVML_FEATURE_ENABLED, nvmlEventTypeXidCriticalError = 1, 0x8

    class NVMLError_Timeout(FakeNvml.NVMLError):
        pass

    def __init__(self, events=()):
        super().__init__()
        self.events, self.freed = list(events), False

    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter):
        return 3 if error_type == self.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else 0

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h):
        raise self.NVMLError_NotSupported()  # Ampere and later remap rows instead

    def nvmlDeviceGetRemappedRows(self, h):
        return (0, 1, 1, 0)  # corrected rows, uncorrected rows, pending, failure

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return 0x40

    def nvmlEventSetCreate(self):
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h, types_, events):
        assert types_ == self.nvmlEventTypeXidCriticalError and events == "event-set"

    def nvmlEventSetWait_v2(self, events, timeout_ms):
        assert timeout_ms == 0  # never waits
        if not self.events:
            raise self.NVMLError_Timeout()
        return types.SimpleNamespace(eventData=self.events.pop(0))

    def nvmlEventSetFree(self, events):
        self.freed = True


def test_nvml_reader_reads_health_and_xid_events_in_nvmls_terms():
    nvml = HealthNvml(events=[48])
    reader = gpu.NvmlReader(nvml)
    device = gpu.GpuDevice(index=0, uuid="GPU-abc")
    health = reader.health(device)
    assert (health.uncorrected_ecc, health.retired_pages_pending) == (3, None)  # not supported: None
    assert (health.remapped_rows_pending, health.remapping_failed) == (True, False)
    assert health.clock_event_reasons == 0x40 and health.sm_clock_hertz == 1.755e9
    watch = reader.watch_xid(device)
    assert watch.seen() == [48] and watch.seen() == []
    watch.close()
    assert nvml.freed


# --- the barrier and the verdict, on a real c10d store ---------------------------------------------------------


def ranks_agree(
    world_size: int, check, *, stuck: int | None = None, timeout: int = 1
) -> dict[int, preflight.Verdict]:
    """Every rank's `agree` on one HashStore, a thread each; `check(rank)` is that rank's checks. The
    verdicts of every rank but `stuck` (whose checks do not return)."""
    store = torch_dist.HashStore()
    verdicts: dict[int, preflight.Verdict] = {}

    def rank_main(rank: int) -> None:
        verdicts[rank] = preflight.agree(
            store, who(rank, node_rank=rank // 2), lambda: check(rank), world_size=world_size,
            local_world_size=2, timeout=timeout, max_slowdown=1.5,
        )  # fmt: skip

    threads = [threading.Thread(target=rank_main, args=(rank,), daemon=True) for rank in range(world_size)]
    for thread in threads:
        thread.start()
    for rank, thread in enumerate(threads):
        if rank != stuck:
            thread.join(timeout=60)
    return verdicts


def test_every_rank_gets_rank_zeros_verdict_naming_a_slow_rank():
    verdicts = ranks_agree(4, lambda rank: report(rank, 0.5 if rank == 2 else 0.1, node_rank=rank // 2))
    assert sorted(verdicts) == [0, 1, 2, 3]
    assert len({v.to_dict()["suspects"][0]["rank"] for v in verdicts.values()}) == 1
    assert all(v == verdicts[0] for v in verdicts.values())
    (suspect,) = verdicts[0].suspects
    assert suspect.identity == who(2, node_rank=1)


def test_a_rank_stuck_in_its_checks_is_named_after_the_timeout_by_its_announcement():
    release = threading.Event()

    def check(rank: int) -> Report:
        if rank == 3:
            release.wait(60)  # stuck in its checks (a driver call that never returns)
        return report(rank, 0.1, node_rank=rank // 2)

    verdicts = ranks_agree(4, check, stuck=3)
    release.set()
    assert sorted(verdicts) == [0, 1, 2]
    for rank in (0, 1, 2):  # rank 3 is still stuck when the others give up on it
        (suspect,) = verdicts[rank].suspects
        assert suspect.identity == who(3, node_rank=1)  # named by what it announced before its checks
        assert suspect.reason == "started its checks but did not report within 1 s"


def test_a_rank_zero_that_never_judges_is_named_by_the_others():
    release = threading.Event()

    def check(rank: int) -> Report:
        if rank == 0:
            release.wait(60)
        return report(rank, 0.1)

    verdicts = ranks_agree(2, check, stuck=0)
    release.set()
    (suspect,) = verdicts[1].suspects
    assert suspect.identity == who(0) and suspect.reason.startswith("gave no verdict within 2 s")


def test_a_rank_that_never_started_is_named_by_its_rank_and_node():
    store = torch_dist.HashStore()
    for rank in (0, 1, 2):
        store.set(f"{preflight.KEYS}/report/{rank}", json.dumps(preflight.asdict(report(rank, 0.1))))
    reports, missing = preflight.collect(store, 4, 1, local_world_size=2)
    assert len(reports) == 3
    assert [(s.identity.rank, s.identity.node_rank, s.reason) for s in missing] == [
        (3, 1, "did not start its checks within 1 s")
    ]


# --- the setting -------------------------------------------------------------------------------------------------


def test_preflight_is_a_switch_or_its_settings_and_train_json_leaves_the_default_out():
    assert TrainSpec.model_validate({"preflight": True}).preflight.enabled is True
    custom = TrainSpec.model_validate({"preflight": {"max_slowdown": 3, "timeout": "30s"}}).preflight
    assert (custom.enabled, custom.max_slowdown, custom.timeout) == (None, 3.0, 30)
    assert "preflight" not in json.loads(runtime_env.train_json(TrainSpec()))  # older trainers read it
    explicit = runtime_env.train_json(TrainSpec.model_validate({"preflight": False}))
    assert runtime_env.load_train_json(explicit).preflight.enabled is False
    for bad in ({"max_slowdown": 1}, {"timeout": 0}, {"enabled": "maybe"}, {"slowdown": 2}):
        with pytest.raises(ValueError):
            TrainSpec.model_validate({"preflight": bad})


@pytest.mark.parametrize(("setting", "device", "on"), [(None, "cuda", True), (None, "cpu", False),
                                                        (True, "cpu", True), (False, "cuda", False)])  # fmt: skip
def test_the_check_is_on_for_gpu_jobs_unless_asked(setting, device, on):
    import torch

    assert preflight.enabled(TrainSpec.model_validate({"preflight": {"enabled": setting}}).preflight,
                             torch.device(device)) is on  # fmt: skip


# --- one pod, for real: the launcher's exit code and termination message ---------------------------------------


def test_a_slow_rank_fails_the_pod_before_step_0_with_the_node_named_in_its_termination_message(tmp_path):
    """The rendered PyTorchJob container command (orchestrator.launch over torchrun, 2 processes on gloo),
    with the v1 operator's env for a Master pod played as a dict (as tests/spec/test_exit_codes.py does) and
    the kubelet's termination-message file as a plain file (ORCH_TERMINATION_LOG)."""
    spec_dict = job("pf", procs=2, preflight={"enabled": True, "timeout": "2m"})
    spec = JobSpec.model_validate(spec_dict | {"image": "i:1", "metrics": {"enabled": False}})
    found = {o["kind"]: o for o in render.render(spec, api="pytorchjob")}
    (container,) = found["PyTorchJob"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"][
        "containers"
    ]
    command = pod_command(container["command"], found["ConfigMap"], tmp_path / "etc-orch")
    out, termination_log = tmp_path / "out", tmp_path / "termination-log"
    termination_log.touch()  # the kubelet mounts it before the container starts
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e} | {
        "PYTHONUNBUFFERED": "1", "PET_NPROC_PER_NODE": "2", "PET_NNODES": "1", "PET_NODE_RANK": "0",
        "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(free_port()), "ORCH_OUTPUT_DIR": str(out),
        "TMPDIR": str(tmp_path), preflight.ENV_SLOW_RANK: "1", hardware.ENV_TERMINATION_LOG: str(termination_log),
    }  # fmt: skip
    result = run_pod(command, env, out)

    assert result.returncode == hardware.EXIT_CODE, result.stderr[-3000:]
    assert "error: preflight: 1 bad rank: rank 1 (node rank 0, host " in result.stderr
    assert f"exit code {hardware.EXIT_CODE} (hardware)" in result.stderr
    assert "orch: suspected node: host " in result.stderr
    assert not (out / outputs.SUMMARY).exists() and not (out / outputs.CHECKPOINTS).exists()  # no step ran
    verdict = json.loads((out / outputs.PREFLIGHT).read_text())
    assert not verdict["ok"] and [s["rank"] for s in verdict["suspects"]] == [1]
    fast, slow = (r["seconds"]["matmul"] for r in verdict["ranks"])
    assert slow > 1.5 * fast  # the hook's tenfold work, measured in CPU time
    record = hardware.read_record(termination_log.read_text())
    assert record is not None and (record.exit_code, record.exit_class) == (hardware.EXIT_CODE, "hardware")
    (suspect,) = record.suspects
    assert (suspect.rank, suspect.node_rank, suspect.device) == (1, 0, "cpu")
    assert suspect.host == verdict["suspects"][0]["host"] and suspect.reason.startswith("far slower: matmul")
    assert launch.classify({}, 1, out).exit_class == "permanent"  # (the verdict alone makes no class)
