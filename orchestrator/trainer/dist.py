"""The process group, from the environment torchrun gives each worker.

torchrun (and `orch run`, which uses the same launcher) sets RANK, WORLD_SIZE, LOCAL_RANK, GROUP_RANK, ... for
every process it starts, so reading them here is always the per-process truth. torchrun itself reads its
flags from PET_* variables: the v1 operator sets PET_NNODES/PET_NODE_RANK/PET_MASTER_ADDR/PORT (plus a
pod-level RANK and WORLD_SIZE), Trainer v2's torch plugin sets only PET_NNODES, PET_NPROC_PER_NODE,
PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT. Both reach the trainer the same way, through torchrun. A
trainer started without torchrun would take the operator's RANK (a node rank) for its own, or, under
Trainer v2, train alone on each node: it refuses to run when the environment says the job has more than
one process.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

# How long a worker waits for its peers to join the group: the pods of one job can start minutes apart.
JOIN_TIMEOUT = timedelta(minutes=30)


@dataclass(frozen=True)
class Placement:
    """Where this process sits in the job (from the environment alone)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    restart_count: int


@dataclass(frozen=True)
class Dist(Placement):
    device: torch.device
    store_prefix: str = ""
    """This attempt's keys in the store the group was formed through (the heartbeats' too)."""

    @property
    def is_main(self) -> bool:
        """Rank 0 logs, evaluates the summary and writes files."""
        return self.rank == 0


def placement(env: Mapping[str, str]) -> Placement:
    """Read torchrun's variables; refuse a multi-process job's environment without torchrun."""
    under_torchrun = "TORCHELASTIC_RUN_ID" in env or "LOCAL_RANK" in env
    if not under_torchrun:
        nodes, procs = _most(env.get("PET_NNODES")), _most(env.get("PET_NPROC_PER_NODE"))
        if int(env.get("WORLD_SIZE", "1")) > 1 or nodes > 1 or procs > 1:
            raise RuntimeError(
                "this job has more than one process but this one was not started by torchrun "
                "(WORLD_SIZE/PET_NNODES/PET_NPROC_PER_NODE say so); run `torchrun ... -m orchestrator.trainer`: "
                "torchrun turns the operator's variables into each process's rank"
            )
    world_size = int(env.get("WORLD_SIZE", "1"))
    local_world_size = int(env.get("LOCAL_WORLD_SIZE", "1"))
    # GROUP_RANK is torchrun's rank of this node in the group (the order of RANK), equal to PET_NODE_RANK
    # with a static rendezvous, assigned by the rendezvous when elastic. Without torchrun: a group of one.
    node_rank = env.get("GROUP_RANK") if under_torchrun else env.get("PET_NODE_RANK")
    return Placement(
        rank=int(env.get("RANK", "0")),
        world_size=world_size,
        local_rank=int(env.get("LOCAL_RANK", "0")),
        local_world_size=local_world_size,
        node_rank=int(node_rank or 0),
        num_nodes=int(env.get("GROUP_WORLD_SIZE") or max(1, world_size // max(1, local_world_size))),
        restart_count=int(env.get("TORCHELASTIC_RESTART_COUNT", "0")),
    )


def _most(value: str | None) -> int:
    """PET_NNODES may be "2" or "1:4" (elastic); PET_NPROC_PER_NODE may be "auto" (0: unknown)."""
    tail = (value or "").rpartition(":")[2]
    return int(tail) if tail.isdigit() else 0


def init(*, timeout: timedelta) -> Dist:
    """Pick the device and backend and join the process group.

    `timeout` bounds every collective: a peer that died or hangs fails this process after that long
    instead of never (NCCL's watchdog with async error handling; gloo's own timeout), and torchrun or the
    job's restart policy takes over from there.
    """
    place = placement(os.environ)
    env = os.environ
    if torch.cuda.is_available():
        device = torch.device("cuda", place.local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
        # A collective that fails or outlives `timeout` tears the process down instead of hanging
        # (3: without ncclCommAbort, which can itself hang; torch's default since 2.2, spelled out here).
        env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
        # The flight recorder's dumps (set by the launchers: outputs.nccl_trace_env) need their folder.
        if env.get("TORCH_FR_DUMP_TEMP_FILE"):
            os.makedirs(os.path.dirname(env["TORCH_FR_DUMP_TEMP_FILE"]), exist_ok=True)
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not env.get("MASTER_ADDR"):  # a plain `python -m orchestrator.trainer`: a group of one
        env.setdefault("MASTER_ADDR", "127.0.0.1")
        env.setdefault("MASTER_PORT", str(_free_port()))
    # The store torch's env:// rendezvous connects to (torchrun's agent store when launched by torchrun)
    # outlives an elastic restart, and the previous attempt's keys (the dead workers' gloo addresses) are
    # still in it: a restarted group reading them fails with "connection refused". Namespace every key
    # by attempt. The attempt is not TORCHELASTIC_RESTART_COUNT: with several torchrun agents (nodes), an
    # agent that restarts its workers because another node re-joined does not count that restart, so the
    # counts differ between nodes and the ranks would wait under different prefixes. Each rank counts its
    # own joins in the shared store instead (per world size: elastic groups change size); every rank of a
    # group joins once per attempt, so the counts agree.
    store, _, _ = next(
        dist.rendezvous("env://", rank=place.rank, world_size=place.world_size, timeout=JOIN_TIMEOUT)
    )
    attempt = store.add(f"orch/joins/world-{place.world_size}/rank-{place.rank}", 1) - 1
    prefix = f"orch/world-{place.world_size}/attempt-{attempt}"
    dist.init_process_group(
        backend,
        store=dist.PrefixStore(prefix, store),
        rank=place.rank,
        world_size=place.world_size,
        timeout=timeout,
        device_id=device if backend == "nccl" else None,
    )
    return Dist(**vars(place), device=device, store_prefix=prefix)


def close() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
