"""Prometheus exporter for the trainer: training series of every local rank and GPU series, one endpoint per node.

How the ranks of one node (pod) share one scrape endpoint: prometheus-client's multiprocess mode.
- Every rank writes its own series into memory-mapped files in one directory per node
  (`PROMETHEUS_MULTIPROC_DIR`, default `<tmp>/orch-metrics-<job>-<port>`). A write is a store into a mmap:
  no socket, no thread, no host-device synchronisation in the training step.
- Local rank 0 also serves HTTP on the metrics port: its registry merges every rank's files on each scrape
  (`MultiProcessCollector`) and adds the GPU series its background sampler (gpu.py) read last.
- Gauges use mode `livemostrecent`: each series is written by exactly one rank, and a dead rank's gauges drop out.
- Files of processes that are no longer alive are deleted at start and on every scrape (after an elastic restart
  the new workers must not inherit the old workers' counters; a reused pid must not reopen a stale file).

The exporter must never take training down: a port in use or any exporter error is a warning, not a crash.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from orchestrator import outputs
from orchestrator.trainer.mfu import mfu, peak_flops

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client import CollectorRegistry
    from prometheus_client.core import Metric

    from orchestrator.goodput import Goodput
    from orchestrator.runtime_env import RuntimeEnv
    from orchestrator.trainer import gpu
    from orchestrator.trainer.gpu import GpuCollector
    from orchestrator.trainer.report import StepStats

log = logging.getLogger(__name__)

# Step time buckets (seconds): 5 ms to 2 min, ~1.6x apart, so p50/p95 interpolate within ~25%.
STEP_SECONDS_BUCKETS = (
    0.005, 0.01, 0.015, 0.025, 0.04, 0.06, 0.1, 0.15, 0.25, 0.4, 0.6,
    1.0, 1.5, 2.5, 4.0, 6.0, 10.0, 15.0, 25.0, 40.0, 60.0, 120.0,
)  # fmt: skip

# --- the multiprocess directory ----------------------------------------------------------------------------------

_DB_FILE = re.compile(r"_(\d+)\.db$")


def default_multiproc_dir(job: str, port: int) -> Path:
    return Path(tempfile.gettempdir()) / f"orch-metrics-{job}-{port}"


def prune_dead_files(directory: Path, *, also_pid: int | None = None) -> list[str]:
    """Delete the metric files of processes that are gone (and of `also_pid`: our own stale files at start)."""
    removed = []
    for path in directory.glob("*.db"):
        match = _DB_FILE.search(path.name)
        if match is None:
            continue
        pid = int(match.group(1))
        if pid == also_pid or not outputs.pid_alive(pid):
            try:
                path.unlink()
                removed.append(path.name)
            except FileNotFoundError:
                pass  # another rank pruned it first
    return removed


def _use_multiprocess_values(directory: Path) -> None:
    """Make prometheus-client store values in `directory` (it reads the env var once, at import)."""
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
    from prometheus_client import values

    if not getattr(values.ValueClass, "_multiprocess", False):
        values.ValueClass = values.MultiProcessValue()


class _LiveFilesCollector:
    """MultiProcessCollector that forgets dead processes first, so a crashed rank's series do not linger."""

    def __init__(self, directory: Path) -> None:
        from prometheus_client.multiprocess import MultiProcessCollector

        self._directory = directory
        self._inner = MultiProcessCollector(None, path=str(directory))

    def collect(self) -> Iterable[Metric]:
        prune_dead_files(self._directory)
        return self._inner.collect()


# --- the exporter -------------------------------------------------------------------------------------------------


class Meter(Protocol):
    """What the loop calls every step; PrometheusMetrics or, with metrics off, NullMetrics."""

    serving_port: int | None

    def on_step(self, stats: StepStats) -> None: ...

    def set_restart_count(self, count: int) -> None: ...

    def set_memory(self, **bytes_by_kind: int | None) -> None: ...

    def on_task_metrics(self, values: dict[str, float]) -> None: ...

    def on_goodput(self, result: Goodput) -> None: ...

    def close(self) -> None: ...


class NullMetrics:
    """Metrics that do nothing: used when metrics are disabled (no branches in the loop)."""

    serving_port: int | None = None

    def on_step(self, stats: StepStats) -> None:
        pass

    def set_restart_count(self, count: int) -> None:
        pass

    def set_memory(self, **bytes_by_kind: int | None) -> None:
        """Bytes of parameters, gradients and optimizer state this rank holds (FSDP: its shards)."""

    def on_task_metrics(self, values: dict[str, float]) -> None:
        """The task's own numbers (Task.on_log / on_eval) as orch_task_metric{name=...}."""

    def on_goodput(self, result: Goodput) -> None:
        """Rank 0, every few seconds (the heartbeat's thread): the job's goodput so far (goodput.py)."""

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class MetricsConfig:
    """Who this rank is, and how its series are written (what `build_metrics` reads from the environment)."""

    job: str
    rank: int
    local_rank: int
    node_rank: int
    device: str
    """torch device of this rank: "cuda:3", "cpu"."""
    directory: Path
    """The node's multiprocess directory: every rank's series files."""
    peak_flops: float | None = None
    """Peak FLOP/s of the device, for MFU; None: no MFU (and a gauge that says so)."""
    gpu_sample_seconds: float = 5.0
    """How often CUDA memory counters are read (the GPU sampler has its own interval)."""
    device_name: str | None = None
    gpu_uuid: str | None = None
    collective_timeout_seconds: float | None = None
    """train.collective_timeout: exported so the hang alert can say when the job will fail by itself."""

    @property
    def labels(self) -> dict[str, str]:
        return {"job": self.job, "rank": str(self.rank), "local_rank": str(self.local_rank),
                "node_rank": str(self.node_rank)}  # fmt: skip


@dataclass(frozen=True)
class Endpoint:
    """Local rank 0's HTTP endpoint: the registry it serves (every rank's files, and the GPU collector)."""

    registry: CollectorRegistry
    port: int
    addr: str
    gpu: GpuCollector | None = None
    announce: Path | None = None
    """`orch run`: serve a free port when `port` is taken, and write the address served here (runtime_env)."""


@dataclass(frozen=True)
class Series:
    """One metric a rank writes: its name and help text as Prometheus shows them (docs/metrics.md, the
    dashboard and the alert rules read them), and its kind. Each carries the rank's labels (job, rank,
    local_rank, node_rank); `by`: the labels it has besides, whose values come when it is written."""

    name: str
    help: str
    kind: Literal["gauge", "counter", "histogram"] = "gauge"
    by: tuple[str, ...] = ()


# Every rank's training series, by the name the exporter writes them under. Straggler signals: the ranks of a
# DDP/FSDP job wait for each other in the gradient reduction, so their step times are equal; what differs is
# how long each took to get there (data, forward, backward launch): orch_train_step_ready_seconds.
TRAINING_SERIES = (
    Series("orch_train_step", "Last optimizer step number"),
    Series("orch_train_optimizer_steps", "Optimizer steps taken (skipped AMP steps included)", "counter"),
    Series("orch_train_samples", "Samples this rank processed", "counter"),
    Series("orch_train_tokens", "Tokens this rank processed", "counter"),
    Series("orch_train_loss", "Training loss at the last log step"),
    Series("orch_train_learning_rate", "Learning rate of the last step"),
    Series("orch_train_grad_norm", "Gradient norm at the last log step"),
    Series("orch_train_step_duration_seconds", "Wall time of one optimizer step", "histogram"),
    Series("orch_train_last_step_seconds", "Wall time of the last optimizer step"),
    Series(
        "orch_train_step_ready_seconds",
        "Host time of the last step until this rank reached its gradient reduction (straggler signal)",
    ),
    Series("orch_train_data_wait_seconds", "Time spent waiting for the data loader", "counter"),
    Series("orch_train_last_step_timestamp_seconds", "Unix time of the last step"),
    Series("orch_train_amp_loss_scale", "AMP (fp16) gradient scaler scale"),
    Series(
        "orch_task_metric", "A number the task reports itself (Task.on_log / on_eval), by name", by=("name",)
    ),
    Series("orch_train_amp_skipped_steps", "Optimizer steps skipped by AMP (inf/nan grads)", "counter"),
    Series("orch_train_flops", "Model floating-point operations this rank computed", "counter"),
    Series("orch_train_mfu_ratio", "Model FLOPs utilisation of the last step (0-1)"),
    Series("orch_train_elastic_restarts", "Elastic restarts of the worker group so far"),
    Series(
        "orch_train_state_bytes",
        "Bytes of training state this rank holds, by kind (parameter, gradient, optimizer; FSDP: shards)",
        by=("kind",),
    ),
)
# On a CUDA device: torch's caching allocator, read every gpu_sample_seconds.
CUDA_SERIES = (
    Series("orch_torch_cuda_memory_allocated_bytes", "Tensor memory allocated by torch"),
    Series("orch_torch_cuda_memory_reserved_bytes", "Memory held by torch's allocator"),
    Series("orch_torch_cuda_memory_peak_allocated_bytes", "Peak tensor memory since start"),
    Series("orch_torch_cuda_alloc_retries", "cudaMalloc retries after flushing the cache", "counter"),
    Series("orch_torch_cuda_ooms", "Out-of-memory errors torch's allocator raised", "counter"),
)
# Facts of the rank, set once at start.
COLLECTIVE_TIMEOUT = Series(
    "orch_train_collective_timeout_seconds",
    "train.collective_timeout: a collective that waits this long fails the job",
)
PEAK_FLOPS = Series("orch_train_peak_flops", "Peak FLOP/s of this rank's device, used for MFU")
PEAK_FLOPS_UNKNOWN = Series(
    "orch_train_peak_flops_unknown",
    "1: no peak FLOP/s for this rank's device, so no MFU (set metrics.peak_tflops)",
    by=("device_name",),
)
RANK_INFO = Series("orch_rank_info", "Where a rank runs (value 1)", by=("hostname", "device", "gpu_uuid"))
# The job's, written by rank 0 from its goodput journal (every attempt so far: a restarted job's counters go on
# from its total, not from 0).
GOODPUT_SERIES = (
    Series(
        "orch_goodput_ratio", "Share of the job's wall time in steps that count toward its final model (0-1)"
    ),
    Series(
        "orch_badput_seconds",
        "Seconds of the job's wall time lost, by cause (goodput.CAUSES)",
        "counter",
        by=("cause",),
    ),  # fmt: skip
)


class PrometheusMetrics(NullMetrics):
    """Training series of one rank; with an `Endpoint` (local rank 0), also the node's HTTP endpoint."""

    def __init__(self, config: MetricsConfig, *, endpoint: Endpoint | None = None) -> None:
        self._config = config
        self._cuda = config.device.startswith("cuda")
        self._next_memory_read = 0.0
        self._retries_seen = self._ooms_seen = 0
        self._server: WSGIServer | None = None
        self._gpu = endpoint.gpu if endpoint is not None else None
        self._labels = config.labels
        # Every series this rank writes, bound to its labels once (a step only stores numbers); one with
        # labels of its own (`by`) is bound when written.
        self._series = {
            series.name: self._declare(series)
            for series in (
                *TRAINING_SERIES,
                *(CUDA_SERIES if self._cuda else ()),
                *(GOODPUT_SERIES if config.rank == 0 else ()),  # the job's: one writer
            )
        }
        self._badput_seen: dict[str, float] = {}
        if config.collective_timeout_seconds:
            self._declare(COLLECTIVE_TIMEOUT).set(config.collective_timeout_seconds)
        if config.peak_flops:
            self._declare(PEAK_FLOPS).set(config.peak_flops)
        else:  # say so, rather than leave the MFU panel empty without a word
            self._declare(PEAK_FLOPS_UNKNOWN).labels(
                **self._labels, device_name=config.device_name or config.device
            ).set(1)
            if config.rank == 0 and self._cuda:  # a CPU has no peak by design: nothing to warn about
                log.warning(
                    "MFU off: no peak FLOP/s known for %s; set metrics.peak_tflops in job.yaml",
                    config.device_name or config.device,
                )
        self._declare(RANK_INFO).labels(
            **self._labels,
            hostname=socket.gethostname(),
            device=config.device,
            gpu_uuid=config.gpu_uuid or "",
        ).set(1)
        # Restarts of this worker group by torchelastic (a whole-job restart by JobSet or the operator
        # starts the count again: the dashboard counts those from the pods' restarts, see docs/metrics.md).
        self.set_restart_count(int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0))
        if endpoint is not None:
            self._serve(endpoint)

    def _declare(self, series: Series) -> Any:
        """The metric of `series` in this process's multiprocess files; bound to the rank's labels unless it
        has labels of its own. Gauges: `livemostrecent` (each series has one writer; a dead rank's drop out)."""
        from prometheus_client import Counter, Gauge, Histogram

        labels = (*self._labels, *series.by)
        metric: Counter | Histogram | Gauge
        if series.kind == "counter":
            metric = Counter(series.name, series.help, labels, registry=None)
        elif series.kind == "histogram":
            metric = Histogram(series.name, series.help, labels, registry=None, buckets=STEP_SECONDS_BUCKETS)
        else:
            metric = Gauge(
                series.name, series.help, labels, registry=None, multiprocess_mode="livemostrecent"
            )
        return metric if series.by else metric.labels(**self._labels)

    def _serve(self, endpoint: Endpoint) -> None:
        from prometheus_client import start_http_server

        if self._gpu is not None:
            self._gpu.start()
        # The port is bound here, by the process that serves it, before anyone is told (no probe-and-release
        # race); a local run moves off a taken port, a pod cannot (its PodMonitor scrapes the named port).
        ports = (endpoint.port, 0) if endpoint.announce is not None else (endpoint.port,)
        for port in ports:
            try:
                self._server, _ = start_http_server(port, addr=endpoint.addr, registry=endpoint.registry)
                break
            except OSError as error:
                failure = error
        else:
            log.warning(
                "metrics endpoint off: cannot listen on %s:%d (%s); training goes on",
                endpoint.addr,
                endpoint.port,
                failure,
            )
            return
        self.serving_port = self._server.server_port
        log.info("serving metrics on http://%s:%d/metrics", endpoint.addr, self.serving_port)
        if endpoint.announce is not None:
            announce(endpoint, self.serving_port)

    def on_step(self, stats: StepStats) -> None:
        # Host-side numbers only: each line below stores a float into a memory-mapped file.
        series = self._series
        try:
            series["orch_train_step"].set(stats.step)
            series["orch_train_optimizer_steps"].inc()
            series["orch_train_samples"].inc(stats.work.samples)
            if stats.work.tokens:
                series["orch_train_tokens"].inc(stats.work.tokens)
            if stats.loss is not None:
                series["orch_train_loss"].set(stats.loss)
            series["orch_train_learning_rate"].set(stats.lr)
            series["orch_train_grad_norm"].set(stats.grad_norm)
            series["orch_train_step_duration_seconds"].observe(stats.seconds)
            series["orch_train_last_step_seconds"].set(stats.seconds)
            series["orch_train_step_ready_seconds"].set(stats.ready_seconds)
            series["orch_train_data_wait_seconds"].inc(max(stats.data_wait_seconds, 0.0))
            series["orch_train_last_step_timestamp_seconds"].set(time.time())
            if stats.loss_scale is not None:
                series["orch_train_amp_loss_scale"].set(stats.loss_scale)
            if stats.skipped:
                series["orch_train_amp_skipped_steps"].inc()
            if stats.work.flops:
                series["orch_train_flops"].inc(stats.work.flops)
                if self._config.peak_flops:
                    series["orch_train_mfu_ratio"].set(
                        mfu(stats.work.flops, stats.seconds, self._config.peak_flops)
                    )
            if self._cuda and time.monotonic() >= self._next_memory_read:
                self._read_cuda_memory()
        except Exception as error:  # never let a metric take the step down
            log.warning("metrics update failed: %s", error)

    def _read_cuda_memory(self) -> None:
        # The caching allocator's counters live in host memory: reading them does not synchronise with the GPU.
        # memory_stats() builds a large dict, so read it every gpu_sample_seconds, not every step.
        import torch

        self._next_memory_read = time.monotonic() + self._config.gpu_sample_seconds
        stats, series = torch.cuda.memory_stats(self._config.device), self._series
        series["orch_torch_cuda_memory_allocated_bytes"].set(stats.get("allocated_bytes.all.current", 0))
        series["orch_torch_cuda_memory_reserved_bytes"].set(stats.get("reserved_bytes.all.current", 0))
        series["orch_torch_cuda_memory_peak_allocated_bytes"].set(stats.get("allocated_bytes.all.peak", 0))
        retries, ooms = stats.get("num_alloc_retries", 0), stats.get("num_ooms", 0)
        series["orch_torch_cuda_alloc_retries"].inc(max(retries - self._retries_seen, 0))
        series["orch_torch_cuda_ooms"].inc(max(ooms - self._ooms_seen, 0))
        self._retries_seen, self._ooms_seen = retries, ooms

    def set_restart_count(self, count: int) -> None:
        self._series["orch_train_elastic_restarts"].set(count)

    def set_memory(self, **bytes_by_kind: int | None) -> None:
        for key, value in bytes_by_kind.items():
            if key.endswith("_bytes") and value is not None and not key.startswith("peak"):
                state_bytes = self._series["orch_train_state_bytes"]
                state_bytes.labels(**self._labels, kind=key.removesuffix("_bytes")).set(value)

    def on_task_metrics(self, values: dict[str, float]) -> None:
        for name, value in values.items():
            self._series["orch_task_metric"].labels(**self._labels, name=name).set(value)

    def on_goodput(self, result: Goodput) -> None:
        if "orch_goodput_ratio" not in self._series:
            return
        try:
            self._series["orch_goodput_ratio"].set(result.ratio)
            badput = self._series["orch_badput_seconds"]
            for cause, seconds in result.badput_seconds.items():
                seen = self._badput_seen.get(cause, 0.0)
                badput.labels(**self._labels, cause=cause).inc(max(0.0, seconds - seen))
                self._badput_seen[cause] = max(seen, seconds)
        except Exception as error:  # never let a metric take training down
            log.warning("goodput metrics update failed: %s", error)

    def close(self) -> None:
        if self._gpu is not None:
            self._gpu.stop()
            self._gpu = None
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        # This process is done: its files go (counters included), the directory when it is the last one out.
        from prometheus_client import values

        if getattr(values.ValueClass, "_multiprocess", False):
            values.ValueClass.close_all_files()
        prune_dead_files(self._config.directory, also_pid=os.getpid())
        with contextlib.suppress(OSError):
            self._config.directory.rmdir()


def _device_uuid(device: str) -> str:
    from orchestrator.trainer import gpu

    try:
        import torch

        return gpu.nvml_uuid(getattr(torch.cuda.get_device_properties(torch.device(device)), "uuid", ""))
    except Exception:
        return ""


def build_metrics(
    runtime: RuntimeEnv,
    *,
    rank: int,
    local_rank: int,
    node_rank: int,
    device: str,
    gpu_reader: gpu.GpuReader | None = None,
    gpu_devices: list[gpu.GpuDevice] | None = None,
    sample_gpus: bool | None = None,
    gpu_uuid: str | None = None,
    multiproc_dir: str | os.PathLike[str] | None = None,
    collective_timeout_seconds: float | None = None,
) -> Meter:
    """The trainer's metrics: a PrometheusMetrics when `runtime` names a port, else a NullMetrics. This is
    where the parts are made and wired: the config, the multiprocess store, the registry local rank 0 serves
    and its GPU collector.

    `gpu_reader` (a gpu.GpuReader) and `gpu_devices` (gpu.GpuDevice list) replace NVML and CUDA in tests;
    `sample_gpus` forces the GPU sampler on or off (default: on when `device` is CUDA); `gpu_uuid` overrides the
    UUID of this rank's GPU in `orch_rank_info` (default: read from torch for a CUDA device).
    """
    if not runtime.metrics_port:
        return NullMetrics()
    port, job = runtime.metrics_port, runtime.job_name
    try:
        directory = Path(
            multiproc_dir or os.environ.get("PROMETHEUS_MULTIPROC_DIR") or default_multiproc_dir(job, port)
        )
        directory.mkdir(parents=True, exist_ok=True)
        prune_dead_files(directory, also_pid=os.getpid())
        # prometheus-client chooses where values live once, at import, from $PROMETHEUS_MULTIPROC_DIR; the
        # directory is known only now, so it is set here, once per process, before any metric exists.
        _use_multiprocess_values(directory)
        device_name = None
        if device.startswith("cuda"):
            import torch

            device_name = torch.cuda.get_device_name(torch.device(device))
            if gpu_uuid is None:
                gpu_uuid = _device_uuid(device)
        config = MetricsConfig(
            job=job, rank=rank, local_rank=local_rank, node_rank=node_rank, device=device,
            directory=directory, peak_flops=peak_flops(peak_tflops=runtime.peak_tflops, device_name=device_name),
            gpu_sample_seconds=runtime.gpu_sample_seconds, device_name=device_name, gpu_uuid=gpu_uuid,
            collective_timeout_seconds=collective_timeout_seconds,
        )  # fmt: skip
        endpoint = None
        if local_rank == 0:
            sample = device.startswith("cuda") if sample_gpus is None else sample_gpus
            endpoint = node_endpoint(
                config, port=port, addr=runtime.metrics_addr,
                gpu=gpu_collector(config, runtime.gpu_sample_seconds, gpu_reader, gpu_devices) if sample else None,
                announce=Path(runtime.metrics_endpoint_file) if runtime.metrics_endpoint_file else None,
            )  # fmt: skip
        return PrometheusMetrics(config, endpoint=endpoint)
    except Exception as error:  # metrics are optional: train without them rather than not at all
        log.warning("metrics off: %s", error)
        return NullMetrics()


def announce(endpoint: Endpoint, port: int) -> None:
    """`orch run`: where local rank 0 serves, once it listens there: written whole (rename) to the endpoint
    file, which `orch top --local` reads, and said on stdout, which the console shows."""
    host = "127.0.0.1" if endpoint.addr in ("0.0.0.0", "") else endpoint.addr
    url = f"http://{host}:{port}/metrics"
    assert endpoint.announce is not None
    try:
        outputs.write_json(endpoint.announce, {"url": url, "pid": os.getpid()})
    except OSError as error:
        log.warning(
            "cannot write %s (%s): orch top --local will not find the endpoint", endpoint.announce, error
        )
    taken = f" (port {endpoint.port} is in use)" if port != endpoint.port else ""
    print(f"metrics: {url}{taken}", flush=True)


def node_endpoint(
    config: MetricsConfig, *, port: int, addr: str, gpu: GpuCollector | None, announce: Path | None = None
) -> Endpoint:
    """What local rank 0 serves: every rank's files of this node, merged on each scrape, and the GPUs."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    registry.register(_LiveFilesCollector(config.directory))
    if gpu is not None:
        registry.register(gpu)
    return Endpoint(registry=registry, port=port, addr=addr, gpu=gpu, announce=announce)


def gpu_collector(
    config: MetricsConfig,
    interval_seconds: float,
    reader: gpu.GpuReader | None = None,
    devices: list[gpu.GpuDevice] | None = None,
) -> GpuCollector | None:
    """The node's GPU sampler (NVML unless a reader is given), or None where there is nothing to read."""
    from orchestrator.trainer import gpu

    reader = reader if reader is not None else gpu.open_nvml_reader()
    found = list(devices or [])
    if reader is not None and not found:
        try:
            found = gpu.cuda_devices()
        except Exception as error:
            log.warning("GPU metrics off: cannot list CUDA devices (%s)", error)
    if reader is None or not found:
        return None
    labels = {"job": config.job, "node_rank": str(config.node_rank), "hostname": socket.gethostname()}
    return gpu.GpuCollector(reader, found, interval_seconds=interval_seconds, labels=labels)
