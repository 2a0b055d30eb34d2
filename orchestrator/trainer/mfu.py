"""Model FLOPs utilisation: the FLOP/s a step's model needed over what its device could do, and the table of
the GPUs' peaks it is measured against (docs/metrics.md, "MFU"). Stdlib only: the benchmarks and the GPU
check read it too."""

from __future__ import annotations

import re

# Dense (no sparsity) BF16 tensor-core peak TFLOP/s per GPU, from NVIDIA's datasheets; matched in order against
# the full torch.cuda.get_device_name() ("NVIDIA H200 NVL"), a key matching whole words only, so more specific
# names come first. V100 and T4 have no bf16: their FP16 peak.
# Not listed or a different precision: set `metrics.peak_tflops` in job.yaml (or ORCH_PEAK_TFLOPS for `orch run`).
PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("GB200", 2500.0),  # per GPU (NVL72: 180 PFLOP/s dense for 72)
    ("B200", 2250.0),  # HGX B200
    ("GH200", 989.0),
    ("H200 NVL", 835.0),  # the PCIe card: lower clocks and power than the SXM part
    ("H200", 989.0),  # SXM ("NVIDIA H200")
    ("H100 NVL", 835.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),  # SXM ("NVIDIA H100 80GB HBM3")
    ("H800", 989.0),
    ("H20", 148.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("A30", 165.0),
    ("A10G", 70.0),
    ("A10", 125.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
    ("V100S", 130.0),
    ("V100-PCIE", 112.0),
    ("V100", 125.0),
    ("T4", 65.0),
)


def peak_tflops_for(device_name: str) -> float | None:
    """Peak dense BF16 TFLOP/s of a GPU model from its CUDA name, or None when the table does not know it."""
    for key, tflops in PEAK_TFLOPS:
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(key)}(?![0-9])", device_name, re.IGNORECASE):
            return tflops
    return None


def peak_flops(*, peak_tflops: float | None, device_name: str | None) -> float | None:
    """Peak FLOP/s used for MFU: the job's (metrics.peak_tflops, or ORCH_PEAK_TFLOPS from the shell of
    `orch run`), else the GPU table; None: no MFU."""
    if peak_tflops:
        return peak_tflops * 1e12
    tflops = peak_tflops_for(device_name) if device_name else None
    return tflops * 1e12 if tflops else None


def mfu(flops: float, step_seconds: float, peak_flops: float) -> float:
    """Model FLOPs utilisation, 0-1: the FLOP/s the model needed divided by what the device could do."""
    return flops / step_seconds / peak_flops if step_seconds > 0 and peak_flops > 0 else 0.0
