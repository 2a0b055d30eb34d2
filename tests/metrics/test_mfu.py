"""Peak FLOP/s lookup and MFU."""

from __future__ import annotations

import pytest

from orchestrator.runtime_env import RuntimeEnv
from orchestrator.trainer.mfu import mfu, peak_flops, peak_tflops_for


@pytest.mark.parametrize(
    ("name", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA H200 NVL", 835.0),
        ("NVIDIA GH200 480GB", 989.0),
        ("NVIDIA B200", 2250.0),
        ("NVIDIA GB200", 2500.0),
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


def test_peak_precedence():
    assert peak_flops(peak_tflops=None, device_name="NVIDIA L4") == 121e12
    assert peak_flops(peak_tflops=200.0, device_name="NVIDIA L4") == 200e12  # the job's beats the table
    assert peak_flops(peak_tflops=None, device_name=None) is None  # CPU: no MFU
    assert peak_flops(peak_tflops=None, device_name="NVIDIA GeForce RTX 3090") is None  # unknown: no MFU
    # ORCH_PEAK_TFLOPS is how the job's value reaches the trainer; a malformed one is ignored, not fatal
    assert RuntimeEnv.from_environ({"ORCH_PEAK_TFLOPS": "50"}).peak_tflops == 50.0
    assert RuntimeEnv.from_environ({"ORCH_PEAK_TFLOPS": "fast"}).peak_tflops is None
    assert RuntimeEnv.from_environ({"ORCH_PEAK_TFLOPS": "-1"}).peak_tflops is None


def test_mfu():
    assert mfu(4e9, 0.02, 1e12) == pytest.approx(0.2)
    assert mfu(1.0, 0.0, 1e12) == 0.0
