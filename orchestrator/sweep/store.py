"""A cluster trial's files in the object store, as `orch sweep --cluster` reads and writes them.

A cluster trial keeps its outputs under its own prefix, OUTPUT_URL/JOB (the job's output.url and the trial
job's name). The trainer uploads objective.json there at each value and summary.json at its end
(trainer/objective.py, trainer/main.py); the sweep reads them there, and asks the trainer to stop as pruned
by writing prune.request beside them (trainer/stop.py looks for it). docs/decisions.md says why the store
and not the study's database: the pods already write there, with credentials the job already gives them.

Through obstore (storage.object_store: this shell's credentials and endpoint, as `orch run --out s3://` uses
them), with short request and retry limits: the sweep polls, and a store that still does not answer after
them stops the sweep in one line (its trials go on; `orch sweep --cluster` again re-attaches them).
"""

from __future__ import annotations

import json
from typing import Any

from orchestrator import storage
from orchestrator.errors import OrchError

REQUEST_SECONDS = 10.0
RETRY_SECONDS = 30.0


class StoreError(OrchError):
    """The store did not answer or refused: the message names the object and why (storage.describe)."""


class TrialStore:
    """The objects under one trial's prefix, `url` (s3://bucket/prefix/sweep-trial-3)."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self._store: Any = None
        self._key = ""

    def read_json(self, name: str) -> dict[str, Any]:
        """The JSON object `name` holds; {} when there is none (not yet written) or it is not one."""
        import obstore
        from obstore.exceptions import NotFoundError

        try:
            data = bytes(obstore.get(self._opened(), self._path(name)).bytes())
        except (FileNotFoundError, NotFoundError):  # obstore raises the builtin for a missing object
            return {}
        except Exception as error:  # noqa: BLE001 (obstore's errors: one phrase of them)
            raise StoreError(f"cannot read {self.url}/{name}: {storage.describe(error)}") from error
        try:
            found = json.loads(data)
        except ValueError:
            return {}
        return found if isinstance(found, dict) else {}

    def write(self, name: str, data: bytes) -> None:
        import obstore

        try:
            obstore.put(self._opened(), self._path(name), data)
        except Exception as error:  # noqa: BLE001 (as in read_json)
            raise StoreError(f"cannot write {self.url}/{name}: {storage.describe(error)}") from error

    def is_empty(self) -> bool:
        """Whether nothing is stored under the prefix yet (one list request, its first page)."""
        import obstore

        try:
            for batch in obstore.list(self._opened(), prefix=self._path(""), chunk_size=1):
                return not batch
        except Exception as error:  # noqa: BLE001 (as in read_json)
            raise StoreError(f"cannot list {self.url}/: {storage.describe(error)}") from error
        return True

    def _opened(self) -> Any:
        if self._store is None:
            try:
                self._store, self._key = storage.object_store(
                    self.url, request_seconds=REQUEST_SECONDS, retry_seconds=RETRY_SECONDS
                )
            except storage.StorageError as error:
                raise StoreError(f"{self.url}: {error}") from None
        return self._store

    def _path(self, name: str) -> str:
        return f"{self._key}/{name}".lstrip("/")
