"""Peak FLOP/s lookup and MFU."""

from __future__ import annotations

import pytest

from orchestrator.trainer.metrics import mfu, peak_tflops_for, resolve_peak_flops


@pytest.mark.parametrize(
    ("name", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA H20", 148.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA A100 80GB PCIe", 312.0),
        ("NVIDIA A10G", 70.0),
        ("NVIDIA A10", 125.0),
        ("NVIDIA L4", 121.0),
        ("NVIDIA L40S", 362.0),
        ("Tesla V100-SXM2-16GB", 125.0),
        ("Tesla V100-PCIE-32GB", 112.0),
        ("Tesla T4", 65.0),
        ("NVIDIA GeForce RTX 3090", None),
    ],
)
def test_peak_table(name, tflops):
    assert peak_tflops_for(name) == tflops


def test_peak_precedence(monkeypatch):
    monkeypatch.delenv("ORCH_PEAK_TFLOPS", raising=False)
    assert resolve_peak_flops(override_tflops=None, device_name="NVIDIA L4") == 121e12
    assert (
        resolve_peak_flops(override_tflops=200.0, device_name="NVIDIA L4") == 200e12
    )  # job.yaml beats the table
    assert resolve_peak_flops(override_tflops=None, device_name=None) is None  # CPU: no MFU
    monkeypatch.setenv("ORCH_PEAK_TFLOPS", "50")
    assert resolve_peak_flops(override_tflops=200.0, device_name="NVIDIA L4") == 50e12  # env beats both
    monkeypatch.setenv("ORCH_PEAK_TFLOPS", "fast")
    assert resolve_peak_flops(override_tflops=None, device_name="NVIDIA L4") == 121e12  # bad env: ignored


def test_mfu():
    assert mfu(4e9, 0.02, 1e12) == pytest.approx(0.2)
    assert mfu(1.0, 0.0, 1e12) == 0.0
