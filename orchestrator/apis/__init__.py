"""The job APIs orch renders and submits to: one module per API, one registry entry each.

Each module (`pytorchjob`: Kubeflow Training Operator v1; `trainjob`: Kubeflow Trainer v2) owns everything
that differs between APIs: what it refuses in a spec, the objects it renders (through the one pod template,
orchestrator/rendering/pod.py), its restart and scheduling translation, how its status and pods read, its constants.
It exposes one `API` object implementing `base.JobAPI`. Adding an API is adding one module and one line to
`registry.REGISTRY`; `api:`, `--api`, discovery and the docs tables come from it.

Modules are imported by name when first asked for (like torchx's deferred schedulers), so importing this
package imports no API module, and no module here imports one of its callers.
"""

from __future__ import annotations

import importlib
from typing import cast

from orchestrator.apis.base import JobAPI
from orchestrator.apis.registry import AUTO, CHOICES, KEYS, REGISTRY

__all__ = ["AUTO", "CHOICES", "KEYS", "REGISTRY", "JobAPI", "all_apis", "by_key", "resolve"]


def by_key(key: str) -> JobAPI:
    """The API registered as `key` (KeyError for a key not in REGISTRY)."""
    return cast(JobAPI, importlib.import_module(REGISTRY[key].module).API)


def all_apis() -> tuple[JobAPI, ...]:
    """Every API orch knows, in the order `orch submit --api auto` prefers them."""
    return tuple(by_key(key) for key in KEYS)


def resolve(key: str) -> str:
    """`key`, with auto as the first registered API (what `orch render` renders without a cluster)."""
    return KEYS[0] if key == AUTO else key
