"""One `orch run` worker process: tie it to the launcher, send its output to the run's log, become the command.

    python -m orchestrator.local.worker COMMAND [ARGS...]

torch's elastic agent runs inside `orch run` and starts every rank as its direct child, in a session of its
own (so a Ctrl-C in the terminal reaches only the launcher, which stops the ranks). A launcher killed outright
(`kill -9`, the OOM killer) runs no cleanup, and its workers would go on training and writing checkpoints.
This shim asks Linux to SIGKILL the worker when its parent dies (PR_SET_PDEATHSIG, kept across exec), appends
the rank's stdout and stderr to `ORCH_LOG_DIR/rank-RANK.log`, and then execs the real command in place: the
same pid, so the agent's signals and exit codes are the command's own. It imports the stdlib,
orchestrator.outputs and orchestrator.exit_codes only (the package's __init__ imports nothing on its own):
it starts in milliseconds.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

from orchestrator import exit_codes, outputs

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
LAUNCHER_PID = "ORCH_LAUNCHER_PID"  # the process whose death kills this one (`orch run`)
LOG_DIR = "ORCH_LOG_DIR"  # OUT/logs: where rank-RANK.log goes


def die_with_parent(launcher_pid: int) -> None:
    """SIGKILL this process (and, after exec, the command) when the launcher dies; Linux only."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    # The launcher may have died between our fork and the prctl: then we were already re-parented.
    if os.getppid() != launcher_pid:
        os._exit(1)


def redirect_output(log_dir: str, rank: str, attempt: str) -> None:
    """Append stdout and stderr (fds 1 and 2, inherited by the exec'd command) to the rank's log file."""
    fd = os.open(outputs.rank_log(log_dir, rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    os.write(fd, f"{HEADER} rank {rank}, attempt {attempt}, {stamp} ---\n".encode())
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


HEADER = "--- orch run:"  # the first line of every attempt in a rank's log (orch run's console follows it)


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit("usage: python -m orchestrator.local.worker COMMAND [ARGS...]")
    if launcher := os.environ.get(LAUNCHER_PID):
        die_with_parent(int(launcher))
    if log_dir := os.environ.get(LOG_DIR):
        redirect_output(
            log_dir, os.environ.get("RANK", "0"), os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        )
    try:
        os.execvp(argv[0], argv)
    except OSError as error:
        message = f"cannot run {argv[0]}: {error.strerror}"
        print(f"orch run: {message}", file=sys.stderr, flush=True)
        write_error_file(message)
        os._exit(exit_codes.CANNOT_RUN)


def write_error_file(message: str) -> None:
    """Report a failure the way torch's @record does, so the launcher names it."""
    import json

    if path := os.environ.get("TORCHELASTIC_ERROR_FILE"):
        data = {
            "message": {
                "message": message,
                "extraInfo": {"py_callstack": "", "timestamp": str(int(time.time()))},
            }
        }
        with open(path, "w") as file:
            json.dump(data, file)


if __name__ == "__main__":
    main(sys.argv[1:])
