"""A fake GPU for tests: there is no GPU (and no NVML driver library) on the machines the test suite runs on.

It stands in for NVML behind gpu.GpuReader. Everything else (sampler thread, exposition, HTTP, Prometheus) is real.
"""

from __future__ import annotations

import threading

from orchestrator.trainer.gpu import GpuDevice, GpuHealth, GpuReading

FAKE_DEVICES = [
    GpuDevice(index=0, uuid="GPU-00000000-fake-0000-0000-000000000000", name="NVIDIA H100 80GB HBM3"),
    GpuDevice(index=1, uuid="GPU-11111111-fake-1111-1111-111111111111", name="NVIDIA H100 80GB HBM3"),
]


class FakeGpuReader:
    """Readings in NVML's units converted like NvmlReader does; device 1 lacks ECC and PCIe (unsupported).
    `health` and `xids` (by device index) are what NvmlReader.health and watch_xid would answer for the
    pre-flight check; a device without an entry is healthy (software clock events only), without Xid events."""

    def __init__(
        self, health: dict[int, GpuHealth] | None = None, xids: dict[int, list[int] | None] | None = None
    ) -> None:
        self._health, self._xids = health or {}, xids or {}
        self.reads = 0
        self.threads: set[str] = set()
        self.closed = False

    def read(self, device: GpuDevice) -> GpuReading:
        self.reads += 1
        self.threads.add(threading.current_thread().name)
        reading = GpuReading(
            utilization=0.87,
            memory_utilization=0.4,
            memory_used_bytes=60e9 + device.index,
            memory_total_bytes=80e9,
            power_watts=512.5,
            power_limit_watts=700.0,
            energy_joules=1.5e6 + self.reads,
            temperature_celsius=66.0,
            sm_clock_hertz=1.98e9,
            sm_clock_max_hertz=1.98e9,
            clock_event_reasons=0x4 | 0x20,  # software power cap + software thermal slowdown
        )
        if device.index == 0:
            reading.pcie_tx_bytes_per_second = 2.5e9
            reading.pcie_rx_bytes_per_second = 1.5e9
            reading.ecc_errors = {"corrected": 3.0, "uncorrected": 0.0}
        return reading

    def health(self, device: GpuDevice) -> GpuHealth:
        default = GpuHealth(uncorrected_ecc=0, remapped_rows_pending=False, remapping_failed=False,
                            clock_event_reasons=0x4 | 0x20, sm_clock_hertz=1.98e9, sm_clock_max_hertz=1.98e9)  # fmt: skip
        return self._health.get(device.index, default)

    def watch_xid(self, device: GpuDevice) -> FakeXidWatch | None:
        xids = self._xids.get(device.index, [])
        return None if xids is None else FakeXidWatch(xids)

    def driver_version(self) -> str:
        return "550.54.15"

    def close(self) -> None:
        self.closed = True


class FakeXidWatch:
    """The Xid errors a GPU reported while it was watched (NVML's event set)."""

    def __init__(self, xids: list[int]) -> None:
        self.xids, self.closed = list(xids), False

    def seen(self) -> list[int]:
        return list(self.xids)

    def close(self) -> None:
        self.closed = True
