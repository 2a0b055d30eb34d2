"""Mixed precision as objects that are simply off when unused, so the loop has no `if amp:` branches.

bf16 and fp16 run the forward pass under autocast (bf16 works on CPU too); fp32 runs plain. Only fp16
needs a GradScaler: its 5-bit exponent underflows small gradients, bf16 has fp32's range.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(precision: str, device: torch.device) -> Callable[[], AbstractContextManager]:
    """A factory of autocast contexts for the forward pass (and the loss)."""
    return lambda: torch.autocast(device.type, dtype=DTYPES[precision], enabled=precision != "fp32")


def grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler:
    """Enabled for fp16 only; a disabled scaler's scale/unscale_/step/update pass straight through."""
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")


def loss_scale(scaler: torch.amp.GradScaler) -> float | None:
    """fp16: the scaler's current scale; None otherwise. Reading it is a host sync: log steps only."""
    return scaler.get_scale() if scaler.is_enabled() else None


def set_tf32(enabled: bool) -> None:
    """TF32 for fp32 matmuls and convolutions on GPUs that have it (Ampere+); no effect on CPU.

    Off by default in PyTorch since 1.12 for matmuls; about 10 bits of mantissa instead of 23, much faster.
    """
    if torch.cuda.is_available():
        mode = "tf32" if enabled else "ieee"
        torch.backends.cuda.matmul.fp32_precision = mode
        torch.backends.cudnn.conv.fp32_precision = mode  # type: ignore[attr-defined]  # not in torch's stubs
