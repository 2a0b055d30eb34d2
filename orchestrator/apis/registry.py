"""The registry of job APIs: key -> module. Imports nothing, so the job spec and the CLI's options can name
the keys (and say what each is) without importing an API module.

Adding an API is adding its module (orchestrator/apis/<key>.py, an `API` object implementing
`orchestrator.apis.base.JobAPI`) and one line here.
"""

from __future__ import annotations

from typing import NamedTuple


class Entry(NamedTuple):
    module: str  # the API's module, imported on first use (apis.by_key)
    operator: str  # what serves it, in words: help texts, `orch doctor`, the docs (the module's API.operator)


# key (job.yaml's `api:`, `--api`) -> entry; the order is `orch submit --api auto`'s preference.
REGISTRY = {
    "pytorchjob": Entry("orchestrator.apis.pytorchjob", "Kubeflow training operator"),
    "trainjob": Entry("orchestrator.apis.trainjob", "Kubeflow Trainer v2"),
}
KEYS = tuple(REGISTRY)
AUTO = "auto"  # `api: auto`: `orch render` renders the first key; `orch submit` asks the cluster
CHOICES = (AUTO, *KEYS)  # what `api:` and `--api` accept


def described() -> str:
    """The keys with what serves each, in the registry's order: for help texts."""
    return ", ".join(f"{key} ({entry.operator})" for key, entry in REGISTRY.items())
