"""Per-GPU metrics from NVML (`nvidia-ml-py`), sampled in a background thread, served as Prometheus series.

Only the process that serves the pod's scrape endpoint (local rank 0) samples, once for every local GPU, every
`gpu_sample_seconds`. A scrape only reads the latest sample (`GpuCollector.collect`), so neither the training step
nor a scrape ever waits on NVML: one NVML call can take milliseconds (PCIe throughput reads a 20 ms window).

CUDA device indices do not match NVML indices (CUDA_VISIBLE_DEVICES, container device plugins), so GPUs are
looked up by UUID: the same `GPU-...` string dcgm-exporter puts in its `UUID` label, which lets dashboards join.

Reading is behind a small interface (`GpuReader`) so tests can pass a fake one: there is no GPU on the machines
the test suite runs on. No NVML library, no driver, no GPU: `open_nvml_reader` returns None and there are simply
no GPU series; nothing fails.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

log = logging.getLogger(__name__)

# NVML clock event ("throttle") reason bits (nvmlClocksEventReason*), named like dcgm-exporter's violations.
CLOCK_EVENT_REASONS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
}


@dataclass(frozen=True)
class GpuDevice:
    """One GPU as the job sees it: `index` is the CUDA index inside this process/pod, `uuid` is NVML's `GPU-...`."""

    index: int
    uuid: str
    name: str = ""


@dataclass
class GpuReading:
    """One sample of one GPU, in base units. None: the GPU or driver does not support that reading."""

    utilization: float | None = None  # 0-1, share of the sample period in which any kernel ran
    memory_utilization: float | None = None  # 0-1, share of time the memory controller was busy
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules: float | None = None  # since the driver loaded
    temperature_celsius: float | None = None
    sm_clock_hertz: float | None = None
    sm_clock_max_hertz: float | None = None
    clock_event_reasons: int | None = None  # bitmask of CLOCK_EVENT_REASONS
    pcie_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None
    ecc_errors: dict[str, float] = field(default_factory=dict)  # {"corrected": n, "uncorrected": n}, volatile


# The clock event reasons that mean the hardware holds the clocks down (a failing power supply or cooling, a
# power brake from the board or system): on a GPU that is not even busy, a node to keep off (train.preflight).
HARDWARE_SLOWDOWN = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")


@dataclass
class GpuHealth:
    """What NVML says about a GPU's health (train.preflight). None: not supported or not reported."""

    uncorrected_ecc: int | None = None  # volatile: since the driver loaded
    retired_pages_pending: bool | None = (
        None  # pages waiting to be retired, which takes a GPU reset (pre-Ampere)
    )
    remapped_rows_pending: bool | None = None  # a row remapping waiting for a GPU reset (Ampere and later)
    remapping_failed: bool | None = None  # a row could not be remapped: the GPU needs replacing
    clock_event_reasons: int | None = None  # bitmask of CLOCK_EVENT_REASONS, read after the timed work
    sm_clock_hertz: float | None = None
    sm_clock_max_hertz: float | None = None

    def problems(self) -> list[str]:
        """Why this GPU is bad, one phrase each; [] when nothing NVML reported is wrong."""
        found = []
        if self.uncorrected_ecc:
            found.append(f"{self.uncorrected_ecc} uncorrected ECC error(s) since the driver loaded")
        if self.retired_pages_pending:
            found.append("memory pages wait to be retired (the GPU needs a reset)")
        if self.remapped_rows_pending:
            found.append("a memory row remapping waits for a GPU reset")
        if self.remapping_failed:
            found.append("a memory row could not be remapped (the GPU needs replacing)")
        held = [r for r in HARDWARE_SLOWDOWN if (self.clock_event_reasons or 0) & CLOCK_EVENT_REASONS[r]]
        if held:
            clocks = (
                f" (SM {self.sm_clock_hertz / 1e6:.0f} of {self.sm_clock_max_hertz / 1e6:.0f} MHz)"
                if self.sm_clock_hertz and self.sm_clock_max_hertz
                else ""
            )
            found.append(f"clocks held down by {', '.join(held)}{clocks}")
        return found


class GpuReader(Protocol):
    """Where GPU readings come from: NVML in real life, a fake in tests."""

    def read(self, device: GpuDevice) -> GpuReading: ...

    def driver_version(self) -> str: ...

    def close(self) -> None: ...


# --- NVML ------------------------------------------------------------------------------------------------------


class NvmlReader:
    """Reads one GPU through NVML. Each reading is tried on its own: an unsupported one is left out, not fatal.

    What an old `pynvml` (shadowing nvidia-ml-py) lacks raises AttributeError: that reading is left out for
    good, like one the GPU does not support. A MIG instance supports few readings (no utilization or power
    per instance): the same.
    """

    def __init__(self, pynvml: ModuleType) -> None:  # the module, imported by open_nvml_reader
        self._nvml = pynvml
        self._handles: dict[str, object] = {}
        # (uuid, reading): NotSupported (or missing from this pynvml) once is forever
        self._unsupported: set[tuple[str, str]] = set()

    def _handle(self, device: GpuDevice) -> object:
        if device.uuid not in self._handles:
            try:
                handle = self._nvml.nvmlDeviceGetHandleByUUID(device.uuid)
            except self._nvml.NVMLError:
                # torch prints a MIG instance's UUID without its prefix; nvml_uuid() guessed GPU-.
                if not device.uuid.startswith("GPU-"):
                    raise
                handle = self._nvml.nvmlDeviceGetHandleByUUID("MIG-" + device.uuid.removeprefix("GPU-"))
            self._handles[device.uuid] = handle
        return self._handles[device.uuid]

    def _try(self, device: GpuDevice, what: str, call: Callable[[], Any]) -> Any:  # NVML structs or numbers
        if (device.uuid, what) in self._unsupported:
            return None
        try:
            return call()
        except AttributeError as error:  # an old pynvml without this function (or constant)
            log.debug("NVML %s: not in this pynvml (%s); left out", what, error)
            self._unsupported.add((device.uuid, what))
            return None
        except Exception as error:
            if isinstance(error, self._nvml.NVMLError_NotSupported):
                self._unsupported.add((device.uuid, what))
            else:
                log.debug("NVML %s on %s failed: %s", what, device.uuid, error)
            return None

    def read(self, device: GpuDevice) -> GpuReading:
        nvml, h = self._nvml, self._handle(device)
        reading = GpuReading()
        rates = self._try(device, "utilization", lambda: nvml.nvmlDeviceGetUtilizationRates(h))
        if rates is not None:
            reading.utilization, reading.memory_utilization = rates.gpu / 100.0, rates.memory / 100.0
        memory = self._try(device, "memory", lambda: nvml.nvmlDeviceGetMemoryInfo(h))
        if memory is not None:
            reading.memory_used_bytes, reading.memory_total_bytes = float(memory.used), float(memory.total)
        reading.power_watts = _scaled(
            self._try(device, "power", lambda: nvml.nvmlDeviceGetPowerUsage(h)), 1e-3
        )
        reading.power_limit_watts = _scaled(
            self._try(device, "power_limit", lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(h)), 1e-3
        )
        reading.energy_joules = _scaled(
            self._try(device, "energy", lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(h)), 1e-3
        )
        reading.temperature_celsius = _scaled(
            self._try(
                device, "temperature", lambda: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)
            ),
            1,
        )
        reading.sm_clock_hertz = _scaled(
            self._try(device, "sm_clock", lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)), 1e6
        )
        reading.sm_clock_max_hertz = _scaled(
            self._try(device, "sm_clock_max", lambda: nvml.nvmlDeviceGetMaxClockInfo(h, nvml.NVML_CLOCK_SM)),
            1e6,
        )
        reading.clock_event_reasons = self._try(
            device, "clock_events", lambda: nvml.nvmlDeviceGetCurrentClocksEventReasons(h)
        )
        # NVML reports PCIe throughput in KB/s over a 20 ms window.
        reading.pcie_tx_bytes_per_second = _scaled(
            self._try(
                device, "pcie_tx", lambda: nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_TX_BYTES)
            ),
            1024,
        )
        reading.pcie_rx_bytes_per_second = _scaled(
            self._try(
                device, "pcie_rx", lambda: nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_RX_BYTES)
            ),
            1024,
        )
        for kind, error_type in (
            ("corrected", "NVML_MEMORY_ERROR_TYPE_CORRECTED"),
            ("uncorrected", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED"),
        ):
            # Names are looked up inside the call: one this pynvml lacks leaves this reading out only.
            count = self._try(device, f"ecc_{kind}", functools.partial(self._ecc_errors, h, error_type))
            if count is not None:
                reading.ecc_errors[kind] = float(count)
        return reading

    def health(self, device: GpuDevice) -> GpuHealth:
        """ECC, page retirement, row remapping and clock events of one GPU; what it does not support is None."""
        nvml, h = self._nvml, self._handle(device)
        health = GpuHealth()
        uncorrected = self._try(
            device, "ecc_uncorrected",
            functools.partial(self._ecc_errors, h, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED"),
        )  # fmt: skip
        health.uncorrected_ecc = None if uncorrected is None else int(uncorrected)
        pending = self._try(device, "retired_pending", lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(h))
        health.retired_pages_pending = None if pending is None else pending == nvml.NVML_FEATURE_ENABLED
        # (corrected rows, uncorrected rows, remapping pending, remapping failed)
        rows = self._try(device, "remapped_rows", lambda: nvml.nvmlDeviceGetRemappedRows(h))
        if rows is not None:
            health.remapped_rows_pending, health.remapping_failed = bool(rows[2]), bool(rows[3])
        health.clock_event_reasons = self._try(
            device, "clock_events", lambda: nvml.nvmlDeviceGetCurrentClocksEventReasons(h)
        )
        health.sm_clock_hertz = _scaled(
            self._try(device, "sm_clock", lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)), 1e6
        )
        health.sm_clock_max_hertz = _scaled(
            self._try(device, "sm_clock_max", lambda: nvml.nvmlDeviceGetMaxClockInfo(h, nvml.NVML_CLOCK_SM)),
            1e6,
        )
        return health

    def watch_xid(self, device: GpuDevice) -> XidWatch | None:
        """Xid critical errors of `device` from now on (NVML reports only events after it is asked to); None
        where the GPU or driver cannot report them (MIG instances, some boards)."""
        nvml = self._nvml
        try:
            events = nvml.nvmlEventSetCreate()
            nvml.nvmlDeviceRegisterEvents(self._handle(device), nvml.nvmlEventTypeXidCriticalError, events)
        except (AttributeError, nvml.NVMLError) as error:
            log.debug("NVML Xid events of %s: not reported (%s)", device.uuid, error)
            return None
        return XidWatch(nvml, events)

    def _ecc_errors(self, handle: object, error_type: str) -> int:
        nvml = self._nvml
        return nvml.nvmlDeviceGetTotalEccErrors(handle, getattr(nvml, error_type), nvml.NVML_VOLATILE_ECC)

    def driver_version(self) -> str:
        try:
            version = self._nvml.nvmlSystemGetDriverVersion()
        except self._nvml.NVMLError:
            return ""
        return version.decode() if isinstance(version, bytes) else str(version)

    def close(self) -> None:
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()


class XidWatch:
    """The Xid errors NVML reported since `NvmlReader.watch_xid` (NVIDIA's Xid catalog says what each means)."""

    def __init__(self, nvml: ModuleType, events: object) -> None:
        self._nvml, self._events = nvml, events

    def seen(self) -> list[int]:
        """The Xids reported since the last call, oldest first, without waiting."""
        found: list[int] = []
        while True:
            try:
                event = self._nvml.nvmlEventSetWait_v2(self._events, 0)
            except self._nvml.NVMLError:  # NVML_ERROR_TIMEOUT: nothing (more) to read
                return found
            found.append(int(event.eventData))

    def close(self) -> None:
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlEventSetFree(self._events)


def _scaled(value: float | int | None, factor: float) -> float | None:
    return None if value is None else float(value) * factor


def open_nvml_reader() -> NvmlReader | None:
    """An NVML reader, or None (logged, not raised) when nvidia-ml-py, the driver library or a GPU is missing."""
    try:
        import pynvml
    except ImportError:
        log.info("GPU metrics off: nvidia-ml-py is not installed")
        return None
    try:
        pynvml.nvmlInit()  # reference-counted; once per process
        if pynvml.nvmlDeviceGetCount() == 0:
            pynvml.nvmlShutdown()
            log.info("GPU metrics off: NVML sees no GPU")
            return None
    except pynvml.NVMLError as error:
        log.info("GPU metrics off: NVML unavailable (%s)", error)
        return None
    return NvmlReader(pynvml)


def cuda_devices() -> list[GpuDevice]:
    """The CUDA devices this process can see, with their NVML UUIDs (torch prints the UUID without `GPU-`)."""
    import torch

    devices = []
    for index in range(torch.cuda.device_count()):
        properties = torch.cuda.get_device_properties(index)
        uuid = nvml_uuid(getattr(properties, "uuid", ""))
        if not uuid:
            log.warning("GPU metrics: cuda:%d has no UUID in this torch build; left out", index)
            continue
        devices.append(GpuDevice(index=index, uuid=uuid, name=properties.name))
    return devices


def nvml_uuid(torch_uuid: object) -> str:
    """NVML's and dcgm-exporter's spelling of a device UUID (`GPU-…`, or `MIG-…` for a MIG instance) from
    torch's (`get_device_properties(i).uuid` prints the hex digits without the prefix); "" when unknown."""
    uuid = str(torch_uuid or "")
    return uuid if not uuid or uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


# --- sampling and exposition ------------------------------------------------------------------------------------


class GpuCollector:
    """A prometheus-client collector serving the latest sample of each GPU; a daemon thread takes the samples.

    `labels` (job, node_rank, hostname) go on every series, plus `gpu` (CUDA index) and `gpu_uuid`.
    """

    def __init__(
        self,
        reader: GpuReader,
        devices: Sequence[GpuDevice],
        *,
        labels: dict[str, str],
        interval_seconds: float,
    ) -> None:
        self._reader, self._devices, self._labels = reader, list(devices), dict(labels)
        self._interval = interval_seconds
        self._latest: list[tuple[GpuDevice, GpuReading]] = []
        self._failing: dict[str, str] = {}  # uuid -> the error last warned about
        self._driver = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample_once(self) -> None:
        """Read every GPU once; a GPU whose read fails keeps no sample (its series vanish) until it reads again.

        A failing GPU is warned about once (and again only when the error changes), not every period.
        """
        latest = []
        for device in self._devices:
            try:
                latest.append((device, self._reader.read(device)))
            except Exception as error:  # a sampler must never take the trainer down
                message = f"{type(error).__name__}: {error}"
                if self._failing.get(device.uuid) != message:
                    log.warning("GPU metrics: reading %s failed: %s", device.uuid, message)
                self._failing[device.uuid] = message
            else:
                if self._failing.pop(device.uuid, None) is not None:
                    log.info("GPU metrics: reading %s works again", device.uuid)
        self._latest = latest  # one reference swap: collect() sees a whole sample or the previous one

    def start(self) -> None:
        self._driver = self._reader.driver_version()
        self.sample_once()
        self._thread = threading.Thread(target=self._run, name="orch-gpu-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            started = time.monotonic()
            self.sample_once()
            log.debug("GPU sample took %.1f ms", (time.monotonic() - started) * 1e3)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._reader.close()

    def describe(self) -> Iterable[Metric]:
        return []  # the series depend on what each GPU supports; registering must not trigger a collect

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        base = list(self._labels)
        per_gpu = [*base, "gpu", "gpu_uuid"]
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}

        def family(
            kind: type[GaugeMetricFamily | CounterMetricFamily],
            name: str,
            doc: str,
            unit_labels: Sequence[str] = (),
        ) -> GaugeMetricFamily | CounterMetricFamily:
            if name not in families:
                families[name] = kind(name, doc, labels=[*per_gpu, *unit_labels])
            return families[name]

        def gauge(name: str, doc: str, value: float | None, values: list[str]) -> None:
            if value is not None:
                family(GaugeMetricFamily, name, doc).add_metric(values, value)

        for device, r in self._latest:
            values = [*self._labels.values(), str(device.index), device.uuid]
            info = family(
                GaugeMetricFamily,
                "orch_gpu_info",
                "GPU model and driver (value 1)",
                ["name", "driver_version"],
            )
            info.add_metric([*values, device.name, self._driver], 1)
            gauge(
                "orch_gpu_utilization_ratio",
                "Share of the last sample period a kernel ran (0-1)",
                r.utilization,
                values,
            )
            gauge(
                "orch_gpu_memory_utilization_ratio",
                "Share of time the memory controller was busy (0-1)",
                r.memory_utilization,
                values,
            )
            gauge(
                "orch_gpu_memory_used_bytes", "GPU memory in use, all processes", r.memory_used_bytes, values
            )
            gauge("orch_gpu_memory_total_bytes", "GPU memory size", r.memory_total_bytes, values)
            gauge("orch_gpu_power_watts", "Power draw", r.power_watts, values)
            gauge("orch_gpu_power_limit_watts", "Enforced power limit", r.power_limit_watts, values)
            gauge("orch_gpu_temperature_celsius", "GPU core temperature", r.temperature_celsius, values)
            gauge("orch_gpu_sm_clock_hertz", "SM clock", r.sm_clock_hertz, values)
            gauge("orch_gpu_sm_clock_max_hertz", "Maximum SM clock", r.sm_clock_max_hertz, values)
            gauge(
                "orch_gpu_pcie_tx_bytes_per_second",
                "PCIe transmit throughput",
                r.pcie_tx_bytes_per_second,
                values,
            )
            gauge(
                "orch_gpu_pcie_rx_bytes_per_second",
                "PCIe receive throughput",
                r.pcie_rx_bytes_per_second,
                values,
            )
            if r.energy_joules is not None:
                family(
                    CounterMetricFamily, "orch_gpu_energy_joules", "Energy used since the driver loaded"
                ).add_metric(values, r.energy_joules)
            if r.clock_event_reasons is not None:
                events = family(
                    GaugeMetricFamily,
                    "orch_gpu_clock_event_active",
                    "1 while this clock event reason (throttling) holds the clocks down",
                    ["reason"],
                )
                for reason, bit in CLOCK_EVENT_REASONS.items():
                    events.add_metric([*values, reason], 1.0 if r.clock_event_reasons & bit else 0.0)
            for kind, count in sorted(r.ecc_errors.items()):
                family(
                    CounterMetricFamily,
                    "orch_gpu_ecc_errors",
                    "Volatile ECC memory errors since the driver loaded",
                    ["type"],
                ).add_metric([*values, kind], count)
        yield from families.values()
