"""GPU series: the sampler thread, the exposition, NVML unit conversions. The GPU is faked: none exists here."""

from __future__ import annotations

import time
import types

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.trainer import gpu
from tests.metrics.fake_gpu import FAKE_DEVICES, FakeGpuReader

LABELS = {"job": "j", "node_rank": "0", "hostname": "node-a"}


def _samples(collector) -> dict[str, list]:
    registry = CollectorRegistry()
    registry.register(collector)
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def test_collector_serves_the_latest_sample_without_reading_the_gpu():
    reader = FakeGpuReader()
    collector = gpu.GpuCollector(reader, FAKE_DEVICES, labels=LABELS, interval_seconds=3600)
    collector.start()  # takes the first sample at once
    assert reader.reads == len(FAKE_DEVICES)
    series = _samples(collector)
    _samples(collector)
    assert reader.reads == len(FAKE_DEVICES)  # scrapes read the snapshot, never the GPU
    collector.stop()
    assert reader.closed

    sampled = FakeGpuReader()
    collector = gpu.GpuCollector(sampled, FAKE_DEVICES, labels=LABELS, interval_seconds=0.02)
    collector.start()
    try:
        deadline = time.monotonic() + 5
        while sampled.reads < 3 * len(FAKE_DEVICES) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "orch-gpu-sampler" in sampled.threads  # later samples come from the background thread
    finally:
        collector.stop()

    util = {labels["gpu_uuid"]: (labels, value) for labels, value in series["orch_gpu_utilization_ratio"]}
    assert set(util) == {d.uuid for d in FAKE_DEVICES}
    labels, value = util[FAKE_DEVICES[1].uuid]
    assert value == 0.87 and labels == {**LABELS, "gpu": "1", "gpu_uuid": FAKE_DEVICES[1].uuid}
    assert {v for _, v in series["orch_gpu_memory_total_bytes"]} == {80e9}
    assert {v for _, v in series["orch_gpu_power_watts"]} == {512.5}
    assert {v for _, v in series["orch_gpu_temperature_celsius"]} == {66.0}
    assert {v for _, v in series["orch_gpu_sm_clock_hertz"]} == {1.98e9}
    assert len(series["orch_gpu_energy_joules_total"]) == 2
    info = series["orch_gpu_info"][0][0]
    assert info["name"] == "NVIDIA H100 80GB HBM3" and info["driver_version"] == "550.54.15"
    events = {(lab["gpu"], lab["reason"]): v for lab, v in series["orch_gpu_clock_event_active"]}
    assert events[("0", "sw_power_cap")] == 1 and events[("0", "sw_thermal_slowdown")] == 1
    assert events[("0", "hw_slowdown")] == 0 and events[("1", "gpu_idle")] == 0
    # device 1 does not support PCIe or ECC readings: its series are absent, not zero
    assert [lab["gpu"] for lab, _ in series["orch_gpu_pcie_tx_bytes_per_second"]] == ["0"]
    assert sorted((lab["gpu"], lab["type"], v) for lab, v in series["orch_gpu_ecc_errors_total"]) == [
        ("0", "corrected", 3.0),
        ("0", "uncorrected", 0.0),
    ]


def test_a_failing_gpu_read_drops_that_gpu_only():
    class Flaky(FakeGpuReader):
        def read(self, device):
            if device.index == 1:
                raise RuntimeError("GPU fell off the bus")
            return super().read(device)

    collector = gpu.GpuCollector(Flaky(), FAKE_DEVICES, labels=LABELS, interval_seconds=60)
    collector.sample_once()
    series = _samples(collector)
    assert [lab["gpu"] for lab, _ in series["orch_gpu_utilization_ratio"]] == ["0"]


class FakeNvml(types.SimpleNamespace):
    """Stands in for the pynvml module (no NVML library here): NVML's own units, to check the conversions."""

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    NVML_TEMPERATURE_GPU, NVML_CLOCK_SM, NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES = 0, 1, 0, 1
    NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC = 0, 1, 0

    def __init__(self):
        super().__init__(calls=[], shutdown=False)

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.calls.append(("handle", uuid))
        return f"handle:{uuid}"

    def nvmlDeviceGetUtilizationRates(self, h):
        return types.SimpleNamespace(gpu=93, memory=41)

    def nvmlDeviceGetMemoryInfo(self, h):
        return types.SimpleNamespace(used=10 * 2**30, total=80 * 2**30, free=70 * 2**30)

    def nvmlDeviceGetPowerUsage(self, h):
        return 350_000  # mW

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 700_000

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        return 5_000_000  # mJ

    def nvmlDeviceGetTemperature(self, h, sensor):
        return 71

    def nvmlDeviceGetClockInfo(self, h, clock):
        return 1755  # MHz

    def nvmlDeviceGetMaxClockInfo(self, h, clock):
        return 1980

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return 0x1

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        self.calls.append(("pcie", counter))
        return 1000  # KB/s

    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter):
        self.calls.append(("ecc", error_type))
        raise self.NVMLError_NotSupported()

    def nvmlSystemGetDriverVersion(self):
        return b"550.54.15"

    def nvmlShutdown(self):
        self.shutdown = True


def test_nvml_reader_converts_to_base_units_and_remembers_unsupported():
    nvml = FakeNvml()
    reader = gpu.NvmlReader(nvml)
    device = gpu.GpuDevice(index=0, uuid="GPU-abc")
    r = reader.read(device)
    assert (r.utilization, r.memory_utilization) == (0.93, 0.41)
    assert (r.memory_used_bytes, r.memory_total_bytes) == (10 * 2**30, 80 * 2**30)
    assert (r.power_watts, r.power_limit_watts, r.energy_joules) == (350.0, 700.0, 5000.0)
    assert (r.temperature_celsius, r.sm_clock_hertz, r.sm_clock_max_hertz) == (71.0, 1.755e9, 1.98e9)
    assert r.clock_event_reasons == 0x1 and r.pcie_tx_bytes_per_second == 1024_000.0
    assert r.ecc_errors == {}  # not supported on this (fake) board
    reader.read(device)
    assert nvml.calls.count(("ecc", 0)) == 1  # NotSupported once: not asked again
    assert nvml.calls.count(("handle", "GPU-abc")) == 1  # handles are looked up once, by UUID
    assert reader.driver_version() == "550.54.15"
    reader.close()
    assert nvml.shutdown


def test_open_nvml_reader_without_a_driver_returns_none():
    reader = gpu.open_nvml_reader()
    if reader is not None:
        reader.close()
        pytest.skip("NVML works here (a GPU machine)")
    assert reader is None


@pytest.mark.gpu
def test_real_nvml_on_a_gpu_machine():
    """Runs only where a GPU and its driver exist (the device machine); skipped elsewhere."""
    reader = gpu.open_nvml_reader()
    if reader is None:
        pytest.skip("no NVML/GPU here")
    try:
        devices = gpu.cuda_devices()
        assert devices and all(d.uuid.startswith(("GPU-", "MIG-")) for d in devices)
        for device in devices:
            r = reader.read(device)
            assert 0.0 <= r.utilization <= 1.0
            assert 0 < r.memory_used_bytes <= r.memory_total_bytes
            assert r.power_watts > 0 and r.temperature_celsius > 0 and r.sm_clock_max_hertz > 1e8
        assert reader.driver_version()
    finally:
        reader.close()


class OldPynvml(FakeNvml):
    """An old `pynvml` shadowing nvidia-ml-py: no clock-event call and no ECC constants (AttributeError)."""

    def __getattribute__(self, name):
        if name in ("nvmlDeviceGetCurrentClocksEventReasons", "NVML_MEMORY_ERROR_TYPE_CORRECTED",
                    "NVML_MEMORY_ERROR_TYPE_UNCORRECTED"):  # fmt: skip
            raise AttributeError(f"module 'pynvml' has no attribute {name!r}")
        return super().__getattribute__(name)


def test_a_reading_missing_from_an_old_pynvml_is_left_out_not_the_sample():
    nvml = OldPynvml()
    reader = gpu.NvmlReader(nvml)
    device = gpu.GpuDevice(index=0, uuid="GPU-abc")
    for _ in range(2):
        r = reader.read(device)
        assert (r.power_watts, r.energy_joules, r.utilization) == (350.0, 5000.0, 0.93)  # the rest is read
        assert r.clock_event_reasons is None and r.ecc_errors == {}


class MigNvml(FakeNvml):
    """NVML knows the MIG instance as MIG-<uuid>; per-instance utilization and power are not supported."""

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.calls.append(("handle", uuid))
        if not uuid.startswith("MIG-"):
            raise self.NVMLError("Not Found")
        return f"handle:{uuid}"

    def nvmlDeviceGetUtilizationRates(self, h):
        raise self.NVMLError_NotSupported()

    def nvmlDeviceGetPowerUsage(self, h):
        raise self.NVMLError_NotSupported()


def test_a_mig_instance_is_found_and_read_without_warnings(caplog):
    nvml = MigNvml()
    device = gpu.GpuDevice(
        index=0, uuid="GPU-5e1a0c1e-0000-0000-0000-000000000000"
    )  # torch's UUID, guessed GPU-
    collector = gpu.GpuCollector(gpu.NvmlReader(nvml), [device], labels=LABELS, interval_seconds=60)
    with caplog.at_level("DEBUG"):
        for _ in range(3):
            collector.sample_once()
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    series = _samples(collector)
    assert series["orch_gpu_memory_used_bytes"][0][1] == 10 * 2**30
    assert "orch_gpu_utilization_ratio" not in series and "orch_gpu_power_watts" not in series
    assert nvml.calls.count(("handle", "MIG-5e1a0c1e-0000-0000-0000-000000000000")) == 1


def test_a_failing_gpu_is_warned_about_once_not_every_period(caplog):
    class Broken(FakeGpuReader):
        error = "GPU fell off the bus"

        def read(self, device):
            if device.index == 1 and self.error:
                raise RuntimeError(self.error)
            return super().read(device)

    reader = Broken()
    collector = gpu.GpuCollector(reader, FAKE_DEVICES, labels=LABELS, interval_seconds=60)
    with caplog.at_level("INFO"):
        for _ in range(3):
            collector.sample_once()
        reader.error = "another error"
        collector.sample_once()
        reader.error = ""
        collector.sample_once()
    messages = [r.getMessage() for r in caplog.records if "gpu" in r.name]
    uuid = FAKE_DEVICES[1].uuid
    assert messages == [
        f"GPU metrics: reading {uuid} failed: RuntimeError: GPU fell off the bus",
        f"GPU metrics: reading {uuid} failed: RuntimeError: another error",
        f"GPU metrics: reading {uuid} works again",
    ]
