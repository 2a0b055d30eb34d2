"""The exit codes a rank ends with on purpose, and the one restart rule both launchers follow: `orch run`'s
agent (orchestrator/local/processes.py) and a pod's torchrun (orchestrator/launch.py) restart no failure whose
exit code says that a restart would end the same way, whatever `restart.policy: job` or `elastic.max_restarts`
still allows (docs/trainer.md, "Exit codes and restarts"). Stdlib only, and no orch import: a pod's launcher
and every rank import it first thing.

The other codes keep their meaning: 1 is an exception (a bug, or a peer lost: restarted under
`restart.policy: job`), 128 + N a signal, `hardware.EXIT_CODE` (200) hardware, all of them restartable; a
pod's launcher classes them for the `exit-code` policies (launch.py `classify`, docs/cluster.md "Exit codes").
"""

from __future__ import annotations

from collections.abc import Iterable

REFUSED = 2
"""Bad input or a refusal, said in one `error:` line: a resume on changed data (`DataChanged`), a store that
cannot be written at start, a torch too old (trainer/__main__.py); what a command's own usage error exits."""

RESULTS_NOT_KEPT = 74  # sysexits.h's EX_IOERR: "an error occurred while doing I/O on some file"
"""The training finished and wrote its last checkpoint, but its results (model.pt, TensorBoard's events,
summary.json) are not all where the run keeps them: the object store of output.url / `--out s3://...` failed
(refused, throttled past its retries, gone) or the output directory's disk is full. One `error:` line names
what and where; no summary.json claims them (trainer/results.py). The same run again, once the store or the
disk is fixed, resumes from that checkpoint and writes them without training again."""

CANNOT_RUN = 127  # a shell's "command not found"
"""`orch run`'s worker shim could not start the rank's command (orchestrator/local/worker.py)."""

NOT_RESTARTED = frozenset({REFUSED, RESULTS_NOT_KEPT, CANNOT_RUN})


def restartable(codes: Iterable[int]) -> bool:
    """Whether restarting the ranks can change how they end, given the exit code of each rank that failed
    (negative: killed by that signal). False when any of them is one of NOT_RESTARTED: the ranks a launcher
    stopped after it (exit 1 from a lost peer, a signal) do not make the refusal retryable."""
    return not any(code in NOT_RESTARTED for code in codes)
