"""The process group, from the environment torchrun gives each worker.

torchrun (and `orch run`, which uses the same launcher) rewrites RANK, WORLD_SIZE and LOCAL_RANK for every
process it starts, so reading them here is always the per-process truth. In a pod, the operator's RANK is
the node rank: a trainer started without torchrun would mistake it for its own rank, so we refuse to run
when torchrun's marker variables are missing but a WORLD_SIZE above 1 is set.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

# Every rank waits in a collective while rank 0 evaluates or writes a checkpoint; keep the default NCCL
# timeout (10 min) from killing a job whose checkpoint write is slow.
COLLECTIVE_TIMEOUT = timedelta(minutes=30)


@dataclass(frozen=True)
class Dist:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    restart_count: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        """Rank 0 logs, evaluates the summary and writes files."""
        return self.rank == 0


def init() -> Dist:
    """Read torchrun's env, pick the device and backend, and join the process group."""
    env = os.environ
    if "TORCHELASTIC_RUN_ID" not in env and "LOCAL_RANK" not in env and int(env.get("WORLD_SIZE", "1")) > 1:
        raise RuntimeError(
            "WORLD_SIZE is set but this process was not started by torchrun; run "
            "`torchrun ... -m orchestrator.trainer` (the operator's RANK is a node rank, not a process rank)"
        )
    rank, world_size = int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1"))
    local_rank = int(env.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not env.get("MASTER_ADDR"):  # a plain `python -m orchestrator.trainer`: a group of one
        env.setdefault("MASTER_ADDR", "127.0.0.1")
        env.setdefault("MASTER_PORT", str(_free_port()))
    restart_count = int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))
    # The store torch's env:// rendezvous connects to (torchrun's agent store when launched by torchrun)
    # outlives an elastic restart, and the previous attempt's keys (the dead workers' gloo addresses) are
    # still in it: a restarted group reading them fails with "connection refused". Namespace every key
    # by attempt.
    store, _, _ = next(
        dist.rendezvous("env://", rank=rank, world_size=world_size, timeout=COLLECTIVE_TIMEOUT)
    )
    dist.init_process_group(
        backend,
        store=dist.PrefixStore(f"orch/attempt-{restart_count}", store),
        rank=rank,
        world_size=world_size,
        timeout=COLLECTIVE_TIMEOUT,
        device_id=device if backend == "nccl" else None,
    )
    return Dist(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=int(env.get("LOCAL_WORLD_SIZE", "1")),
        node_rank=int(env.get("GROUP_RANK", "0")),
        restart_count=restart_count,
        device=device,
    )


def close() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
