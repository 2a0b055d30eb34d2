"""`orch logs`: every pod's training-container log, labelled by role ("master-0", "worker-3", "node-1").

Without `follow`: what each started container has logged so far, pod by pod in rank order.
With `follow` (`LogFollower`): lines as they come, from a thread per container instance; every poll interval
the pods are listed again to pick up pods that start late, restarted containers and recreated pods (new
readers) and streams that ended while the container still runs (resumed after the last timestamp seen).
Ends when the job has finished and every reader has drained (at most `drain_seconds` after the end).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator import status
from orchestrator.cluster import jobs
from orchestrator.cluster.client import Cluster, poll_seconds
from orchestrator.cluster.errors import ClusterError, Forbidden, NotFound

Emit = Callable[[str, str], None]  # (label, line)
Notice = Callable[[str], None]


@dataclass(frozen=True)
class Selection:
    """Which pods of the job to show: all, one node rank, or one pod by name."""

    rank: int | None = None
    pod: str | None = None

    def wants(self, job: jobs.Job, pod: dict[str, Any]) -> bool:
        summary = status.pod_summary(job.api, pod)
        if self.pod is not None:
            return summary.name == self.pod
        if self.rank is not None:
            return job.api.node_rank(job.obj, summary.role, summary.index) == self.rank
        return True

    def pods(self, cluster: Cluster, job: jobs.Job) -> list[dict[str, Any]]:
        pods = [p for p in jobs.job_pods(cluster, job) if self.wants(job, p)]
        return sorted(pods, key=lambda p: status.pod_order(status.pod_summary(job.api, p)))

    def none_message(self, name: str) -> str:
        if self.pod is not None:
            return f"job {name} has no pod named {self.pod}"
        if self.rank is not None:
            return f"job {name} has no pod with rank {self.rank} (yet)"
        return f"job {name} has no pods yet"


def stream_logs(
    cluster: Cluster,
    name: str,
    *,
    emit: Emit,
    notice: Notice = lambda message: None,
    follow: bool = False,
    rank: int | None = None,
    pod: str | None = None,
    tail: int | None = None,
    since_seconds: int | None = None,
    drain_seconds: float = 10.0,
) -> jobs.Job | None:
    """Every selected pod's log as `emit(label, line)`. Returns the last job seen (None: it was deleted)."""
    job = jobs.locate(cluster, name)
    selection = Selection(rank=rank, pod=pod)
    if follow:
        follower = LogFollower(cluster, job, selection, emit=emit, notice=notice, tail=tail,
                               since_seconds=since_seconds, drain_seconds=drain_seconds)  # fmt: skip
        return follower.run()
    pods = selection.pods(cluster, job)
    if not pods:
        notice(selection.none_message(name))
    for p in pods:
        summary = status.pod_summary(job.api, p)
        if not status.container_started(p, job.api.container):
            notice(f"[{summary.label}] {summary.name} has not started yet ({summary.phase})")
            continue
        lines = cluster.log_lines(summary.name, container=job.api.container, tail=tail,
                                  since_seconds=since_seconds)  # fmt: skip
        for line in lines:
            emit(summary.label, line)
    return job


@dataclass
class _Reader:
    """One thread following one container instance (a pod uid + its restart count) of one pod."""

    key: tuple[str, int]
    done: threading.Event = field(default_factory=threading.Event)
    last_timestamp: str = ""
    error: ClusterError | None = None


class LogFollower:
    """Merges the logs of a job's pods as they come, until the job has finished and the logs drained."""

    def __init__(
        self,
        cluster: Cluster,
        job: jobs.Job,
        selection: Selection,
        *,
        emit: Emit,
        notice: Notice,
        tail: int | None = None,
        since_seconds: int | None = None,
        drain_seconds: float = 10.0,
    ) -> None:
        self.cluster, self.job, self.selection = cluster, job, selection
        self.emit, self.notice = emit, notice
        self.tail, self.since_seconds, self.drain_seconds = tail, since_seconds, drain_seconds
        self.lines: queue.Queue[tuple[str, str]] = queue.Queue()
        self.readers: dict[str, _Reader] = {}  # pod name -> its current (or last) reader
        self.waiting_noted: set[str] = set()
        self.finished_at: float | None = None
        self.first_round = True
        self.restarts = 0  # whole-job restarts seen so far

    def run(self) -> jobs.Job | None:
        with self.cluster.patiently():  # waiting for the job: the deadline bounds each request alone
            return self._run()

    def _run(self) -> jobs.Job | None:
        self.refresh()
        next_refresh = time.monotonic() + poll_seconds()
        while True:
            try:
                label, text = self.lines.get(timeout=max(0.0, min(0.2, next_refresh - time.monotonic())))
                self.emit(label, text)
                continue
            except queue.Empty:
                pass
            if self.finished_at is not None:
                # A reader that ended with an error (a stream that broke as the container exited) is not
                # drained: the next refresh reads on from its last line.
                drained = self.lines.empty() and all(
                    r.done.is_set() and (r.error is None or isinstance(r.error, Forbidden))
                    for r in self.readers.values()
                )
                if drained or time.monotonic() - self.finished_at > self.drain_seconds:
                    while not self.lines.empty():
                        self.emit(*self.lines.get_nowait())
                    return self.job
            if time.monotonic() >= next_refresh:
                try:
                    self.refresh()
                except NotFound:
                    self.notice(f"job {self.job.name} was deleted")
                    return None
                next_refresh = time.monotonic() + poll_seconds()

    def refresh(self) -> None:
        """Re-read the job and its pods; start, restart or resume readers as the pods need."""
        self.job = jobs.refresh(self.cluster, self.job)
        if self.finished_at is None and self.job.phase in status.FINISHED:
            self.finished_at = time.monotonic()
        pods = self.selection.pods(self.cluster, self.job)
        restarts = self.job.api.restarts(self.job.obj, pods)
        if self.job.api.restarts_whole_job and restarts > self.restarts:
            if not self.first_round:
                self.notice(f"job {self.job.name} restarted: every pod was recreated (restart {restarts})")
            self.restarts = restarts
        if not pods and self.first_round:
            self.notice(self.selection.none_message(self.job.name) + "; waiting for them")
        container = self.job.api.container
        for p in pods:
            summary = status.pod_summary(self.job.api, p)
            key = (status.text(status.dig(p, "metadata", "uid")), summary.restarts)
            current = self.readers.get(summary.name)
            if not status.container_started(p, container):
                if summary.name not in self.waiting_noted:
                    self.notice(f"[{summary.label}] waiting for {summary.name} to start ({summary.phase})")
                    self.waiting_noted.add(summary.name)
                continue
            if current is None:
                self.start(summary, key)
            elif current.done.is_set():
                if current.key != key:
                    if key[0] == current.key[0]:
                        self.notice(f"[{summary.label}] container restarted (restart {key[1]})")
                    self.start(summary, key)  # a new container instance, or a recreated pod
                elif isinstance(current.error, Forbidden):
                    raise current.error  # retrying cannot help: say so instead of showing nothing
                elif current.error is not None or status.container_running(p, container):
                    self.start(summary, key, resume_after=current.last_timestamp)  # the stream broke
        self.first_round = False

    def start(self, pod: status.PodSummary, key: tuple[str, int], resume_after: str = "") -> None:
        """A thread that follows one container instance and queues its lines."""
        # The first reader of a pod honours --tail/--since; a restarted container is read from its start.
        options: dict[str, Any] = {"follow": True, "timestamps": True}
        if resume_after:
            options["since_seconds"] = max(1, int(time.time() - _epoch(resume_after)) + 1)
        elif pod.name not in self.readers and self.first_round:
            options.update(tail=self.tail, since_seconds=self.since_seconds)
        reader = _Reader(key=key, last_timestamp=resume_after)
        self.readers[pod.name] = reader
        threading.Thread(
            target=self._read, args=(reader, pod, options, resume_after), name=f"orch-logs-{pod.name}",
            daemon=True,
        ).start()  # fmt: skip

    def _read(
        self, reader: _Reader, pod: status.PodSummary, options: dict[str, Any], resume_after: str
    ) -> None:
        try:
            for raw in self.cluster.log_lines(pod.name, container=self.job.api.container, **options):
                stamp, _, text = raw.partition(" ")
                if resume_after and _stamp_key(stamp) <= _stamp_key(resume_after):
                    continue  # already shown before the stream was resumed
                reader.last_timestamp = stamp
                self.lines.put((pod.label, text))
        except ClusterError as e:
            # the stream broke (read on from the last line), or the container is between restarts
            reader.error = e
        finally:
            reader.done.set()


def _stamp_key(timestamp: str) -> tuple[str, float]:
    """Sortable form of an RFC3339Nano log timestamp (Go trims trailing zeros, so strings do not sort)."""
    whole, _, fraction = timestamp.rstrip("Z").partition(".")
    return whole, float(f"0.{fraction or 0}")


def _epoch(timestamp: str) -> float:
    whole, fraction = _stamp_key(timestamp)
    parsed = status.parse_time(whole + "+00:00")
    return parsed.timestamp() + fraction if parsed else time.time()
