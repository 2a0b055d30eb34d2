"""The registry of job APIs: key -> module. Imports nothing, so the job spec can name the keys.

Adding an API is adding its module (orchestrator/apis/<key>.py, an `API` object implementing
`orchestrator.apis.base.JobAPI`) and one line here.
"""

from __future__ import annotations

# key (job.yaml's `api:`, `--api`) -> module; the order is `orch submit --api auto`'s preference.
REGISTRY = {
    "pytorchjob": "orchestrator.apis.pytorchjob",
    "trainjob": "orchestrator.apis.trainjob",
}
KEYS = tuple(REGISTRY)
AUTO = "auto"  # `api: auto`: `orch render` renders the first key; `orch submit` asks the cluster
CHOICES = (AUTO, *KEYS)  # what `api:` and `--api` accept
