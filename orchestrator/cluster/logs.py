"""`orch logs`: the training-container logs of a job's pods, labelled by role ("master-0", "worker-3").

Which pods: a job of up to `READABLE_PODS` pods shows them all; a bigger one shows what a person can read,
rank 0 plus every pod that failed, restarted or whose container ended in error, and says how to get the rest
(`--all`, `--ranks 0-63`, `--rank`, `--pod`). At most `max_requests` log streams are open at once (like
kubectl's `--max-log-requests`), so a 1,000-pod job does not open 1,000 connections.

Without `follow`: what each selected container has logged so far, pod by pod in display order (master first, then by index), read
`max_requests` at a time. With `follow` (`LogFollower`): lines as they come, from a thread per followed
container instance. The job and its pods are watched (one list, then watches resumed from their
resourceVersion; no re-listing), so the requests do not grow with the job's size or age. Pods beyond the
stream cap are not followed: the follower says which, and how to print them (no line is lost: the kubelet
keeps them). Ends when the job has finished and every reader has drained (at most `drain_seconds` after).
A container that exited is not waited for: the kubelet ends its followed stream only at its next state check
(5 s), a proxy may hold it open longer, and a broken one has nothing left to follow. Its stream is resumed
(after a break) or replaced (still open once the job has finished) by one plain read of what it logged after
its last line shown, so the follower returns within a poll interval of the job's end, with every line.
"""

from __future__ import annotations

import contextlib
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from orchestrator import status
from orchestrator.cluster import jobs
from orchestrator.cluster.client import Cluster
from orchestrator.cluster.errors import ClusterError, Forbidden
from orchestrator.cluster.session import poll_seconds
from orchestrator.errors import UsageError
from orchestrator.kube import read
from orchestrator.kube.kinds import POD

Emit = Callable[[str, str], None]  # (label, line)
Notice = Callable[[str], None]

READABLE_PODS = 8  # up to this many pods, every pod's log is shown by default
DEFAULT_MAX_REQUESTS = 10  # log streams open at once (kubectl's --max-log-requests default is 5)

MAX_RANK = 2**31 - 2  # replicas are an int32: the last node rank of the largest job there can be
MAX_SELECTED_RANKS = 100_000  # more nodes than any job has: `--all` says "every pod"


def parse_ranks(text: str) -> frozenset[int]:
    """`0-63,100,200-210` -> those node ranks. ValueError says what is wrong. Bounded before anything is
    built: `0-999999999999` is refused, not a set of a trillion numbers."""
    spans: list[tuple[int, int]] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        match = re.fullmatch(r"([0-9]{1,10})(?:-([0-9]{1,10}))?", part)
        if match is None:
            shown = part if len(part) <= 30 else part[:27] + "..."
            raise ValueError(f"{shown!r} is not a rank or a range like 0-63")
        first, last = int(match[1]), int(match[2] or match[1])
        if last < first:
            raise ValueError(f"{part!r}: the range ends before it starts")
        if last > MAX_RANK:
            raise ValueError(f"{part!r}: {last} is past the last rank a job can have ({MAX_RANK})")
        spans.append((first, last))
        if sum(b - a + 1 for a, b in spans) > MAX_SELECTED_RANKS:
            raise ValueError(f"more than {MAX_SELECTED_RANKS} ranks; --all shows every pod")
    if not spans:
        raise ValueError("no ranks given (e.g. 0-63)")
    return frozenset(rank for first, last in spans for rank in range(first, last + 1))


def format_ranks(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5" (what `--ranks` takes)."""
    runs: list[list[int]] = []
    for rank in sorted(set(ranks)):
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


@dataclass(frozen=True)
class Selection:
    """Which pods of the job to show: one pod, one node rank, a set of ranks, all, or the default."""

    rank: int | None = None
    pod: str | None = None
    ranks: frozenset[int] | None = None
    every: bool = False

    @property
    def explicit(self) -> bool:
        return self.every or self.rank is not None or self.pod is not None or self.ranks is not None

    def wants(self, job: jobs.Job, pod: dict[str, Any], *, job_size: int) -> bool:
        summary = status.pod_summary(job.api, pod)
        if self.pod is not None:
            return summary.name == self.pod
        rank = job.api.node_rank(job.obj, summary.role, summary.index)
        if self.rank is not None:
            return rank == self.rank
        if self.ranks is not None:
            return rank in self.ranks
        return self.every or job_size <= READABLE_PODS or rank == 0 or troubled(pod, job.api.container)

    def none_message(self, name: str) -> str:
        if self.pod is not None:
            return f"job {name} has no pod named {self.pod}"
        if self.rank is not None:
            return f"job {name} has no pod with rank {self.rank} (yet)"
        if self.ranks is not None:
            return f"job {name} has no pod with those ranks (yet)"
        return f"job {name} has no pods yet"


def troubled(pod: dict[str, Any], container: str) -> bool:
    """A pod worth reading although not asked for: it failed, its container restarted or ended in error."""
    if read.text(read.dig(pod, "status", "phase")) == "Failed":
        return True
    found = read.container_status(pod, container)
    if read.to_int(found.get("restartCount")) > 0:
        return True
    for state in ("state", "lastState"):
        code = read.dig(found, state, "terminated", "exitCode")
        if isinstance(code, int) and code != 0:
            return True
    return False


def _ordered(job: jobs.Job, pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(pods, key=lambda p: status.pod_order(job.api, status.pod_summary(job.api, p)))


def _job_size(job: jobs.Job, pods: int) -> int:
    """The job's pods: as many as its spec asks for, or as many as exist (during a restart, more)."""
    return max(job.api.nodes_and_gpus(job.obj)[0], pods)


def _node_rank(job: jobs.Job, pod: dict[str, Any]) -> int:
    summary = status.pod_summary(job.api, pod)
    return job.api.node_rank(job.obj, summary.role, summary.index)


def _check_in_range(job: jobs.Job, selection: Selection, pods: int) -> None:
    """`--rank`/`--ranks` that no node of the job has (its spec's nodes, or its `pods` if more: during a
    restart) is a usage error (with -f it would wait for pods that never come); ranks some of which exist
    show those."""
    nodes = _job_size(job, pods)
    wanted = {selection.rank} if selection.rank is not None else selection.ranks
    if nodes > 0 and wanted and min(wanted) >= nodes:
        flag = (
            f"--rank {selection.rank}"
            if selection.rank is not None
            else f"--ranks {format_ranks(list(wanted))}"
        )
        raise UsageError(
            f"{flag}: job {job.name} has {nodes} node{'s' if nodes != 1 else ''}, ranks 0-{nodes - 1}"
        )


def _rest_hint(job: jobs.Job, shown: int, total: int, how: str) -> str:
    return (
        f"showing {shown} of {total} pods ({how}); `orch logs {job.name} --all` shows every pod, "
        f"`--ranks 0-63` some of them"
    )


def stream_logs(
    cluster: Cluster,
    name: str,
    *,
    emit: Emit,
    notice: Notice = lambda message: None,
    follow: bool = False,
    rank: int | None = None,
    pod: str | None = None,
    ranks: frozenset[int] | None = None,
    every: bool = False,
    tail: int | None = None,
    since_seconds: int | None = None,
    max_requests: int = DEFAULT_MAX_REQUESTS,
    drain_seconds: float = 10.0,
) -> jobs.Job | None:
    """Every selected pod's log as `emit(label, line)`. Returns the last job seen (None: it was deleted)."""
    job = jobs.locate(cluster, name)
    selection = Selection(rank=rank, pod=pod, ranks=ranks, every=every)
    if follow:
        if rank is not None or ranks is not None:  # one list, so that ranks no pod can have are said now
            _check_in_range(job, selection, len(jobs.job_pods(cluster, job)))
        follower = LogFollower(cluster, job, selection, emit=emit, notice=notice, tail=tail,
                               since_seconds=since_seconds, drain_seconds=drain_seconds,
                               max_requests=max_requests)  # fmt: skip
        return follower.run()
    every_pod = jobs.job_pods(cluster, job)
    _check_in_range(job, selection, len(every_pod))
    size = _job_size(job, len(every_pod))
    pods = _ordered(job, [p for p in every_pod if selection.wants(job, p, job_size=size)])
    if not pods:
        notice(selection.none_message(name))
    elif not selection.explicit and len(pods) < len(every_pod):
        notice(_rest_hint(job, len(pods), len(every_pod), "rank 0 and pods that failed or restarted"))

    def logged(p: dict[str, Any]) -> tuple[status.PodSummary, list[str]]:
        summary = status.pod_summary(job.api, p)
        if not read.container_started(p, job.api.container):
            return summary, []
        lines = cluster.log_lines(summary.name, container=job.api.container, tail=tail,
                                  since_seconds=since_seconds)  # fmt: skip
        return summary, list(lines)

    # `max_requests` streams at once; each pod's lines are printed whole and together, in display order.
    with ThreadPoolExecutor(max_workers=max(1, max_requests), thread_name_prefix="orch-logs") as pool:
        for p, (summary, lines) in zip(pods, pool.map(logged, pods), strict=True):
            if not read.container_started(p, job.api.container):
                notice(f"[{summary.label}] {summary.name} has not started yet ({summary.phase})")
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
    response: Any = None  # the open stream, to end it (`LogFollower.tick`)


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
        max_requests: int = DEFAULT_MAX_REQUESTS,
    ) -> None:
        self.cluster, self.job, self.selection = cluster, job, selection
        self.emit, self.notice = emit, notice
        self.tail, self.since_seconds, self.drain_seconds = tail, since_seconds, drain_seconds
        self.max_requests = max(1, max_requests)
        # what the readers and the watches send: ("line", label, text) | ("job", obj | None) |
        # ("pods", change, pod | None, pods by name) | ("error", ClusterError)
        self.inbox: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self.readers: dict[str, _Reader] = {}  # pod name -> its current (or last) reader
        self.pods: dict[str, dict[str, Any]] = {}  # the watch's current pods, by name
        self.unfollowed: dict[str, int] = {}  # wanted pods left out by the stream cap -> node rank
        self.waiting_noted: set[str] = set()
        self.finished_at: float | None = None
        self.synced = False  # the first pod list arrived
        self.restarts: int | None = None  # whole-job restarts seen so far (None: not counted yet)
        self.stopped = threading.Event()
        self.threads: list[threading.Thread] = []  # watches and readers, ended and joined at the end

    def run(self) -> jobs.Job | None:
        with self.cluster.patiently():  # waiting for the job: the deadline bounds each request alone
            try:
                return self._run()
            finally:
                self.stopped.set()
                self.cluster.close_streams()
                for thread in self.threads:
                    thread.join(timeout=1.0)

    def _watch(self, what: str, stream: Iterator[tuple[str, dict[str, Any] | None, dict[str, Any]]]) -> None:
        try:
            for change, obj, current in stream:
                if self.stopped.is_set():
                    return
                if what == "job":
                    self.inbox.put(("job", current.get(self.job.name)))
                elif change == "SYNC":
                    self.inbox.put(("pods", change, None, dict(current)))
                else:
                    self.inbox.put(("pods", change, obj, None))
        except ClusterError as e:
            self.inbox.put(("error", e))

    def _run(self) -> jobs.Job | None:
        selector = self.job.api.pod_selector(self.job.name)
        for what, stream in (
            ("job", self.cluster.observe(self.job.api.resource, name=self.job.name)),
            ("pods", self.cluster.observe(POD, selector=selector)),
        ):
            self._thread(self._watch, what, stream, name=f"orch-watch-{what}")
        next_tick = time.monotonic() + poll_seconds()
        container = self.job.api.container
        while True:
            try:
                item = self.inbox.get(timeout=max(0.0, min(0.2, next_tick - time.monotonic())))
            except queue.Empty:
                item = None
            if item is not None:
                kind = item[0]
                if kind == "line":
                    self.emit(item[1], item[2])
                    continue
                if kind == "error":
                    raise item[1]
                if kind == "done":
                    pod = self.pods.get(item[1])
                    if self.finished_at is not None and pod and not read.container_running(pod, container):
                        self.consider(pod)  # the job is over, the container exited: read the rest now
                    continue
                if kind == "job":
                    if item[1] is None:
                        self.notice(f"job {self.job.name} was deleted")
                        return None
                    self.job = jobs.Job(self.job.api, item[1])
                    if self.finished_at is None and self.job.phase in status.FINISHED:
                        self.finished_at = time.monotonic()
                elif kind == "pods":
                    _, change, pod, listed = item
                    if change == "SYNC":
                        self.pods = listed
                        self._synced()
                    elif change == "DELETED":
                        self.pods.pop(read.text(read.dig(pod, "metadata", "name")), None)
                    else:
                        self.pods[read.text(read.dig(pod, "metadata", "name"))] = pod
                        self.consider(pod)
            if time.monotonic() >= next_tick:
                self.tick()  # no requests: the cached pods, for readers that ended
                next_tick = time.monotonic() + poll_seconds()
            if self.finished_at is not None and self.synced:
                # A reader that ended with an error (a stream that broke as the container exited) is not
                # drained: the next tick reads on from its last line.
                drained = self.inbox.empty() and all(
                    r.done.is_set() and (r.error is None or isinstance(r.error, Forbidden))
                    for r in self.readers.values()
                )
                if drained or time.monotonic() - self.finished_at > self.drain_seconds:
                    while not self.inbox.empty():
                        left = self.inbox.get_nowait()
                        if left[0] == "line":
                            self.emit(left[1], left[2])
                    self._say_unfollowed()
                    return self.job

    def _synced(self) -> None:
        pods = _ordered(self.job, list(self.pods.values()))
        if not self.synced:
            self.synced = True
            self.restarts = self.job.api.restarts(self.job.obj, pods)
            size = _job_size(self.job, len(pods))
            wanted = [p for p in pods if self.selection.wants(self.job, p, job_size=size)]
            if not wanted:
                self.notice(self.selection.none_message(self.job.name) + "; waiting for them")
            elif not self.selection.explicit and len(wanted) < len(pods):
                how = "rank 0 and pods that fail or restart"
                self.notice(_rest_hint(self.job, len(wanted), size, how))
        for p in pods:
            self.consider(p)

    def tick(self) -> None:
        """Every poll interval, from the watched state: whole-job restarts, and readers to resume."""
        pods = list(self.pods.values())
        restarts = self.job.api.restarts(self.job.obj, pods)
        if self.restarts is not None and self.job.api.restarts_whole_job and restarts > self.restarts:
            self.notice(f"job {self.job.name} restarted: every pod was recreated (restart {restarts})")
            self.restarts = restarts
        for name, reader in list(self.readers.items()):
            if reader.done.is_set() and name in self.pods:
                self.consider(self.pods[name])
            elif (
                self.finished_at is not None
                and name in self.pods
                and reader.response is not None
                and not read.container_running(self.pods[name], self.job.api.container)
            ):
                # the job is over and this container exited, its stream still open: end it; what it logged
                # after its last line is read by one plain read (`consider`)
                with contextlib.suppress(Exception):
                    reader.response.shutdown()
        self._start_unfollowed()

    def consider(self, p: dict[str, Any]) -> None:
        """Start, restart or resume the reader of one pod, as its state asks."""
        if not self.selection.wants(self.job, p, job_size=_job_size(self.job, len(self.pods))):
            return
        container = self.job.api.container
        summary = status.pod_summary(self.job.api, p)
        key = (read.text(read.dig(p, "metadata", "uid")), summary.restarts)
        current = self.readers.get(summary.name)
        if not read.container_started(p, container):
            if summary.name not in self.waiting_noted:
                self.notice(f"[{summary.label}] waiting for {summary.name} to start ({summary.phase})")
                self.waiting_noted.add(summary.name)
            return
        if current is None:
            if self._streams_open() >= self.max_requests:
                self.unfollowed.setdefault(summary.name, _node_rank(self.job, p))
                return
            self.start(summary, key)
        elif current.done.is_set():
            if current.key != key:
                if key[0] == current.key[0]:
                    self.notice(f"[{summary.label}] container restarted (restart {key[1]})")
                self.start(summary, key)  # a new container instance, or a recreated pod
            elif isinstance(current.error, Forbidden):
                raise current.error  # retrying cannot help: say so instead of showing nothing
            elif current.error is not None or read.container_running(p, container):
                # the stream broke: follow on from its last line, or, the container having exited, read the rest
                follow = read.container_running(p, container)
                self.start(summary, key, resume_after=current.last_timestamp, follow=follow)

    def _streams_open(self) -> int:
        return sum(not r.done.is_set() for r in self.readers.values())

    def _start_unfollowed(self) -> None:
        """A stream ended: the next pod left out by the cap gets its place (read from its start)."""
        for name in sorted(self.unfollowed, key=self.unfollowed.__getitem__):
            if self._streams_open() >= self.max_requests:
                return
            del self.unfollowed[name]
            if name in self.pods:
                self.consider(self.pods[name])

    def _say_unfollowed(self) -> None:
        if self.unfollowed:
            ranks = format_ranks(list(self.unfollowed.values()))
            self.notice(
                f"{len(self.unfollowed)} pods were not followed (at most {self.max_requests} log streams at "
                f"once, --max-log-requests); their logs: orch logs {self.job.name} --ranks {ranks}"
            )

    def start(
        self, pod: status.PodSummary, key: tuple[str, int], resume_after: str = "", *, follow: bool = True
    ) -> None:
        """A thread that follows one container instance (or, not `follow`, reads it once) and queues its lines."""
        # The first reader of a pod honours --tail/--since; a restarted container is read from its start.
        options: dict[str, Any] = {"follow": follow, "timestamps": True}
        if resume_after:
            options["since_seconds"] = max(1, int(time.time() - _epoch(resume_after)) + 1)
        elif pod.name not in self.readers:
            options.update(tail=self.tail, since_seconds=self.since_seconds)
        reader = _Reader(key=key, last_timestamp=resume_after)
        self.readers[pod.name] = reader
        self._thread(self._read, reader, pod, options, resume_after, name=f"orch-logs-{pod.name}")

    def _thread(self, target: Callable[..., None], *args: Any, name: str) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self.threads.append(thread)
        thread.start()

    def _read(
        self, reader: _Reader, pod: status.PodSummary, options: dict[str, Any], resume_after: str
    ) -> None:
        try:
            lines = self.cluster.log_lines(pod.name, container=self.job.api.container,
                                           opened=lambda response: setattr(reader, "response", response),
                                           **options)  # fmt: skip
            for raw in lines:
                stamp, _, text = raw.partition(" ")
                if resume_after and _stamp_key(stamp) <= _stamp_key(resume_after):
                    continue  # already shown before the stream was resumed
                reader.last_timestamp = stamp
                self.inbox.put(("line", pod.label, text))
        except ClusterError as e:
            # the stream broke (read on from the last line), or the container is between restarts
            reader.error = e
        finally:
            reader.response = None
            reader.done.set()
            self.inbox.put(("done", pod.name))


def _stamp_key(timestamp: str) -> tuple[str, float]:
    """Sortable form of an RFC3339Nano log timestamp (Go trims trailing zeros, so strings do not sort)."""
    whole, _, fraction = timestamp.rstrip("Z").partition(".")
    return whole, float(f"0.{fraction or 0}")


def _epoch(timestamp: str) -> float:
    whole, fraction = _stamp_key(timestamp)
    parsed = read.parse_time(whole + "+00:00")
    return parsed.timestamp() + fraction if parsed else time.time()
