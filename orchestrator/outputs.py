"""The output directory of a run (OUT, `ORCH_OUTPUT_DIR`): every file and folder kept there, named once, and
the readers of the small files.

OUT is where a run's processes meet: `orch run --out` (default runs/NAME-STAMP/) or, in a pod, /orch/output
(naming.OUTPUT_DIR). The launchers (orchestrator/local/, orchestrator/launch.py) and the trainer write there
and read back what the others wrote, so each name is written here and nowhere else; a new file is one line
in the table below, with who writes it, and its writer and reader use the name.

    OUT/
      train.json              orch run: the trainer's --config (pods read theirs from the ConfigMap)
      run.json, run.lock      orch run: who runs here (pid, job, start), and the flock held while it runs
      progress.jsonl          orch run: rank 0's events (the progress bar), appended across runs
      metrics-endpoint.json   orch run: where local rank 0 serves metrics, once it listens; removed at the end
      .metrics/               orch run: the ranks' prometheus-client files; removed at the end
      logs/                   orch run: rank-N.log (a rank's output), launcher.log (torch's agent), errors/
      checkpoints/            the trainer: one step-NNNNNNNN/ each (train.checkpoint.dir moves them)
      summary.json            the trainer (rank 0), last: what the run did; `orch run` reads it
      model.pt                the trainer (rank 0): the final weights, a plain state dict
      tracking.json           the trainer (rank 0): the run's MLflow/TensorBoard links, for `orch run`
      tensorboard/            the trainer (rank 0): TensorBoard's event files (tracking.tensorboard)
      preflight.json          the trainer (every rank): the pre-flight check's verdict (train.preflight)
      .orch-starts/           a pod's launcher: how often each pod started (restart.policy: exit-code)
      objective.json          the trainer (rank 0), in an `orch sweep` trial: its objective at each value
                              (also uploaded to output.url, where `orch sweep --cluster` reads it)
      prune.request           orch sweep: created to stop the trial as pruned (the trainer's stop path);
                              a cluster trial's is in its store, OUTPUT_URL/prune.request
      console.log             orch sweep: what the trial's `orch run` printed
      goodput/                the trainer (rank 0 of each attempt): the goodput journal (orchestrator/goodput.py)
      hang.json               the trainer (the rank that noticed a stall first): which ranks stopped, where
      stacks/                 the trainer (every rank): rank-N.json (who it is), rank-N.txt (stacks on demand)
      stacks.request          orch stacks (a cluster job's): in its store only, OUTPUT_URL/stacks.request, while
                              it waits; every rank answers under OUTPUT_URL/stacks/ID/rank-N.json (removed after)
      nccl-traces/            the launchers: NCCL's flight recorder dumps a rank's trace here on a timeout

Stdlib only, and light: the launchers import it before anything else (a rank's shim, a pod's PID 1).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.errors import OrchError

ENV = "ORCH_OUTPUT_DIR"  # where the launcher tells the trainer OUT is (runtime_env.RuntimeEnv.output_dir)

TRAIN_CONFIG = "train.json"
RUN_RECORD = "run.json"
RUN_LOCK = "run.lock"
PROGRESS = "progress.jsonl"
METRICS_ENDPOINT = "metrics-endpoint.json"
METRICS_FILES = ".metrics"
LOGS = "logs"
LAUNCHER_LOG = "launcher.log"  # in LOGS
ERRORS = "errors"  # in LOGS: torch's error file of each rank, per attempt (attempt-K/rank-N.json)
CHECKPOINTS = "checkpoints"
SUMMARY = "summary.json"
MODEL = "model.pt"
LINKS = "tracking.json"
TENSORBOARD = "tensorboard"
STARTS = ".orch-starts"
OBJECTIVE = "objective.json"
PRUNE_REQUEST = "prune.request"
CONSOLE = "console.log"
PREFLIGHT = "preflight.json"
GOODPUT = "goodput"
HANG = "hang.json"
STACKS = "stacks"
STACKS_REQUEST = "stacks.request"
NCCL_TRACES = "nccl-traces"

# What `orch run` leaves in OUT: a folder holding one of these is a run's output, not the user's code.
LOCAL_RUN_MARKERS = (RUN_RECORD, RUN_LOCK)


def rank_log(log_dir: Path | str, rank: int | str) -> Path:
    """One rank's output (stdout and stderr, every attempt appended): LOGS/rank-N.log."""
    return Path(log_dir) / f"rank-{rank}.log"


def attempt_errors(log_dir: Path, attempt: int | str) -> Path:
    """The error files of one attempt of the ranks (torch's restart count): LOGS/errors/attempt-K/."""
    return log_dir / ERRORS / f"attempt-{attempt}"


def rank_stacks(output_dir: Path | str, rank: int | str) -> tuple[Path, Path]:
    """STACKS/rank-N.json (the rank's pid and host, for `orch stacks`) and STACKS/rank-N.txt (where its
    faulthandler appends every thread's stack when `orch stacks` signals it)."""
    folder = Path(output_dir) / STACKS
    return folder / f"rank-{rank}.json", folder / f"rank-{rank}.txt"


def stacks_answers(request_id: str) -> str:
    """Where the ranks answer `orch stacks`'s request `request_id` in the job's store, relative to OUTPUT_URL:
    STACKS/ID/, one rank-N.json each (every thread's stack and where the rank is; orchestrator/stacks.py)."""
    return f"{STACKS}/{request_id}"


def stacks_answer(request_id: str, rank: int | str) -> str:
    return f"{stacks_answers(request_id)}/rank-{rank}.json"


def nccl_trace_env(
    output_dir: Path | str, given: Mapping[str, str] = {}, torch_version: str | None = None
) -> dict[str, str]:
    """NCCL's flight recorder, as both launchers set it for the ranks: what to add to `given` (the ranks' env so
    far; a setting it has, under either of its names, is left as the job wrote it). The last NCCL_TRACE_ENTRIES
    collectives of each rank in a ring buffer, dumped to NCCL_TRACES/rank_N when a collective times out
    (`python -m torch.distributed.flight_recorder.fr_trace NCCL_TRACES` reads them). Nothing is recorded on gloo.

    The buffer's size goes under the one name the installed torch reads without a word (torch_version: the
    installed one when None): TORCH_FR_BUFFER_SIZE from torch 2.11, where the recorder reads it first and
    warns on every rank that TORCH_NCCL_TRACE_BUFFER_SIZE is deprecated; the old name before, where
    ProcessGroupNCCL reads only it (torch/csrc/distributed/c10d/FlightRecorder.hpp, ProcessGroupNCCL.cpp).
    Both spellings of the dump's path, which torch reads for different dumps: TORCH_FR_DUMP_TEMP_FILE (2.7+),
    TORCH_NCCL_DEBUG_INFO_TEMP_FILE."""
    prefix = str(Path(output_dir) / NCCL_TRACES / "rank_")
    settings = {
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": prefix,
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix,
    }
    if not any(name in given for name in TRACE_BUFFER_NAMES):
        settings[_trace_buffer_name(torch_version)] = str(NCCL_TRACE_ENTRIES)
    return {name: value for name, value in settings.items() if name not in given}


# The flight recorder's buffer size: torch 2.11's name, the old one.
TRACE_BUFFER_NAMES = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


def _trace_buffer_name(torch_version: str | None) -> str:
    """TORCH_FR_BUFFER_SIZE for torch 2.11 and later, else (older, or a version that cannot be read) the old name."""
    if torch_version is None:
        import importlib.metadata  # here: the ranks' shim imports this module and never asks

        try:
            torch_version = importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            torch_version = ""
    parts = re.match(r"(\d+)\.(\d+)", torch_version)
    new = parts is not None and (int(parts[1]), int(parts[2])) >= (2, 11)
    return TRACE_BUFFER_NAMES[0] if new else TRACE_BUFFER_NAMES[1]


NCCL_TRACE_ENTRIES = 2000


def error_file(log_dir: Path, attempt: int | str, rank: int | str) -> Path:
    """Where torch's @record writes a failed rank's exception: LOGS/errors/attempt-K/rank-N.json."""
    return attempt_errors(log_dir, attempt) / f"rank-{rank}.json"


# --- the small JSON files: written whole, read defensively --------------------------------------------------


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Written to a temporary name and renamed, so a reader (another process) never sees half a file."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        partial.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(partial, path)
    except BaseException:  # a full disk: no half-written file left behind
        partial.unlink(missing_ok=True)
        raise


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from `path`; {} when it is missing, unreadable or not an object (these files describe
    a run to another process, which goes on without them)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class UnreadableSummary(OrchError):
    """summary.json is there but is not a summary: the message names the file and what is wrong."""


def read_summary(output_dir: Path) -> dict[str, Any] | None:
    """summary.json as the trainer left it: None while there is none (a run not finished, or one whose task
    exited early); UnreadableSummary when it cannot be read or is of another shape (no step count)."""
    path = output_dir / SUMMARY
    try:
        summary = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise UnreadableSummary(f"cannot read {path}: {error}") from None
    if not isinstance(summary, dict) or not isinstance(summary.get("steps"), int):
        raise UnreadableSummary(f"{path} is not a summary of a run (no step count)")
    return summary


def read_links(output_dir: Path) -> dict[str, str]:
    """The run's tracking links (tracking.json: {"mlflow": URL, ...}); {} when there are none."""
    return {k: v for k, v in read_json(output_dir / LINKS).items() if isinstance(v, str)}


def read_run_record(output_dir: Path) -> dict[str, Any]:
    """run.json: the `orch run` that holds (or held) OUT: job, pid, started, output_dir, procs, ...; {} if none."""
    return read_json(output_dir / RUN_RECORD)


def pid_alive(pid: int) -> bool:
    """Whether process `pid` runs on this machine (0 or less: no process): is a run record's holder, or the
    writer of a metrics file, still there."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


# --- progress.jsonl: how its numbers read (the trainer's log lines and `orch run`'s bar show the same) -------


def format_duration(seconds: float) -> str:
    """H:MM:SS (an ETA, a run's wall time)."""
    seconds = int(max(0, seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def format_value(value: Any) -> str:
    """A number as the log lines show them (4 decimals); anything else a task returns, as text."""
    return f"{value:.4f}" if isinstance(value, float) else str(value)
