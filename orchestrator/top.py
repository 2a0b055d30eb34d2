"""`orch top`'s numbers: one row per rank (and per GPU no rank claims) with utilisation, memory, power,
samples/s and loss, the summary of a job past a screen of ranks, and the straggler `orch status` names.

Two sources, the same rows:
- Prometheus' HTTP API (a cluster job, or anything Prometheus scrapes): instant queries over the series the
  trainer exports (docs/metrics.md); samples/s is `rate(...[1m])`.
- A run's exporters directly (`orch run` on this machine): the `/metrics` text of each node, scraped twice
  `interval` seconds apart for samples/s.
Ranks are joined to their GPU through `orch_rank_info{gpu_uuid}`. `Metrics` is `orch top`'s loop (one
source, a `Snapshot` at a time); `orch top` prints them (orchestrator/commands/top_cmd.py, tables.py). Stdlib
only (urllib), plus prometheus-client's text parser for exporters.

Over 600 lines, kept whole: the two sources, the rows, the summary and the straggler share the series' names
and the reading of a rank's labels (`SPREAD`, `_ranked`, `_Series`); split, those would cross modules for what
is one command's reading.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import status
from orchestrator.errors import OrchError, UsageError


class TopError(OrchError):
    """Prometheus or an exporter could not be read."""


@dataclass
class Row:
    rank: int | None = None  # None: a GPU that no rank reports using
    node_rank: str = ""
    local_rank: str = ""
    hostname: str = ""
    gpu: str = ""
    gpu_uuid: str = ""
    step: float | None = None
    loss: float | None = None
    samples_per_second: float | None = None
    gpu_utilization: float | None = None  # 0-1
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    power_watts: float | None = None
    ready_seconds: float | None = None  # time of the last step until this rank reached the gradient reduction


@dataclass
class _Series:
    """name -> list of (labels, value) from one source."""

    values: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)

    def add(self, name: str, labels: dict[str, str], value: float) -> None:
        self.values.setdefault(name, []).append((labels, value))

    def by(self, name: str, key: str) -> dict[str, float]:
        return {labels.get(key, ""): value for labels, value in self.values.get(name, [])}


# --- where to read from ---------------------------------------------------------------------------------------


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(os.environ.get("ORCH_CONFIG") or os.path.join(base, "orch", "config.yaml"))


def prometheus_url(flag: str | None) -> str | None:
    """--prometheus, else ORCH_PROMETHEUS_URL, else `prometheus_url:` in orch's config file, else None."""
    if flag:
        return flag.rstrip("/")
    if os.environ.get("ORCH_PROMETHEUS_URL"):
        return os.environ["ORCH_PROMETHEUS_URL"].rstrip("/")
    path = config_path()
    if path.is_file():
        import yaml

        try:
            config = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as error:
            raise UsageError(f"{path}: not valid YAML ({error.__class__.__name__})") from error
        url = config.get("prometheus_url") if isinstance(config, dict) else None
        if url:
            return str(url).rstrip("/")
    return None


def local_exporter_url(port: int | None, job: str | None = None) -> str:
    from orchestrator import (
        runtime_env,
    )  # here: it imports the spec (pydantic), which `orch status` never needs

    env_port = runtime_env.RuntimeEnv.from_environ().metrics_port
    if not port and not env_port and job:
        from orchestrator import local  # the live `orch run` of this job records where it serves

        if url := local.metrics_url_of(job):
            return url
    port = port or env_port or runtime_env.DEFAULT_METRICS_PORT
    return f"http://127.0.0.1:{port}/metrics"


# --- Prometheus ------------------------------------------------------------------------------------------------


# What one answer may be: the instant vector of one series per GPU of the largest job is a few MiB.
MAX_ANSWER_BYTES = 64 * 2**20


def _get(url: str, timeout: float) -> bytes:
    """The body at `url`, read within `timeout` seconds in all (not per socket read: a server that sends a
    byte at a time cannot hold `orch top` longer) and at most MAX_ANSWER_BYTES; else one TopError."""
    where = url.split("?")[0]
    deadline = time.monotonic() + timeout
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = bytearray()
            while chunk := response.read1(2**16):
                body += chunk
                if len(body) > MAX_ANSWER_BYTES:
                    raise TopError(
                        f"{where}: its answer is larger than {MAX_ANSWER_BYTES // 2**20} MiB, more than a "
                        "Prometheus or an exporter sends for one job"
                    )
                if time.monotonic() > deadline:
                    raise TopError(f"{where}: its answer was still arriving after {timeout:g}s")
            return bytes(body)
    except urllib.error.HTTPError as error:
        detail = error.read(2**12).decode(errors="replace")[:200].replace("\n", " ")
        raise TopError(f"{where}: HTTP {error.code} {detail}") from error
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise TopError(f"cannot reach {where}: {reason}") from error


def _prometheus_query(
    base: str, expr: str, timeout: float, at: float | None = None
) -> list[tuple[dict[str, str], float]]:
    """The instant vector `expr` (at `at`, default now); an answer that is not Prometheus's JSON is one error,
    a malformed sample is skipped (whatever a server sends, no traceback)."""
    params = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
    raw = _get(f"{base}/api/v1/query?{urllib.parse.urlencode(params)}", timeout)
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):  # nesting past the parser's stack is no Prometheus answer either
        shown = " ".join(raw[:80].decode(errors="replace").split())
        raise TopError(f"{base} is not a Prometheus API (its answer is not JSON: {shown})") from None
    if not isinstance(body, dict) or body.get("status") != "success":
        error = body.get("error", body) if isinstance(body, dict) else body
        raise TopError(f"{base}: query failed: {str(error)[:200]}")
    data = body.get("data")
    result = data.get("result") if isinstance(data, dict) else None
    samples = []
    for item in result if isinstance(result, list) else []:
        metric, value = (item.get("metric"), item.get("value")) if isinstance(item, dict) else (None, None)
        if not isinstance(metric, dict) or not isinstance(value, list) or len(value) != 2:
            continue
        try:
            number = float(value[1])
        except (TypeError, ValueError):
            continue
        samples.append(({str(k): str(v) for k, v in metric.items()}, number))
    return samples


def from_prometheus(
    base: str, job: str, *, namespace: str | None = None, window: str = "1m", timeout: float = 10.0
) -> list[Row]:
    matchers = [f'job="{job}"'] + ([f'namespace="{namespace}"'] if namespace else [])
    sel = "{" + ", ".join(matchers) + "}"
    series = _Series()
    queries = {
        "orch_rank_info": f"orch_rank_info{sel}",
        "orch_train_step": f"orch_train_step{sel}",
        "orch_train_loss": f"orch_train_loss{sel}",
        "orch_train_step_ready_seconds": f"orch_train_step_ready_seconds{sel}",
        "samples_per_second": f"sum by (rank) (rate(orch_train_samples_total{sel}[{window}]))",
        "orch_gpu_info": f"orch_gpu_info{sel}",
        "orch_gpu_utilization_ratio": f"orch_gpu_utilization_ratio{sel}",
        "orch_gpu_memory_used_bytes": f"orch_gpu_memory_used_bytes{sel}",
        "orch_gpu_memory_total_bytes": f"orch_gpu_memory_total_bytes{sel}",
        "orch_gpu_power_watts": f"orch_gpu_power_watts{sel}",
    }
    for name, expr in queries.items():
        for labels, value in _prometheus_query(base, expr, timeout):
            series.add(name, labels, value)
    return _rows(series)


# --- exporters -------------------------------------------------------------------------------------------------


def _scrape(url: str, job: str, timeout: float) -> _Series:
    from prometheus_client.parser import text_string_to_metric_families

    text = _get(url, timeout).decode(errors="replace")
    series = _Series()
    others: set[str] = set()  # the jobs this endpoint serves instead
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.labels.get("job") == job:
                    series.add(sample.name, dict(sample.labels), sample.value)
                elif sample.name.startswith("orch_") and "job" in sample.labels:
                    others.add(sample.labels["job"])
    except (
        ValueError,
        TypeError,
        IndexError,
        KeyError,
    ) as error:  # the parser's ways of saying "not metrics"
        raise TopError(
            f"{url} does not serve Prometheus metrics ({error.__class__.__name__}: {error})"
        ) from None
    if not series.values and others:
        # another run (or another program) owns the port: its numbers are not this job's
        raise TopError(
            f"{url} serves the metrics of {', '.join(sorted(others))}, not of job {job}: is {job} running "
            "here? (`orch run` prints its metrics URL; --port or --exporter picks another)"
        )
    return series


def from_exporters(
    urls: list[str],
    job: str,
    *,
    previous: tuple[float, _Series] | None = None,
    interval: float = 1.0,
    timeout: float = 10.0,
) -> tuple[list[Row], tuple[float, _Series]]:
    """Rows from the exporters; samples/s from `previous` (the last call's second return value) or a second
    scrape `interval` seconds later."""

    def scrape_all() -> tuple[float, _Series]:
        merged = _Series()
        for url in urls:
            for name, items in _scrape(url, job, timeout).values.items():
                for labels, value in items:
                    merged.add(name, labels, value)
        return time.monotonic(), merged

    if previous is None:
        previous = scrape_all()
        time.sleep(interval)
    now, current = scrape_all()
    before, after = (
        previous[1].by("orch_train_samples_total", "rank"),
        current.by("orch_train_samples_total", "rank"),
    )
    elapsed = now - previous[0]
    for rank, total in after.items():
        if rank in before and elapsed > 0 and total >= before[rank]:
            current.add("samples_per_second", {"rank": rank}, (total - before[rank]) / elapsed)
    return _rows(current), (now, current)


# --- the rows: each rank's numbers, joined to its GPU ------------------------------------------------------


def _rank_number(label: str) -> int | None:
    """A `rank` label as a number; None for anything else a server sends ("²" and a 5000-digit string are
    digits to str.isdigit, and no int)."""
    return int(label) if re.fullmatch(r"[0-9]{1,9}", label) else None


def _rows(series: _Series) -> list[Row]:
    gpu_values = {
        name: series.by(name, "gpu_uuid")
        for name in (
            "orch_gpu_utilization_ratio",
            "orch_gpu_memory_used_bytes",
            "orch_gpu_memory_total_bytes",
            "orch_gpu_power_watts",
        )
    }
    gpus = {
        labels.get("gpu_uuid", ""): labels
        for name in ("orch_gpu_info", *gpu_values)
        for labels, _ in series.values.get(name, [])
    }
    step, loss = series.by("orch_train_step", "rank"), series.by("orch_train_loss", "rank")
    ready = series.by("orch_train_step_ready_seconds", "rank")
    rate = series.by("samples_per_second", "rank")
    ranks = {
        labels["rank"]: labels for labels, _ in series.values.get("orch_rank_info", []) if "rank" in labels
    }
    for rank in step:  # a rank without an info series still gets a row
        ranks.setdefault(rank, {"rank": rank})

    def with_gpu(row: Row, uuid: str) -> Row:
        labels = gpus.get(uuid, {})
        row.gpu, row.gpu_uuid = labels.get("gpu", ""), uuid
        row.hostname = row.hostname or labels.get("hostname", "")
        row.gpu_utilization = gpu_values["orch_gpu_utilization_ratio"].get(uuid)
        row.memory_used_bytes = gpu_values["orch_gpu_memory_used_bytes"].get(uuid)
        row.memory_total_bytes = gpu_values["orch_gpu_memory_total_bytes"].get(uuid)
        row.power_watts = gpu_values["orch_gpu_power_watts"].get(uuid)
        return row

    rows, claimed = [], set()

    def order(item: tuple[str, dict[str, str]]) -> int:
        number = _rank_number(item[0])
        return number if number is not None else 1 << 31

    for rank, labels in sorted(ranks.items(), key=order):
        row = Row(
            rank=_rank_number(rank),
            node_rank=labels.get("node_rank", ""),
            local_rank=labels.get("local_rank", ""),
            hostname=labels.get("hostname", ""),
            step=step.get(rank),
            loss=loss.get(rank),
            samples_per_second=rate.get(rank),
            ready_seconds=ready.get(rank),
        )
        uuid = labels.get("gpu_uuid", "")
        if uuid:
            claimed.add(uuid)
            with_gpu(row, uuid)
        rows.append(row)
    for uuid in sorted(
        set(gpus) - claimed - {""}, key=lambda u: (gpus[u].get("hostname", ""), gpus[u].get("gpu", ""))
    ):
        rows.append(with_gpu(Row(node_rank=gpus[uuid].get("node_rank", "")), uuid))
    return rows


# --- a job past a screen of ranks: summary, spread, worst ranks ---------------------------------------------------

TABLE_RANKS = 16  # up to this many ranks the table is the view; beyond it the summary (--all: every row)

# What the spread is shown of: (name, label, PromQL of one value per rank or GPU, Python source in a Row)
SPREAD = (
    ("ready_seconds", "time to reduction (s)", "orch_train_step_ready_seconds{sel}"),
    ("step_seconds", "step time (s)", "orch_train_last_step_seconds{sel}"),
    (
        "since_last_step_seconds",
        "since last step (s)",
        "time() - orch_train_last_step_timestamp_seconds{sel}",
    ),
    ("gpu_utilization", "GPU utilisation", "orch_gpu_utilization_ratio{sel}"),
    ("memory_used_bytes", "GPU memory (GiB)", "orch_gpu_memory_used_bytes{sel}"),
)


@dataclass
class Spread:
    min: float | None = None
    median: float | None = None
    max: float | None = None


@dataclass
class Ranked:
    """One rank among the worst: who it is, where it runs, and the value it is ranked by."""

    rank: str
    node_rank: str
    pod: str
    hostname: str
    value: float


@dataclass
class Summary:
    job: str
    ranks: int = 0
    step: float | None = None
    samples_per_second: float | None = None
    mfu: float | None = None
    memory_used_bytes: float | None = None
    spread: dict[str, Spread] = field(default_factory=dict)
    slowest: list[Ranked] = field(default_factory=list)  # longest to the gradient reduction: stragglers
    stopped: list[Ranked] = field(default_factory=list)  # longest since their last step: a hang's first


def summary_from_prometheus(
    base: str,
    job: str,
    *,
    namespace: str | None = None,
    worst: int = 5,
    window: str = "1m",
    timeout: float = 10.0,
    at: float | None = None,
) -> Summary:
    """The job's summary computed by Prometheus: aggregations and topk, a few dozen numbers whatever the
    number of ranks (no series is fetched per rank)."""
    matchers = [f'job="{job}"'] + ([f'namespace="{namespace}"'] if namespace else [])
    sel = "{" + ", ".join(matchers) + "}"

    def scalar(expr: str) -> float | None:
        samples = _prometheus_query(base, expr, timeout, at)
        return samples[0][1] if samples else None

    out = Summary(job=job)
    ranks = scalar(f"count(orch_train_step{sel})")  # a count; a server may still answer NaN or +Inf
    out.ranks = int(ranks) if ranks is not None and math.isfinite(ranks) and 0 <= ranks < 2**31 else 0
    out.step = scalar(f"max(orch_train_step{sel})")
    out.samples_per_second = scalar(f"sum(rate(orch_train_samples_total{sel}[{window}]))")
    out.mfu = scalar(f"avg(orch_train_mfu_ratio{sel})")
    out.memory_used_bytes = scalar(f"sum(orch_gpu_memory_used_bytes{sel})")
    for name, _, template in SPREAD:
        expr = template.format(sel=sel)
        out.spread[name] = Spread(
            scalar(f"min({expr})"), scalar(f"quantile(0.5, {expr})"), scalar(f"max({expr})")
        )
    where = f"max by (job, rank, hostname) (orch_rank_info{sel})"
    for target, expr in (
        (out.slowest, f"orch_train_step_ready_seconds{sel}"),
        (out.stopped, f"time() - orch_train_last_step_timestamp_seconds{sel}"),
    ):
        joined = f"topk({worst}, {expr}) * on (job, rank) group_left (hostname) {where}"
        for labels, value in sorted(_prometheus_query(base, joined, timeout, at), key=lambda item: -item[1]):
            target.append(_ranked(labels, value))
        if not target:  # no orch_rank_info (an exporter without it): the ranks without their host
            for labels, value in sorted(
                _prometheus_query(base, f"topk({worst}, {expr})", timeout, at), key=lambda item: -item[1]
            ):
                target.append(_ranked(labels, value))
    return out


def _ranked(labels: dict[str, str], value: float) -> Ranked:
    return Ranked(
        rank=labels.get("rank", ""),
        node_rank=labels.get("node_rank", ""),
        pod=labels.get("pod", ""),
        hostname=labels.get("hostname", ""),
        value=value,
    )


def summary_from_rows(job: str, rows: list[Row], *, worst: int = 5) -> Summary:
    """The same summary from an exporter's rows (a run on this machine: a handful of ranks)."""
    ranked = [r for r in rows if r.rank is not None]

    def spread(values: list[float]) -> Spread:
        import statistics

        return Spread(min(values), statistics.median(values), max(values)) if values else Spread()

    def total(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return sum(present) if present else None

    out = Summary(job=job, ranks=len(ranked))
    steps = [r.step for r in ranked if r.step is not None]
    out.step = max(steps) if steps else None
    out.samples_per_second = total([r.samples_per_second for r in ranked])
    out.memory_used_bytes = total([r.memory_used_bytes for r in rows])
    out.spread["ready_seconds"] = spread([r.ready_seconds for r in ranked if r.ready_seconds is not None])
    out.spread["gpu_utilization"] = spread([r.gpu_utilization for r in rows if r.gpu_utilization is not None])
    out.spread["memory_used_bytes"] = spread(
        [r.memory_used_bytes for r in rows if r.memory_used_bytes is not None]
    )
    by_ready = sorted(
        (r for r in ranked if r.ready_seconds is not None), key=lambda r: -(r.ready_seconds or 0)
    )
    out.slowest = [
        Ranked(str(r.rank), r.node_rank, "", r.hostname, r.ready_seconds or 0.0) for r in by_ready[:worst]
    ]
    return out


# --- the straggler, for `orch status` ---------------------------------------------------------------------------

STRAGGLER_RATIO = 2.0  # as the OrchStraggler alert: over twice the job's median time to the reduction...
STRAGGLER_MARGIN = 0.05  # ...and 50 ms more


def find_straggler(
    job: str,
    *,
    namespace: str | None = None,
    base: str | None = None,
    timeout: float = 3.0,
    at: float | None = None,
) -> status.Straggler | None:
    """The rank far behind the job's median (the alert's rule, on the last values), from the Prometheus that
    `orch top` reads; None when there is none, no Prometheus is configured, or it does not answer."""
    try:
        base = base or prometheus_url(None)
    except OrchError:
        return None
    if base is None:
        return None
    matchers = [f'job="{job}"'] + ([f'namespace="{namespace}"'] if namespace else [])
    sel = "{" + ", ".join(matchers) + "}"
    try:
        median = _prometheus_query(base, f"quantile(0.5, orch_train_step_ready_seconds{sel})", timeout, at)
        where = f"max by (job, rank, hostname) (orch_rank_info{sel})"
        slowest = _prometheus_query(
            base, f"topk(1, orch_train_step_ready_seconds{sel}) * on (job, rank) group_left (hostname) {where}",
            timeout, at,
        )  # fmt: skip
        if not slowest:
            slowest = _prometheus_query(base, f"topk(1, orch_train_step_ready_seconds{sel})", timeout, at)
    except TopError:
        return None
    if not median or not slowest:
        return None
    middle, (labels, value) = median[0][1], slowest[0]
    if value <= STRAGGLER_RATIO * middle or value - middle <= STRAGGLER_MARGIN:
        return None
    ranked = _ranked(labels, value)
    return status.Straggler(ranked.rank, ranked.node_rank, ranked.pod, ranked.hostname, value, middle)


# --- `orch top`: one job's metrics, read again and again ----------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """One reading of a job's metrics: a row per rank (and per GPU no rank claims), and its summary."""

    job: str
    rows: list[Row]
    summary: Summary | None  # past TABLE_RANKS ranks, or when asked for; None: not read

    @property
    def ranks(self) -> int:
        return len([r for r in self.rows if r.rank is not None])

    def to_dict(self) -> dict[str, Any]:
        """As `orch top -o json` prints it."""
        summary = asdict(self.summary) if self.summary else None
        snapshot = {"job": self.job, "summary": summary, "rows": [asdict(row) for row in self.rows]}
        return {key: _json_numbers(value) for key, value in snapshot.items()}


def _json_numbers(value: Any) -> Any:
    """NaN and infinities as Prometheus' own API writes them ("NaN", "+Inf", "-Inf"): JSON has no such
    numbers (json.dumps would print a bare NaN, which jq and every strict parser refuse), and a loss of NaN
    is what a diverged run reports."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")
    if isinstance(value, dict):
        return {k: _json_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_numbers(v) for v in value]
    return value


class Metrics:
    """Where `orch top` reads job `job`'s metrics: the `exporters` (their /metrics URLs: a run on this
    machine, or one per node), else Prometheus at `prometheus` (else $ORCH_PROMETHEUS_URL, else
    `prometheus_url` in orch's config file), its series filtered by `namespace`. UsageError when both or
    neither are given. `worst`: how many of the slowest and longest-stopped ranks a summary names."""

    def __init__(
        self,
        job: str,
        *,
        prometheus: str | None = None,
        exporters: Sequence[str] = (),
        namespace: str | None = None,
        worst: int = 5,
    ) -> None:
        self.job, self.namespace, self.worst = job, namespace, worst
        self.exporters = list(exporters)
        self.prometheus = None
        if self.exporters:
            if prometheus:
                raise UsageError("use either --prometheus or --local/--exporter, not both")
        else:
            self.prometheus = prometheus_url(prometheus)
            if self.prometheus is None:
                raise UsageError(
                    "no Prometheus URL: pass --prometheus URL, set ORCH_PROMETHEUS_URL or prometheus_url in "
                    f"{config_path()}; or --local for a run on this machine"
                )
        self._previous: tuple[float, _Series] | None = None  # the exporters' last scrape, for samples/s

    @property
    def source(self) -> str:
        """Where it reads, as `orch top` names it."""
        return self.prometheus or ", ".join(self.exporters)

    def snapshot(self, *, summary: bool = True, interval: float = 1.0) -> Snapshot:
        """The job's metrics now, with its summary; with `summary=False` only past TABLE_RANKS ranks, where
        `orch top` shows it instead of the rows (from Prometheus it costs a few dozen queries, from exporters
        nothing). From exporters, samples/s is the rate since the last snapshot; the first one scrapes twice,
        `interval` seconds apart."""
        if self.prometheus is not None:
            rows = from_prometheus(self.prometheus, self.job, namespace=self.namespace)
            wanted = summary or len([r for r in rows if r.rank is not None]) > TABLE_RANKS
            found = (
                summary_from_prometheus(self.prometheus, self.job, namespace=self.namespace, worst=self.worst)
                if wanted
                else None
            )
            return Snapshot(self.job, rows, found)
        rows, self._previous = from_exporters(
            self.exporters, self.job, previous=self._previous, interval=interval
        )
        return Snapshot(self.job, rows, summary_from_rows(self.job, rows, worst=self.worst))

    def follow(self, interval: float = 2.0, *, summary: bool = True) -> Iterator[Snapshot]:
        """A snapshot every `interval` seconds for as long as the caller iterates (`orch top`'s refresh)."""
        while True:
            yield self.snapshot(summary=summary, interval=min(interval, 1.0))
            time.sleep(interval)
