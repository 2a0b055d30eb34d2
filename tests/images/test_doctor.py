"""`orch doctor`: judging facts (pure), gathering them (real torch probe, real NVML load failure, real
/dev/shm), and the command's output and exit code.

No GPU exists on this machine, so the GPU side is faked, and only there: a stand-in `pynvml` module
(same function names as nvidia-ml-py) and a fake `nvidia-smi` script on PATH printing what the real one
prints. The no-GPU path uses the real NVML library lookup, which fails here as on any CPU machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator import doctor
from orchestrator.doctor import FAIL, OK, WARN, Check, GpuFacts, LocalFacts

ORCH = str(Path(sys.executable).with_name("orch"))
GiB = doctor.GiB

CUDA_TORCH = {
    "version": "2.11.0+cu128", "cuda": "12.8", "cudnn": 91002, "nccl": "2.28.9", "cuda_available": True,
    "device_count": 2, "devices": ["NVIDIA H200", "NVIDIA H200"], "bf16": True,
}  # fmt: skip
TWO_H200 = GpuFacts(source="nvml", names=["NVIDIA H200"] * 2, memory_bytes=[141 * GiB] * 2,
                    driver_version="570.86.15", cuda_driver_version="12.8")  # fmt: skip


def facts(**changes: object) -> LocalFacts:
    base = {
        "python_version": "3.11.7",
        "torch": CUDA_TORCH,
        "gpus": TWO_H200,
        "shm_bytes": 64 * GiB,
        "env": {},
    }
    return LocalFacts(**{**base, **changes})


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {check.name: check for check in checks}


# --- judging -----------------------------------------------------------------------------------------


def test_healthy_gpu_machine_is_all_ok() -> None:
    checks = doctor.judge_local(facts())
    assert [(c.name, c.status, c.detail) for c in checks] == [
        ("python", OK, "3.11.7"),
        ("torch", OK, "2.11.0+cu128"),
        ("torch CUDA build", OK, "built for CUDA 12.8"),
        ("GPUs", OK, "2 x NVIDIA H200 (141 GiB) via nvml"),
        ("NVIDIA driver", OK, "driver 570.86.15, supports CUDA 12.8"),
        ("CUDA available", OK, "2 device(s): NVIDIA H200, NVIDIA H200"),
        ("cuDNN", OK, "9.10.2"),
        ("NCCL", OK, "2.28.9"),
        ("bf16", OK, "supported"),
        ("/dev/shm", OK, "64.00 GiB"),
        ("NCCL/CUDA env", OK, "nothing set"),
    ]


def test_missing_gpu_with_cuda_torch_fails_with_a_fix() -> None:
    no_gpu = GpuFacts(error="NVML: Driver Not Loaded")
    torch = {**CUDA_TORCH, "cuda_available": False, "device_count": 0, "devices": []}
    checks = by_name(doctor.judge_local(facts(gpus=no_gpu, torch=torch)))
    assert checks["GPUs"] == Check(
        "GPUs", FAIL, "no NVIDIA GPU visible (NVML: Driver Not Loaded)",
        "check the driver with `nvidia-smi`; in a container run with `--gpus all` / request nvidia.com/gpu; "
        "unset an empty CUDA_VISIBLE_DEVICES",
    )  # fmt: skip
    assert checks["CUDA available"].status == WARN  # the GPU line already carries the failure


def test_cpu_torch_on_a_cpu_machine_only_warns() -> None:
    cpu_torch = {"version": "2.13.0+cpu", "cuda": None, "cudnn": None, "nccl": None, "cuda_available": False,
                 "device_count": 0, "devices": [], "bf16": None}  # fmt: skip
    checks = doctor.judge_local(facts(torch=cpu_torch, gpus=GpuFacts(error="NVML: not found")))
    assert {c.name: c.status for c in checks} == {
        "python": OK, "torch": OK, "torch CUDA build": WARN, "GPUs": WARN, "/dev/shm": OK, "NCCL/CUDA env": OK,
    }  # fmt: skip


def test_cpu_torch_with_gpus_present_fails() -> None:
    cpu_torch = {**CUDA_TORCH, "version": "2.13.0+cpu", "cuda": None, "cuda_available": False}
    check = by_name(doctor.judge_local(facts(torch=cpu_torch)))["torch CUDA build"]
    assert check.status == FAIL and "CUDA build of torch" in check.fix


@pytest.mark.parametrize(
    ("size", "status"), [(64 << 20, FAIL), (255 << 20, FAIL), (512 << 20, WARN), (GiB, OK), (None, WARN)]
)
def test_shm_thresholds(size: int | None, status: str) -> None:
    check = by_name(doctor.judge_local(facts(shm_bytes=size)))["/dev/shm"]
    assert check.status == status
    if status == FAIL:
        assert check.detail.endswith("too small for NCCL and DataLoader workers")
        assert "--shm-size" in check.fix and "resources.shm" in check.fix


def test_driver_older_than_torch_cuda() -> None:
    old = GpuFacts(**{**TWO_H200.__dict__, "driver_version": "535.104", "cuda_driver_version": "12.2"})
    assert (
        by_name(doctor.judge_local(facts(gpus=old)))["NVIDIA driver"].status == WARN
    )  # minor-version compat
    ancient = GpuFacts(**{**TWO_H200.__dict__, "driver_version": "470.1", "cuda_driver_version": "11.4"})
    check = by_name(doctor.judge_local(facts(gpus=ancient)))["NVIDIA driver"]
    assert check.status == FAIL and "CUDA 12.x" in check.fix


def test_no_bf16_and_broken_torch() -> None:
    assert by_name(doctor.judge_local(facts(torch={**CUDA_TORCH, "bf16": False})))["bf16"].fix == (
        "set train.precision: fp16 (or fp32) in job.yaml"
    )
    broken = by_name(
        doctor.judge_local(facts(torch={"error": "ModuleNotFoundError: No module named 'torch'"}))
    )
    assert broken["torch"].status == FAIL and "orch-trainer[train]" in broken["torch"].fix


@pytest.mark.parametrize(
    ("env", "status"),
    [
        ({"NCCL_DEBUG": "WARN", "NCCL_SOCKET_IFNAME": "eth0"}, OK),
        ({"NCCL_P2P_DISABLE": "1"}, WARN),
        ({"NCCL_IB_DISABLE": "0"}, OK),
        ({"NCCL_DEBUG": "INFO"}, WARN),
        ({"CUDA_VISIBLE_DEVICES": ""}, FAIL),
    ],
)
def test_nccl_env(env: dict[str, str], status: str) -> None:
    assert by_name(doctor.judge_local(facts(env=env)))["NCCL/CUDA env"].status == status


# --- gathering ----------------------------------------------------------------------------------------


@pytest.mark.launch  # doctor runs its torch probe in a Python subprocess (tests/tiers.py cannot see it)
def test_torch_probe_reads_the_real_torch() -> None:
    import importlib.metadata

    torch_was_imported = "torch" in sys.modules  # other tests in this pytest process may have imported it
    probed = doctor.probe_torch()
    assert probed["version"].split("+")[0] == importlib.metadata.version("torch").split("+")[0]
    assert probed["cuda_available"] is False  # no GPU on this machine
    assert ("torch" in sys.modules) == torch_was_imported  # the probe ran in a child process


def test_real_nvml_without_a_gpu_reports_why() -> None:
    gpus = doctor.probe_nvml()  # the real nvidia-ml-py; the NVML library itself is absent here
    assert gpus.source is None and gpus.error.startswith("NVML: ")


class FakeNvml:
    """Stands in for pynvml on a machine with two H200s (no GPU exists here)."""

    def __init__(self) -> None:
        self.shutdown = False

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None:
        self.shutdown = True

    def nvmlSystemGetDriverVersion(self) -> str:
        return "570.86.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12080

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return b"NVIDIA H200"

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(total=141 * GiB)


def test_nvml_gpus() -> None:
    nvml = FakeNvml()
    assert doctor.probe_nvml(nvml) == TWO_H200
    assert nvml.shutdown


FAKE_NVIDIA_SMI = """#!/bin/sh
if [ "$1" = "--query-gpu=name,memory.total,driver_version" ]; then
  echo "NVIDIA H100 80GB HBM3, 81559, 550.54.15"
  echo "NVIDIA H100 80GB HBM3, 81559, 550.54.15"
else
  echo "| NVIDIA-SMI 550.54.15    Driver Version: 550.54.15    CUDA Version: 12.4     |"
fi
"""


@pytest.mark.launch  # doctor runs the nvidia-smi stand-in (tests/tiers.py cannot see it)
def test_nvidia_smi_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (tmp_path / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    gathered = doctor.gather_local()  # real NVML fails to load here, so doctor falls back to nvidia-smi
    assert gathered.gpus == GpuFacts(source="nvidia-smi", names=["NVIDIA H100 80GB HBM3"] * 2,
                                     memory_bytes=[81559 << 20] * 2, driver_version="550.54.15",
                                     cuda_driver_version="12.4")  # fmt: skip
    # CPU torch + GPUs present: doctor says torch is the wrong build.
    assert by_name(doctor.judge_local(gathered))["torch CUDA build"].status == FAIL


def test_shm_size_of_the_real_dev_shm() -> None:
    size = doctor.shm_size()
    assert size is None or size > 0
    assert doctor.shm_size("/does/not/exist") is None


# --- the command ----------------------------------------------------------------------------------------


def test_doctor_command_on_this_machine() -> None:
    result = subprocess.run([ORCH, "doctor", "-o", "json"], capture_output=True, text=True, timeout=120)
    checks = json.loads(result.stdout)
    assert {c["name"] for c in checks} >= {"python", "torch", "GPUs", "/dev/shm", "NCCL/CUDA env"}
    failed = any(c["status"] == FAIL for c in checks)
    assert result.returncode == (1 if failed else 0)
    gpu = next(c for c in checks if c["name"] == "GPUs")
    assert gpu["status"] in (WARN, FAIL) and gpu["fix"]  # this machine has no GPU


def test_doctor_table_fails_when_torch_does_not_import() -> None:
    """The torch probe's answer is replaced (a broken torch cannot be installed here); the rest is real."""
    script = (
        "import sys; from orchestrator import doctor, cli;"
        "doctor.probe_torch = lambda: {'error': 'ModuleNotFoundError: No module named torch'};"
        "sys.argv = ['orch', 'doctor']; cli.main()"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "FAIL  torch" in result.stdout
    assert "fix: pip install 'orch-trainer[train]'" in result.stdout
    assert result.stdout.strip().splitlines()[-1].startswith("1 failed")  # GPUs only WARN without torch


# --- a job that compiles needs a C compiler (Triton builds its kernels with one at the first step) --------


def test_a_compiling_job_without_a_c_compiler_fails_with_the_image_fix() -> None:
    assert "C compiler (train.compile)" not in by_name(doctor.judge_local(facts(c_compiler=None)))
    check = by_name(doctor.judge_local(facts(c_compiler=None), compiles=True))["C compiler (train.compile)"]
    assert check.status == FAIL and "Triton" in check.detail
    assert "apt-get install -y --no-install-recommends gcc" in check.fix and "-devel image" in check.fix
    ok = by_name(doctor.judge_local(facts(c_compiler="/usr/bin/gcc"), compiles=True))[
        "C compiler (train.compile)"
    ]
    assert (ok.status, ok.detail) == (OK, "/usr/bin/gcc")


def test_doctor_with_a_compiling_job_file_on_a_machine_without_a_compiler(tmp_path: Path) -> None:
    """The real command and the real PATH lookup, on a PATH that holds only the venv (no gcc, clang, cc)."""
    job = tmp_path / "job.yaml"
    job.write_text("name: comp\ntrain:\n  task: digits\n  compile: true\n")
    env = {k: v for k, v in os.environ.items() if k != "CC"}
    env["PATH"] = str(Path(ORCH).parent)
    result = subprocess.run([ORCH, "doctor", str(job), "-o", "json"], capture_output=True, text=True,
                            timeout=120, env=env)  # fmt: skip
    checks = {c["name"]: c for c in json.loads(result.stdout)}
    assert checks["C compiler (train.compile)"]["status"] == FAIL and result.returncode == 1
    env["PATH"] = os.environ["PATH"]  # this machine has gcc
    without = subprocess.run([ORCH, "doctor", str(job), "-o", "json"], capture_output=True, text=True,
                             timeout=120, env=env)  # fmt: skip
    assert {c["name"]: c for c in json.loads(without.stdout)}["C compiler (train.compile)"]["status"] == OK
