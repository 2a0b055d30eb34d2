"""What a local run shows and where the rest goes: rank 0's log followed on the console (tracebacks left in
the file), the progress bar drawn from its events, torch's launcher logging sent to OUT/logs/launcher.log,
the ranks' error files under OUT/logs/errors/, and the tracking links of the last line."""

from __future__ import annotations

import json
import logging
import re
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from orchestrator import outputs
from orchestrator.local import worker
from orchestrator.local.planning import LocalPlan


def RunLogs(log_dir: Path) -> Any:  # noqa: N802 (a class made on first use)
    """torch's LogsSpecs for a run: workers keep their stdio (worker.py redirects it to
    logs/rank-N.log, appending across restarts); error files go to logs/errors/attempt-K/rank-N.json."""
    from torch.distributed.elastic.multiprocessing.api import LogsDest, LogsSpecs

    class RunLogs(LogsSpecs):
        def __init__(self) -> None:
            super().__init__(log_dir=str(log_dir))

        @property
        def root_log_dir(self) -> str:
            return str(log_dir)

        def reify(self, envs: dict[int, dict[str, str]]) -> Any:
            attempt = next(iter(envs.values()), {}).get("TORCHELASTIC_RESTART_COUNT", "0")
            errors = outputs.attempt_errors(log_dir, attempt)
            shutil.rmtree(errors, ignore_errors=True)
            errors.mkdir(parents=True)
            files = {}
            for local_rank, worker_env in envs.items():
                rank = worker_env.get("RANK", local_rank)
                files[local_rank] = str(outputs.error_file(log_dir, attempt, rank))
                worker_env["TORCHELASTIC_ERROR_FILE"] = files[local_rank]
            empty = dict.fromkeys(envs, "")  # "": the launcher's own stdout/stderr
            return LogsDest(stdouts=empty, stderrs=dict(empty), error_files=files)

    return RunLogs()


@contextmanager
def launcher_log(path: Path) -> Iterator[None]:
    """torch's launcher and agent log to OUT/logs/launcher.log, not the console (one line is ours to print)."""
    handler = logging.FileHandler(path, mode="a")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    loggers = [
        logging.getLogger(name) for name in ("torch.distributed.elastic", "torch.distributed.launcher")
    ]
    saved = [(lg.level, lg.propagate) for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.INFO)
        lg.propagate = False
    try:
        yield
    finally:
        for lg, (level, propagate) in zip(loggers, saved, strict=True):
            lg.removeHandler(handler)
            lg.setLevel(level)
            lg.propagate = propagate
        handler.close()


@contextmanager
def live_console(
    rank0_log: Path, events_file: Path | None, stream: TextIO, local: LocalPlan
) -> Iterator[None]:
    """Show rank 0's output while the run lasts (and a progress bar from its events on a terminal)."""
    console = _Console(rank0_log, events_file, stream, local)
    stop = threading.Event()
    thread = threading.Thread(target=console.follow, args=(stop,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


# The first line of a Python traceback; torch prefixes a rank's uncaught exception with "[rankN]:".
_TRACEBACK = re.compile(r"(\[rank\d+\]:\s*)?Traceback \(most recent call last\):")
# The trainer's last word before it exits with a refusal or its results not kept (trainer/__main__.py): the
# run's own last line says it (it quotes the rank's error), once.
_TRAINER_ERROR = re.compile(r"error: ")
# Lines of the trainer's reporter that the progress bar replaces on a terminal.
_BAR_SHOWS = re.compile(r"(step \d+/\d+  |eval at step \d+: |training |done: )")


class _Console:
    """Follows OUT/logs/rank-0.log (every attempt of this run) and, with a bar, rank 0's progress events.

    A Python traceback is left in the log, and so is a train job's `error:` line: the run ends with one line
    naming the failure and the file.
    """

    def __init__(self, log: Path, events: Path | None, stream: TextIO, local: LocalPlan) -> None:
        self.log, self.events, self.stream, self.local = log, events, stream, local
        # an earlier run's lines (same --out) were shown then: follow from the current ends
        self.positions = {path: _size(path) for path in (log, events)}
        self.pending = {log: "", events: ""}
        self.hiding_traceback = False
        self.bar = ""

    def follow(self, stop: threading.Event) -> None:
        while True:
            finished = stop.is_set()  # read once more after the workers are gone: nothing is lost
            for line in self._new_lines(self.log):
                self._log_line(line)
            if self.events is not None:
                for line in self._new_lines(self.events):
                    text = progress_text(json.loads(line))
                    if text.startswith("\r["):
                        self.bar = text
                    self.stream.write(text)
            self.stream.flush()
            if finished:
                if self.events is not None and self.bar:
                    self.stream.write("\n")
                    self.stream.flush()
                return
            time.sleep(0.2)

    def _new_lines(self, path: Path | None) -> list[str]:
        if path is None or not path.exists():
            return []
        with open(path, errors="replace") as file:
            file.seek(self.positions[path])
            self.pending[path] += file.read()
            self.positions[path] = file.tell()
        *complete, self.pending[path] = self.pending[path].split("\n")
        return complete

    def _log_line(self, line: str) -> None:
        if line.startswith(worker.HEADER):
            self.hiding_traceback = False
            attempt = re.search(r"attempt (\d+)", line)
            if attempt and int(attempt.group(1)) > 0:
                policy = (
                    f"restart.policy {self.local.restart_policy}"
                    if self.local.restart_policy == "job"
                    else ("elastic.max_restarts")
                )
                self._print(
                    f"restarting all {self.local.world_size} ranks together: restart {attempt.group(1)} "
                    f"of {self.local.max_restarts} ({policy})"
                )
            return
        if _TRACEBACK.match(line):
            self.hiding_traceback = True
        if self.hiding_traceback or (self.events is not None and _BAR_SHOWS.match(line)):
            return
        if self.local.train is not None and _TRAINER_ERROR.match(line):
            return
        self._print(line)

    def _print(self, line: str) -> None:
        if self.events is not None and self.bar:  # clear the bar, print the line, draw the bar again
            self.stream.write(f"\r\x1b[2K{line}\n{self.bar}")
        else:
            self.stream.write(line + "\n")


def _size(path: Path | None) -> int:
    try:
        return path.stat().st_size if path is not None else 0
    except OSError:
        return 0


def progress_text(event: dict[str, Any]) -> str:
    """One event as terminal text: the bar redraws itself in place (carriage return)."""
    if event["event"] == "step":
        width, done = 30, event["step"] / event["max_steps"]
        bar = "#" * int(width * done) + "-" * (width - int(width * done))
        eta = outputs.format_duration(event["eta_seconds"])
        return (
            f"\r[{bar}] step {event['step']}/{event['max_steps']}  loss {event['loss']:.4f}  "
            f"{event['samples_per_second']:,.0f} samples/s  ETA {eta} "
        )
    if event["event"] == "eval":
        values = "  ".join(
            f"{k} {outputs.format_value(v)}" for k, v in event.items() if k not in ("event", "step")
        )
        return f"\r\x1b[2Keval at step {event['step']}: {values}\n"
    return ""


def tracking_links(output_dir: Path) -> dict[str, str]:
    """Where the trainer recorded the run (its tracking.json in the output dir), for `orch run`'s last line."""
    return outputs.read_links(output_dir)
