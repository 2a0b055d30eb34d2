"""Which torch the trainer runs on: the floor it supports, checked at start, and the gates for newer APIs.

Users bring their own CUDA torch (NGC and PyTorch images of many ages), so the trainer supports every
release from `MIN_TORCH` on (pyproject.toml's `torch>=` says the same; a test keeps them equal). An API
newer than the floor is used through a gate here or next to its one call (`step.total_norm`), never bare.
"""

from __future__ import annotations

import re

MIN_TORCH = (2, 4)
"""torch.amp.GradScaler("cuda"), init_process_group(device_id=...), FSDP2 under _composable: 2.4 has them all."""


class TorchTooOld(RuntimeError):
    """The installed torch is older than MIN_TORCH."""


def version_tuple(version: str) -> tuple[int, int]:
    """`2.6.0a0+ecf3bae40a.nv25.01` -> (2, 6): NGC and nightly builds carry suffixes."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError(f"cannot read a torch version from {version!r}")
    return int(match.group(1)), int(match.group(2))


def check_torch(version: str | None = None) -> str:
    """The installed torch's version; raises TorchTooOld (one line, with what to do) below the floor."""
    if version is None:
        import torch

        version = str(torch.__version__)
    if version_tuple(version) < MIN_TORCH:
        floor = ".".join(map(str, MIN_TORCH))
        raise TorchTooOld(
            f"torch {version} is older than orch's trainer supports (torch >= {floor}); use an image with "
            f"a newer PyTorch (e.g. an NGC PyTorch 24.07 or later image), or `pip install 'torch>={floor}'`"
        )
    return version


def require(feature: str, version: tuple[int, int], installed: str | None = None) -> None:
    """Raise TorchTooOld, naming `feature`, when the installed torch is older than `version`."""
    if installed is None:
        import torch

        installed = str(torch.__version__)
    if version_tuple(installed) < version:
        raise TorchTooOld(
            f"{feature} needs torch >= {'.'.join(map(str, version))}; this is torch {installed}: use a newer "
            "image, or the default train.parallel: ddp"
        )
