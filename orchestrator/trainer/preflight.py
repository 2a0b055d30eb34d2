"""The pre-flight check (`train.preflight`): before step 0 every rank checks what it can, and the job fails at
once, naming the node and GPU, when a rank is bad or far slower than the others, instead of training at the
slowest rank's pace (or dying of its GPU hours later).

It runs in the trainer's first seconds, once the process group has formed and before the task is built
(docs/trainer.md, "Pre-flight check", says why there and not in an init container). Each rank:

1. writes who it is (rank, node rank, host, device, GPU UUID) into the job's c10d store, the one the group
   met through, so that a rank which gets stuck in its checks can still be named;
2. checks its GPU through NVML (`gpu.NvmlReader.health`): uncorrected ECC errors, pages waiting to be
   retired, row remapping pending or failed, clocks held down by the hardware, and any Xid error the driver
   reports while the check runs (CUDA only);
3. times a fixed piece of work: a matmul (on GPUs also a host-to-device copy of pinned memory), in wall time
   on a GPU and in CPU time on a CPU (which a loaded machine does not stretch);
4. writes its report into the store. Rank 0 waits for every report (at most `timeout`: the barrier), judges
   them (`judge`) and writes the verdict there; the others wait for it (a rank 0 that never gives one is
   the suspect then). Every rank thus fails or goes on together;
5. when every rank is fine: a barrier and a timed all-reduce on the training backend (NCCL or gloo), whose
   sum each rank checks.

A rank is bad when NVML names a problem, when it did not report within `timeout`, or when a part of its timed
work took more than `max_slowdown` times the median of the other ranks' time for that part. The verdict is
written to OUT/preflight.json (`outputs.PREFLIGHT`) by every rank, pass or fail; a failure raises
`PreflightFailed`, which the entrypoint ends with `hardware.EXIT_CODE`, and the pod's launcher turns the
verdict into the record `orch status` reads (orchestrator/hardware.py).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator import outputs

if TYPE_CHECKING:
    import torch

    from orchestrator.trainer.config import PreflightSpec
    from orchestrator.trainer.dist import Dist

# Test hook (tests/trainer/test_preflight.py): this rank does its timed work SLOW_REPEATS times over, as a GPU
# at a tenth of its speed would. Read by nothing else.
ENV_SLOW_RANK = "ORCH_PREFLIGHT_SLOW_RANK"
SLOW_REPEATS = 10
KEYS = "orch/preflight"  # in the job's store, which dist.init prefixes per attempt
# Rank 0 waits `timeout` for the reports, then judges: the others wait that long, and this much more.
VERDICT_GRACE = 2.0

# The timed work: sized to take milliseconds on a datacenter GPU and ~0.1 s of CPU time on a CPU core.
GPU_MATMUL = (4096, 20)  # n x n bf16, 20 times: 2.7 TFLOP
GPU_COPY = (256 << 20, 4)  # bytes of pinned host memory copied to the GPU, 4 times
CPU_MATMUL = (256, 200)  # n x n fp32, 200 times: 6.7 GFLOP
ALLREDUCE_ELEMENTS = {"cuda": 16 << 20, "cpu": 256 << 10}  # fp32: 64 MiB on GPUs, 1 MiB on CPUs
ALLREDUCE_ITERATIONS = 5


class PreflightFailed(RuntimeError):
    """A rank is bad or far slower than the others: the message names it; `verdict` is what was written."""

    def __init__(self, verdict: Verdict) -> None:
        super().__init__(verdict.failure())
        self.verdict = verdict


@dataclass(frozen=True)
class Identity:
    """Where a rank runs: what names it in a verdict (and, through `host`, its node in `orch status`)."""

    rank: int
    node_rank: int
    local_rank: int
    host: str
    device: str
    gpu_uuid: str = ""

    def describe(self) -> str:
        gpu = f" {self.gpu_uuid}" if self.gpu_uuid else ""
        return f"rank {self.rank} (node rank {self.node_rank}, host {self.host}, {self.device}{gpu})"


@dataclass(frozen=True)
class Report:
    """One rank's checks: its timed work in seconds by part, what is wrong with its GPU, what went unchecked."""

    identity: Identity
    seconds: dict[str, float]
    problems: tuple[str, ...] = ()
    unchecked: tuple[str, ...] = ()


@dataclass(frozen=True)
class Suspect:
    """A bad rank, and why."""

    identity: Identity
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self.identity), "reason": self.reason}


@dataclass(frozen=True)
class Verdict:
    """What the check found, the same on every rank; written to OUT/preflight.json."""

    reports: tuple[Report, ...]
    suspects: tuple[Suspect, ...]
    max_slowdown: float
    timeout: int
    allreduce: dict[str, float] = field(default_factory=dict)  # bytes, seconds, bus_gbps (nccl-tests' busbw)

    @property
    def ok(self) -> bool:
        return not self.suspects

    def failure(self) -> str:
        """The one line a failed check ends with."""
        named = "; ".join(f"{s.identity.describe()}: {s.reason}" for s in self.suspects)
        count = len(self.suspects)
        return f"preflight: {count} bad rank{'s' * (count != 1)}: {named}"

    def summary(self) -> str:
        """Rank 0's line when every rank passed."""
        parts = sorted({part for r in self.reports for part in r.seconds})
        slowest = []
        for part in parts:
            worst = max(self.reports, key=lambda r: r.seconds.get(part, 0.0))
            slowest.append(f"{part} {_median(self.reports, part):.3g} s (slowest rank {worst.identity.rank} "
                           f"{worst.seconds.get(part, 0.0):.3g} s)")  # fmt: skip
        line = f"preflight: {len(self.reports)} rank(s) fine: {', '.join(slowest)}"
        if self.allreduce:
            megabytes = self.allreduce["bytes"] / 2**20
            line += (
                f"; all-reduce of {megabytes:.0f} MiB {self.allreduce['seconds'] * 1e3:.2f} ms "
                f"({self.allreduce['bus_gbps']:.3g} GB/s bus bandwidth)"
            )
        unchecked = sorted({note for r in self.reports for note in r.unchecked})
        return line + (f"; not checked: {', '.join(unchecked)}" if unchecked else "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "suspects": [s.to_dict() for s in self.suspects],
            "ranks": [
                {
                    **asdict(r.identity),
                    "seconds": r.seconds,
                    "problems": list(r.problems),
                    "unchecked": list(r.unchecked),
                }
                for r in self.reports
            ],  # fmt: skip
            "allreduce": self.allreduce,
            "max_slowdown": self.max_slowdown,
            "timeout": self.timeout,
        }


# --- the check ---------------------------------------------------------------------------------------------------


def enabled(cfg: PreflightSpec, device: torch.device) -> bool:
    """train.preflight.enabled, else on for GPU jobs (the trainer runs on CUDA) and off on CPU."""
    return cfg.enabled if cfg.enabled is not None else device.type == "cuda"


def run(cfg: PreflightSpec, world: Dist, *, output_dir: Path, say: Callable[[str], None]) -> Verdict | None:
    """The whole check for this rank (a collective): None when it is off; the verdict when every rank
    passed (rank 0 says it); PreflightFailed when one did not. The verdict goes to OUT/preflight.json."""
    if not enabled(cfg, world.device):
        return None
    import torch.distributed as torch_dist

    identity = identify(world)
    repeats = SLOW_REPEATS if os.environ.get(ENV_SLOW_RANK) == str(world.rank) else 1
    verdict = agree(
        torch_dist.distributed_c10d._get_default_store(),
        identity,
        lambda: check_rank(identity, world.device, repeats=repeats),
        world_size=world.world_size,
        local_world_size=world.local_world_size,
        timeout=cfg.timeout,
        max_slowdown=cfg.max_slowdown,
    )
    if verdict.ok:
        verdict = replace(verdict, allreduce=timed_allreduce(identity, world, timeout=cfg.timeout, verdict=verdict,
                                                             output_dir=output_dir))  # fmt: skip
    write(verdict, output_dir)
    if not verdict.ok:
        raise PreflightFailed(verdict)
    if world.is_main:
        say(verdict.summary())
    return verdict


def identify(world: Dist) -> Identity:
    gpu_uuid = ""
    if world.device.type == "cuda":
        from orchestrator.trainer import gpu

        index = world.device.index or 0
        gpu_uuid = next((d.uuid for d in gpu.cuda_devices() if d.index == index), "")
    return Identity(world.rank, world.node_rank, world.local_rank, socket.gethostname(), str(world.device),
                    gpu_uuid)  # fmt: skip


def check_rank(identity: Identity, device: torch.device, *, repeats: int = 1) -> Report:
    """This rank's checks: the timed work and, on a GPU, its health through NVML."""
    work = functools.partial(timed_work, device, repeats=repeats)
    if device.type != "cuda":
        return Report(identity, work())
    from orchestrator.trainer import gpu

    return check_gpu(identity, gpu.open_nvml_reader(), work)


def check_gpu(identity: Identity, reader: Any, work: Callable[[], dict[str, float]]) -> Report:
    """A GPU rank's checks (`reader`: a gpu.NvmlReader, None without NVML): the timed work, watched for Xid
    errors, then what NVML says of the GPU's health right after it (clocks held down show under load)."""
    if reader is None or not identity.gpu_uuid:
        return Report(identity, work(), unchecked=("GPU health (no NVML)",))
    from orchestrator.trainer.gpu import GpuDevice

    device = GpuDevice(index=identity.local_rank, uuid=identity.gpu_uuid)
    xid = None
    try:
        xid = reader.watch_xid(device)
        seconds = work()
        health = reader.health(device)
        xids = xid.seen() if xid is not None else None
    finally:
        if xid is not None:
            xid.close()
        reader.close()
    problems = list(health.problems())
    problems += [f"Xid {number} reported during the check" for number in dict.fromkeys(xids or [])]
    return Report(identity, seconds, tuple(problems), () if xids is not None else ("Xid events",))


def timed_work(device: torch.device, *, repeats: int = 1) -> dict[str, float]:
    """Seconds of a fixed piece of work, by part. GPU: wall time (synchronised) of bf16 matmuls and of
    host-to-device copies; CPU: CPU time of fp32 matmuls (a loaded machine delays a process, it does not
    make its work cost more CPU)."""
    import torch

    if device.type != "cuda":
        n, times = CPU_MATMUL
        a = torch.randn(n, n)
        torch.mm(a, a)  # warm up
        started = time.process_time()
        for _ in range(times * repeats):
            torch.mm(a, a)
        return {"matmul": time.process_time() - started}
    n, times = GPU_MATMUL
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    out = torch.empty_like(a)
    torch.mm(a, a, out=out)  # warm up: cuBLAS's handle and kernel choice
    torch.cuda.synchronize(device)
    started = time.perf_counter()
    for _ in range(times * repeats):
        torch.mm(a, a, out=out)
    torch.cuda.synchronize(device)
    matmul = time.perf_counter() - started
    size, copies = GPU_COPY
    host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    target = torch.empty(size, dtype=torch.uint8, device=device)
    target.copy_(host, non_blocking=True)
    torch.cuda.synchronize(device)
    started = time.perf_counter()
    for _ in range(copies * repeats):
        target.copy_(host, non_blocking=True)
    torch.cuda.synchronize(device)
    copy = time.perf_counter() - started
    del a, out, host, target
    torch.cuda.empty_cache()
    return {"matmul": matmul, "h2d_copy": copy}


# --- the barrier and the verdict, through the job's store ------------------------------------------------------


def agree(
    store: Any,
    identity: Identity,
    check: Callable[[], Report],
    *,
    world_size: int,
    local_world_size: int = 1,
    timeout: int,
    max_slowdown: float,
) -> Verdict:
    """Every rank's part of the barrier (`store`: a torch.distributed Store; `check`: this rank's checks):
    announce, check, report; rank 0 judges every report there within `timeout` and writes the verdict,
    which every rank returns. A non-zero rank that gets no verdict names rank 0."""
    from torch.distributed import DistStoreError

    rank = identity.rank
    store.set(f"{KEYS}/hello/{rank}", json.dumps(asdict(identity)))
    report = check()
    store.set(f"{KEYS}/report/{rank}", json.dumps(asdict(report)))
    if rank == 0:
        found = collect(store, world_size, timeout, local_world_size=local_world_size)
        verdict = judge(*found, max_slowdown=max_slowdown, timeout=timeout)
        store.set(f"{KEYS}/verdict", json.dumps(verdict.to_dict()))
        return verdict
    try:
        store.wait([f"{KEYS}/verdict"], timedelta(seconds=timeout * VERDICT_GRACE))
    except DistStoreError:
        first = _read(store, f"{KEYS}/hello/0")
        who = Identity(**first) if first else Identity(0, 0, 0, "?", "?")
        silent = f"gave no verdict within {timeout * VERDICT_GRACE:g} s (stuck in its checks, or gone)"
        return Verdict((report,), (Suspect(who, silent),), max_slowdown, timeout)
    return from_dict(json.loads(store.get(f"{KEYS}/verdict")))


def collect(
    store: Any, world_size: int, timeout: int, *, local_world_size: int = 1
) -> tuple[list[Report], list[Suspect]]:
    """Rank 0: the reports in the store once all are there, or after `timeout` seconds those that are; a rank
    without one is a suspect, named by its announcement when it made one, else by its rank (torchrun numbers
    the ranks of a node in a row, so its node rank is rank // local_world_size)."""
    from torch.distributed import DistStoreError

    keys = [f"{KEYS}/report/{rank}" for rank in range(world_size)]
    with contextlib.suppress(DistStoreError):  # who is missing is found below
        store.wait(keys, timedelta(seconds=timeout))
    reports, missing = [], []
    for rank, key in enumerate(keys):
        found = _read(store, key)
        if found:
            reports.append(_report(found))
            continue
        hello = _read(store, f"{KEYS}/hello/{rank}")
        if hello:
            missing.append(
                Suspect(Identity(**hello), f"started its checks but did not report within {timeout} s")
            )
        else:
            who = Identity(rank, rank // local_world_size, rank % local_world_size, "?", "?")
            missing.append(Suspect(who, f"did not start its checks within {timeout} s"))
    return reports, missing


def judge(reports: list[Report], missing: list[Suspect], *, max_slowdown: float, timeout: int) -> Verdict:
    """The suspects among `reports` (plus `missing`): a rank whose GPU has a problem, or one part of whose
    timed work took more than `max_slowdown` x the median of the other ranks' for that part. Pure."""
    suspects = list(missing)
    for report in reports:
        reasons = list(report.problems)
        others = [r for r in reports if r is not report]
        for part, seconds in sorted(report.seconds.items()):
            median = _median(others, part)
            if median > 0 and seconds > max_slowdown * median:
                reasons.append(
                    f"far slower: {part} {seconds:.3g} s, {seconds / median:.1f}x the other ranks' median "
                    f"{median:.3g} s (train.preflight.max_slowdown {max_slowdown:g})"
                )
        if reasons:
            suspects.append(Suspect(report.identity, "; ".join(reasons)))
    suspects.sort(key=lambda s: s.identity.rank)
    return Verdict(
        tuple(sorted(reports, key=lambda r: r.identity.rank)), tuple(suspects), max_slowdown, timeout
    )


def _median(reports: Any, part: str) -> float:
    values = [r.seconds[part] for r in reports if part in r.seconds]
    return statistics.median(values) if values else 0.0


def _read(store: Any, key: str) -> dict[str, Any] | None:
    """A JSON object at `key`, or None while there is none (never blocks: `get` would wait for it)."""
    if not store.check([key]):
        return None
    value = json.loads(store.get(key))
    return value if isinstance(value, dict) else None


def _report(data: dict[str, Any]) -> Report:
    return Report(Identity(**data["identity"]), dict(data["seconds"]), tuple(data["problems"]),
                  tuple(data["unchecked"]))  # fmt: skip


def from_dict(data: dict[str, Any]) -> Verdict:
    """A verdict as `Verdict.to_dict` wrote it (rank 0's, read back by the others)."""
    fields = {"rank", "node_rank", "local_rank", "host", "device", "gpu_uuid"}
    reports = tuple(
        Report(Identity(**{k: r[k] for k in fields}), dict(r["seconds"]), tuple(r["problems"]), tuple(r["unchecked"]))
        for r in data["ranks"]
    )  # fmt: skip
    suspects = tuple(Suspect(Identity(**{k: s[k] for k in fields}), s["reason"]) for s in data["suspects"])
    return Verdict(
        reports, suspects, data["max_slowdown"], data["timeout"], dict(data.get("allreduce") or {})
    )


# --- the collectives -----------------------------------------------------------------------------------------------


def timed_allreduce(
    identity: Identity, world: Dist, *, timeout: int, verdict: Verdict, output_dir: Path
) -> dict[str, float]:
    """A barrier, then ALLREDUCE_ITERATIONS all-reduces (sum) of a buffer holding rank + 1 on the training
    backend, each bounded by `timeout`; every rank checks the sum. Returns their size and time, with the bus
    bandwidth as nccl-tests computes it (2 (n - 1) / n x bytes / time). A wrong sum or a timeout fails this
    rank (PreflightFailed naming it, the verdict written first)."""
    import torch
    import torch.distributed as torch_dist

    def fail(reason: str) -> PreflightFailed:
        failed = replace(verdict, suspects=(Suspect(identity, reason),))
        write(failed, output_dir)
        return PreflightFailed(failed)

    wait = timedelta(seconds=timeout)
    elements = ALLREDUCE_ELEMENTS["cuda" if world.device.type == "cuda" else "cpu"]
    buffer = torch.empty(elements, dtype=torch.float32, device=world.device)
    expected = world.world_size * (world.world_size + 1) / 2
    try:
        torch_dist.barrier(async_op=True).wait(wait)
        seconds = 0.0
        for iteration in range(ALLREDUCE_ITERATIONS + 1):  # the first one warms up (connections, buffers)
            buffer.fill_(identity.rank + 1)
            _sync(world.device)
            started = time.perf_counter()
            torch_dist.all_reduce(buffer, async_op=True).wait(wait)
            _sync(world.device)
            seconds += (time.perf_counter() - started) if iteration else 0.0
    except (
        RuntimeError
    ) as error:  # a timeout or a broken connection: gloo's and NCCL's errors are RuntimeErrors
        raise fail(f"the barrier and all-reduce did not complete within {timeout} s ({error})") from error
    if not bool((buffer == expected).all()):
        wrong = buffer[buffer != expected][0].item()
        raise fail(f"the all-reduce summed to {wrong:g} instead of {expected:g}: the data was corrupted")
    per_iteration = seconds / ALLREDUCE_ITERATIONS
    size = elements * 4
    n = world.world_size
    bus = 2 * (n - 1) / n * size / per_iteration / 1e9 if per_iteration > 0 and n > 1 else 0.0
    return {"bytes": size, "seconds": per_iteration, "bus_gbps": bus}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def write(verdict: Verdict, output_dir: Path) -> None:
    """OUT/preflight.json, by every rank (the same verdict; written whole, so concurrent writers are fine)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    outputs.write_json(output_dir / outputs.PREFLIGHT, verdict.to_dict())
