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
    """TF32 for fp32 matmuls and convolutions on GPUs that have it (Ampere+): about 10 bits of mantissa
    instead of 23, much faster. PyTorch's default since 1.12 is off for matmuls, on for convolutions.

    The legacy setters, on every supported torch: they exist from before the floor, and from 2.9 on they
    also set the new `fp32_precision` flags, so both spellings read back the same. Setting only the new
    flags (2.9+) makes every later read of a legacy flag raise "mix of the legacy and new APIs", and
    Inductor reads them while compiling (pytorch/pytorch#166387). The trainer calls this on GPUs only: on a
    CPU, "high" would also let oneDNN use reduced-precision fp32 matmuls.
    """
    torch.set_float32_matmul_precision("high" if enabled else "highest")
    torch.backends.cudnn.allow_tf32 = enabled


def tf32_flags() -> dict[str, str | bool]:
    """Every TF32 flag as torch reports it (the new 2.9+ ones where they exist): raises if a read does."""
    flags: dict[str, str | bool] = {
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
    }
    # The new (2.9+) flags, where this torch has them; reading them must not raise either.
    matmul, conv = torch.backends.cuda.matmul, getattr(torch.backends.cudnn, "conv", None)
    if hasattr(matmul, "fp32_precision"):
        flags["cuda.matmul.fp32_precision"] = matmul.fp32_precision
    if conv is not None and hasattr(conv, "fp32_precision"):
        flags["cudnn.conv.fp32_precision"] = conv.fp32_precision
    return flags
