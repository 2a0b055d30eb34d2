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
(a checkpoint, summary.json, exit 0: a pruned trial is done, so no restart policy may run it again).
"""

from __future__ import annotations

import os
import signal
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

SIGNALS = (signal.SIGTERM, signal.SIGINT)
PRUNED = 256  # above every signal number: a pruned trial that is also signalled ends as pruned


class StopRequest:
    """Installed for the training loop; `agreed()` is the signal any rank received (0: none)."""

    def __init__(
        self, *, device: torch.device, world_size: int, enabled: bool, prune_file: str | None = None
    ) -> None:
        """`enabled` False (train.checkpoint.on_stop: false): signals keep their usual effect.
        `prune_file`: `orch sweep`'s request to stop as pruned, once it exists."""
        self.enabled = enabled
        self.prune_file = prune_file
        self.received = 0
        self._shared = torch.zeros(1, dtype=torch.int32, device=device) if world_size > 1 else None
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        if not self.enabled:
            return
        for number in SIGNALS:
            self._previous[number] = signal.signal(number, self._handle)

    def restore(self) -> None:
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
        pruned = self.prune_file is not None and os.path.exists(self.prune_file)
        mine = PRUNED if pruned else self.received
        if self._shared is None or not (self.enabled or self.prune_file):
            return mine
        self._shared.fill_(mine)
        dist.all_reduce(self._shared, op=dist.ReduceOp.MAX)
        return int(self._shared.item())


def exit_code(number: int) -> int:
    """What a shell (and the kubelet) reports for a process killed by `number`: retryable everywhere."""
    return 128 + number
