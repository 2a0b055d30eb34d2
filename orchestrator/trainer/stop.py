"""Preemption-safe stops: the first SIGTERM or SIGINT finishes the step, writes a checkpoint, exits 128+signal.

SIGTERM is what a pod gets on preemption, a node drain or `kubectl delete`: the kubelet sends it to torchrun,
which forwards it to every rank and SIGKILLs them after its shutdown timeout (TORCH_ELASTIC_SHUTDOWN_TIMEOUT,
which render sets from train.checkpoint.on_stop). SIGINT is what `orch run`'s launcher forwards on the first
Ctrl-C. Either way the loop finishes the step it is in, writes a checkpoint and the process exits 128+signal:
the code a killed process would have had, which every restart policy treats as retryable (exit-code: only
1-127 are permanent). A second signal stops the process at once, as if no handler were installed.

The checkpoint is collective, so every rank must stop at the same step; but a signal reaches each rank at
its own moment, or only the ranks of one pod (a drained node). The ranks therefore agree once per step: one
all-reduce (MAX) of the signal number, after the step's own host sync (its gradient norm), so it adds one
small collective and no extra wait for the GPU.

`orch sweep` prunes a local trial the same way: it creates the file ORCH_PRUNE_FILE names, each rank looks
for it at every step (one stat), and the agreed value is then PRUNED, which the loop ends like a finished run
(a checkpoint, summary.json, exit 0: a pruned trial is done, so no restart policy may run it again). A
cluster trial's ORCH_PRUNE_FILE is an object in its output store (OUTPUT_URL/prune.request, which
`orch sweep --cluster` writes): rank 0 alone looks for it, every STORE_POLL_SECONDS from a thread of its own
(one HEAD request; the step never waits for the store), and the same all-reduce tells the other ranks.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

SIGNALS = (signal.SIGTERM, signal.SIGINT)
PRUNED = 256  # above every signal number: a pruned trial that is also signalled ends as pruned
STORE_POLL_SECONDS = 10.0  # a cluster trial's prune request: seen within this (and a step) of being written


class StopRequest:
    """Installed for the training loop; `agreed()` is the signal any rank received (0: none)."""

    def __init__(
        self,
        *,
        device: torch.device,
        world_size: int,
        enabled: bool,
        prune_file: str | None = None,
        watches_store: bool = True,
        store_poll_seconds: float = STORE_POLL_SECONDS,
    ) -> None:
        """`enabled` False (train.checkpoint.on_stop: false): signals keep their usual effect.
        `prune_file`: `orch sweep`'s request to stop as pruned, once it exists (a path, or an object-store
        URL, which only the rank that `watches_store` looks for)."""
        from orchestrator import storage

        self.enabled = enabled
        self.prune_file = prune_file
        self.received = 0
        self._shared = torch.zeros(1, dtype=torch.int32, device=device) if world_size > 1 else None
        self._previous: dict[int, Any] = {}
        self._local_file = prune_file
        self._watch: StoreWatch | None = None
        if prune_file is not None and storage.is_url(prune_file):
            self._local_file = None
            if watches_store:
                self._watch = StoreWatch(prune_file, store_poll_seconds)

    def install(self) -> None:
        if self._watch is not None:
            self._watch.start()
        if not self.enabled:
            return
        for number in SIGNALS:
            self._previous[number] = signal.signal(number, self._handle)

    def restore(self) -> None:
        if self._watch is not None:
            self._watch.stop()
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()

    def _handle(self, number: int, frame: FrameType | None) -> None:
        if self.received:  # the second signal: stop now, the way the signal's default action does
            signal.signal(number, signal.SIG_DFL)
            os.kill(os.getpid(), number)
            return
        self.received = number

    def agreed(self) -> int:
        """The signal number any rank has received so far (PRUNED once a rank sees the prune file), the
        same on every rank. A collective: every rank calls it once per step."""
        if self._watch is not None:
            pruned = self._watch.seen.is_set()
        else:
            pruned = self._local_file is not None and os.path.exists(self._local_file)
        mine = PRUNED if pruned else self.received
        if self._shared is None or not (self.enabled or self.prune_file):
            return mine
        self._shared.fill_(mine)
        dist.all_reduce(self._shared, op=dist.ReduceOp.MAX)
        return int(self._shared.item())


def exit_code(number: int) -> int:
    """What a shell (and the kubelet) reports for a process killed by `number`: retryable everywhere."""
    return 128 + number


class StoreWatch:
    """A thread that looks for an object (a cluster trial's prune request) every `seconds`, from its start;
    `seen` is set once it exists. A store that does not answer is asked again at the next look."""

    def __init__(self, url: str, seconds: float) -> None:
        self.url, self.seconds = url, seconds
        self.seen = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="orch-prune-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        import obstore

        from orchestrator import storage

        try:
            store, key = storage.object_store(
                self.url, request_seconds=self.seconds, retry_seconds=self.seconds
            )
        except storage.StorageError:
            return  # not a URL the store takes: nothing can ever be found there
        while not self._stopped.is_set():
            try:
                obstore.head(store, key)
                self.seen.set()
                return
            except Exception:  # noqa: BLE001 (not there yet, or the store did not answer: look again)
                pass
            self._stopped.wait(self.seconds)
