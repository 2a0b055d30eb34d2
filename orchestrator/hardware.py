"""Failures that say the hardware is bad: their exit code, how they are recognised, and the record a pod leaves
for `orch status` (its termination message). Stdlib only: a pod's launcher (PID 1) imports it first thing.

Three things make a failure "hardware" (docs/cluster.md, "Suspected nodes"):
- the pre-flight check failed (`train.preflight`, orchestrator/trainer/preflight.py): a rank's GPU has a
  problem NVML names, or a rank was far slower than the others or never reported; the trainer exits
  `EXIT_CODE` and leaves its verdict in OUT/preflight.json;
- a rank died of a CUDA error that only bad hardware or a broken driver raises (`SIGNATURES`: uncorrectable
  ECC or NVLink errors, a GPU fallen off the bus, ...), or of an error that quotes an Xid: the launcher
  reads it from torch's error file and names that rank's own GPU;
- (NCCL network errors are not: they do not say which end of a link is bad.)

The record: the pod's launcher (orchestrator/launch.py) writes one JSON object to the container's
termination-message file (`/dev/termination-log`, Kubernetes' default `terminationMessagePath`, which the
kubelet mounts). The kubelet keeps the file's last 4096 bytes in the container's `state.terminated.message`
(and `lastState` after a restart in place: pkg/kubelet/kuberuntime/kuberuntime_container.go
`getTerminationMessage`, limit `kubecontainer.MaxContainerTerminationMessageLength`), readable by whoever may
read the pod, with no permission given to the pod itself. `read_record` reads it back; orchestrator/status.py
resolves each suspect's host to its pod and node for `orch status`.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# A hardware failure's exit code: >= 128, so retryable under restart.policy exit-code (the v1 operator and
# a TrainJob's podFailurePolicy retry it with a new pod, which may land elsewhere), and above every 128 +
# signal (signals end at 64), so it is never mistaken for one.
EXIT_CODE = 200
CLASS_HARDWARE, CLASS_RETRYABLE, CLASS_PERMANENT = "hardware", "retryable", "permanent"

TERMINATION_LOG = "/dev/termination-log"  # the default terminationMessagePath (orch renders no other)
ENV_TERMINATION_LOG = (
    "ORCH_TERMINATION_LOG"  # another path (tests, or a pod_overrides' terminationMessagePath)
)
MAX_MESSAGE = 4096  # bytes of the file the kubelet keeps (its tail)
RECORD_KEY = "orch"  # {"orch": RECORD_VERSION, ...}: tells orch's record from any other termination message
RECORD_VERSION = 1

# CUDA errors (their cudaGetErrorString text) and driver messages that bad hardware or a broken driver raise,
# never a program: (pattern, what it means).
SIGNATURES = (
    (re.compile(r"uncorrectable ECC error", re.I), "uncorrectable ECC error"),
    (re.compile(r"uncorrectable NVLink error", re.I), "uncorrectable NVLink error"),
    (re.compile(r"fallen off the bus|GPU is lost", re.I), "the GPU fell off the bus"),
    (re.compile(r"device\(s\) is/are busy or unavailable", re.I), "the GPU is busy or unavailable"),
    (re.compile(r"hardware stack error", re.I), "GPU hardware stack error"),
    (re.compile(r"system not yet initialized", re.I), "the GPU fabric is not up (NVIDIA fabric manager)"),
)
# "Xid 79", "Xid: 79", the kernel's "NVRM: Xid (PCI:0000:3b:00): 79, pid=..."
XID = re.compile(r"\bXid\b(?: \(PCI:[0-9A-Fa-f:.]+\))?:? *(\d{1,3})\b")


@dataclass(frozen=True)
class Suspect:
    """A rank whose node (and GPU) a failure points at."""

    host: str  # the pod's host name (its name; JobSet pods: spec.hostname), "?" when not known
    node_rank: int  # -1 when not known
    reason: str
    rank: int = -1
    device: str = ""  # cuda:N
    gpu_uuid: str = ""


@dataclass(frozen=True)
class Record:
    """What a pod's launcher leaves in its termination message."""

    exit_code: int
    exit_class: str
    suspects: tuple[Suspect, ...] = ()


def signature(text: str) -> str | None:
    """What a failure's text says about the hardware ("uncorrectable ECC error", "Xid 79"), or None."""
    for pattern, meaning in SIGNATURES:
        if pattern.search(text):
            return meaning
    found = XID.search(text)
    return f"Xid {found[1]}" if found else None


def preflight_suspects(verdict: dict[str, Any]) -> tuple[Suspect, ...]:
    """The suspects of a pre-flight verdict (OUT/preflight.json as the trainer wrote it)."""
    found = []
    for item in verdict.get("suspects") or []:
        if isinstance(item, dict):
            found.append(_suspect(item, default_reason="failed the pre-flight check"))
    return tuple(found)


def write_record(record: Record, path: str | Path | None = None) -> bool:
    """The record as this container's termination message, cut to what the kubelet keeps; False (nothing
    written) outside Kubernetes, where no termination-message file is mounted, or where it cannot be written
    (the exit code still says the class)."""
    target = Path(path or os.environ.get(ENV_TERMINATION_LOG) or TERMINATION_LOG)
    if not target.exists():
        return False
    try:
        target.write_text(encode(record), encoding="utf-8")
    except OSError:
        return False
    return True


def encode(record: Record) -> str:
    """One JSON object of at most MAX_MESSAGE bytes: reasons are cut first, then suspects left out (counted)."""
    suspects = [asdict(s) for s in record.suspects]
    document: dict[str, Any] = {RECORD_KEY: RECORD_VERSION, "exit_code": record.exit_code,
                                "class": record.exit_class, "suspects": suspects}  # fmt: skip
    for item in suspects:
        if len(item["reason"]) > 300:
            item["reason"] = item["reason"][:297] + "..."
    text = json.dumps(document, ensure_ascii=False)
    while len(text.encode()) > MAX_MESSAGE and suspects:
        suspects.pop()
        document["omitted"] = document.get("omitted", 0) + 1
        text = json.dumps(document, ensure_ascii=False)
    return text


def read_record(message: Any) -> Record | None:
    """The record in a container's termination message, or None when it holds none of orch's (any text,
    truncated JSON, wrong types: total, as `orch status` must be)."""
    if not isinstance(message, str) or RECORD_KEY not in message:
        return None
    try:
        document = json.loads(message)
    except ValueError:
        return None
    if not isinstance(document, dict) or document.get(RECORD_KEY) != RECORD_VERSION:
        return None
    code = document.get("exit_code")
    suspects = document.get("suspects")
    return Record(
        exit_code=code if isinstance(code, int) and not isinstance(code, bool) else -1,
        exit_class=str(document.get("class") or ""),
        suspects=tuple(_suspect(s) for s in suspects if isinstance(s, dict))
        if isinstance(suspects, list)
        else (),
    )


def _suspect(item: dict[str, Any], *, default_reason: str = "") -> Suspect:
    def number(key: str) -> int:
        value = item.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else -1

    def text(key: str, default: str = "") -> str:
        value = item.get(key)
        return value if isinstance(value, str) and value else default

    return Suspect(
        host=text("host", "?"),
        node_rank=number("node_rank"),
        reason=text("reason", default_reason),
        rank=number("rank"),
        device=text("device"),
        gpu_uuid=text("gpu_uuid"),
    )
