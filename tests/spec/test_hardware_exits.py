"""The launcher's exit classes for hardware (orchestrator/launch.py `classify`, orchestrator/hardware.py): which
failures say bad hardware, the exit code they end the pod with, and the termination-message record.

torch's ProcessFailure is played by a namespace with the fields the launcher reads (exitcode, local_rank, and
message: the exception text torch's @record wrote to the rank's error file)."""

from __future__ import annotations

import json
import types

import pytest

from orchestrator import hardware, launch, outputs

CUDA_ECC = "torch.AcceleratorError: CUDA error: uncorrectable ECC error encountered"


def failure(exitcode: int, message: str = "", local_rank: int = 0) -> types.SimpleNamespace:
    return types.SimpleNamespace(exitcode=exitcode, message=message, local_rank=local_rank)


@pytest.mark.parametrize(
    ("text", "meaning"),
    [
        (CUDA_ECC, "uncorrectable ECC error"),
        ("RuntimeError: CUDA error: uncorrectable NVLink error detected during the execution", "uncorrectable NVLink error"),
        ("NVML: Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost", "the GPU fell off the bus"),
        ("RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable", "the GPU is busy or unavailable"),
        ("RuntimeError: CUDA error: system not yet initialized", "the GPU fabric is not up (NVIDIA fabric manager)"),
        ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.", "the GPU fell off the bus"),
        ("the driver reported Xid 48 on this GPU", "Xid 48"),
        ("NVRM: Xid (PCI:0000:3b:00): 94, pid=2311, Contained: CE User Channel (0x9)", "Xid 94"),
        ("Xid: 13", "Xid 13"),
        ("Xidx 12 of 4000 samples", None),
        ("RuntimeError: CUDA error: an illegal memory access was encountered", None),  # a program's bug
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", None),
        ("ValueError: deliberate error on rank 1", None),
        ("NCCL error: remote process exited or there was a network error, NCCL version 2.21.5", None),
    ],
)  # fmt: skip
def test_only_errors_that_bad_hardware_raises_are_hardware(text, meaning):
    assert hardware.signature(text) == meaning


def test_a_rank_dead_of_a_hardware_error_names_this_pod_and_its_gpu_and_ends_retryable(tmp_path, monkeypatch):
    monkeypatch.setenv("PET_NODE_RANK", "3")
    failures = {
        25: failure(1, CUDA_ECC + "\n\nCompile with `TORCH_USE_CUDA_DSA`", local_rank=1),
        24: failure(-15),
    }
    record = launch.classify(failures, 1, tmp_path, host="demo-worker-2")
    assert (record.exit_code, record.exit_class) == (hardware.EXIT_CODE, "hardware")
    assert hardware.EXIT_CODE >= launch.SIGNAL_BASE + 64  # retryable, and no signal's code
    assert record.suspects == (
        hardware.Suspect(host="demo-worker-2", node_rank=3, reason=f"uncorrectable ECC error: {CUDA_ECC}",
                         rank=25, device="cuda:1"),
    )  # fmt: skip


def test_a_failed_preflight_takes_its_suspects_from_the_verdict(tmp_path):
    suspect = {"rank": 3, "node_rank": 1, "local_rank": 1, "host": "demo-worker-0", "device": "cuda:1",
               "gpu_uuid": "GPU-1", "reason": "2 uncorrected ECC error(s) since the driver loaded"}  # fmt: skip
    outputs.write_json(tmp_path / outputs.PREFLIGHT, {"ok": False, "suspects": [suspect]})
    record = launch.classify({0: failure(hardware.EXIT_CODE)}, hardware.EXIT_CODE, tmp_path)
    assert (record.exit_code, record.exit_class) == (hardware.EXIT_CODE, "hardware")
    assert record.suspects == (hardware.Suspect("demo-worker-0", 1, suspect["reason"], 3, "cuda:1", "GPU-1"),)
    missing = launch.classify({0: failure(hardware.EXIT_CODE)}, hardware.EXIT_CODE, tmp_path / "none")
    assert missing.exit_class == "hardware" and missing.suspects == ()  # the class stands; no node is named


@pytest.mark.parametrize(
    ("code", "cls"), [(1, "permanent"), (2, "permanent"), (137, "retryable"), (143, "retryable")]
)
def test_other_failures_keep_their_code_and_class(tmp_path, code, cls):
    record = launch.classify({0: failure(code, "ValueError: no")}, code, tmp_path)
    assert (record.exit_code, record.exit_class, record.suspects) == (code, cls, ())


def test_the_record_fits_the_kubelets_4096_bytes_and_reads_back(tmp_path):
    many = tuple(hardware.Suspect(f"host-{i}", i, "far slower: " + "x" * 400, i, f"cuda:{i % 8}", "GPU-" + "f" * 36)
                 for i in range(64))  # fmt: skip
    text = hardware.encode(hardware.Record(hardware.EXIT_CODE, "hardware", many))
    assert len(text.encode()) <= hardware.MAX_MESSAGE
    document = json.loads(text)
    kept = len(document["suspects"])
    assert 0 < kept < 64 and document["omitted"] == 64 - kept
    record = hardware.read_record(text)
    assert record.suspects[0].host == "host-0" and record.suspects[0].reason.endswith("...")
    assert len(record.suspects[0].reason) == 300

    log = tmp_path / "termination-log"
    assert not hardware.write_record(record, log)  # not mounted: outside Kubernetes nothing is written
    (tmp_path / "unwritable").mkdir()  # a path that exists and cannot be written (as root too)
    assert not hardware.write_record(record, tmp_path / "unwritable")  # no traceback at the pod's exit
    log.touch()
    assert hardware.write_record(record, log) and hardware.read_record(
        log.read_text()
    ) == hardware.read_record(hardware.encode(record))
