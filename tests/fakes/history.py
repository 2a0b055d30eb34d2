"""The API server's storage rules that watches and paged lists depend on (etcd's part), for the emulator.

- One resourceVersion counter for every object of every resource; each create, change and deletion takes
  the next value, stamped on the object and on the watch event (etcd's modification revision).
- A window of recent events: a watch from a resourceVersion inside it replays what came after; from one
  older than the window (`compact()`, as etcd compaction does) it gets an ERROR event with a 410 Status,
  "too old resource version", as the API server sends it (staging/src/k8s.io/apiserver/pkg/storage/
  cacher/watch_cache.go, `errors.NewResourceExpired`), and the client must list again.
- Paged lists (`limit`/`continue`): every page is cut from the snapshot the first page saw (the API server
  reads each page from etcd at the first page's revision), in key order (namespace, then name); a continue
  token whose revision was compacted is answered 410 Expired (apiserver/pkg/storage/etcd3/store.go).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import copy
import itertools
import json
from dataclasses import dataclass
from typing import Any

EXPIRED_CONTINUE = (
    "The provided continue parameter is too old to display a consistent list result. You can start a new "
    "list without the continue parameter."
)


class Expired(Exception):
    """The resourceVersion asked for is older than the window (HTTP 410, reason Expired)."""


@dataclass(frozen=True)
class Event:
    resource_version: int
    resource: Any  # kmock's resource reference
    type: str  # ADDED, MODIFIED, DELETED
    object: dict[str, Any]


class History:
    def __init__(self, window: int = 100_000) -> None:
        self._versions = itertools.count(1000)
        self.current = 999  # the resourceVersion of the latest change
        self.oldest = 1000  # events from this resourceVersion on are kept
        self.events: collections.deque[Event] = collections.deque(maxlen=window)
        self.changed = asyncio.Condition()
        self._snapshots: dict[int, tuple[int, list[dict[str, Any]]]] = {}  # id -> (rv, the items it saw)
        self._snapshot_ids = itertools.count(1)

    async def record(self, resource: Any, type_: str, obj: dict[str, Any]) -> None:
        """A change happened: stamp it with the next resourceVersion, keep it, wake the watches."""
        version = next(self._versions)
        # `obj` shares its metadata with the stored object (kmock hands out shallow copies): the stored
        # object takes the new resourceVersion too, as its next GET shows.
        obj.setdefault("metadata", {})["resourceVersion"] = str(version)
        if len(self.events) == self.events.maxlen:
            self.oldest = self.events[0].resource_version + 1
        self.events.append(Event(version, resource, type_, copy.deepcopy(obj)))
        self.current = version
        async with self.changed:
            self.changed.notify_all()

    def compact(self) -> None:
        """etcd compaction: nothing up to now can be watched from or continued any more."""
        self.events.clear()
        self.oldest = self.current + 1
        self._snapshots.clear()

    def since(self, resource: Any, version: int) -> list[Event]:
        """The events of `resource` after `version`; Expired if the window no longer reaches back to it."""
        if version + 1 < self.oldest:
            raise Expired(f"too old resource version: {version} ({self.oldest - 1})")
        return [e for e in self.events if e.resource_version > version and e.resource == resource]

    # --- paged lists

    def page(
        self, items: list[dict[str, Any]], *, limit: int | None, token: str | None
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """One page of a list and its metadata (resourceVersion, continue, remainingItemCount)."""
        if token:
            try:
                state = json.loads(base64.urlsafe_b64decode(token.encode()))
                snapshot_id, start = int(state["id"]), int(state["start"])
            except (ValueError, KeyError, TypeError):
                raise ValueError("continue key is not valid") from None
            if snapshot_id not in self._snapshots or self._snapshots[snapshot_id][0] + 1 < self.oldest:
                raise Expired(EXPIRED_CONTINUE)
            version, snapshot = self._snapshots[snapshot_id]
        else:
            snapshot_id, version, start = next(self._snapshot_ids), self.current, 0
            snapshot = sorted(items, key=_key)
        metadata: dict[str, Any] = {"resourceVersion": str(version)}
        if limit is None or limit <= 0:
            return snapshot[start:], metadata
        end = start + limit
        if end < len(snapshot):
            self._snapshots[snapshot_id] = (version, snapshot)
            metadata["continue"] = base64.urlsafe_b64encode(
                json.dumps({"id": snapshot_id, "start": end}).encode()
            ).decode()
            metadata["remainingItemCount"] = len(snapshot) - end
        else:
            self._snapshots.pop(snapshot_id, None)  # the last page: nothing will continue from it
        return snapshot[start:end], metadata


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


class Recorder:
    """Stands in for kmock's per-resource event bus: what kmock puts there is recorded in the history."""

    def __init__(self, history: History, resource: Any) -> None:
        self.history, self.resource = history, resource

    async def put(self, event: dict[str, Any]) -> None:
        await self.history.record(self.resource, event["type"], event["object"])


class Recorders(dict):  # type: ignore[type-arg]
    """kmock's `_buses`: resource -> its Recorder, made on first use."""

    def __init__(self, history: History) -> None:
        super().__init__()
        self.history = history

    def __missing__(self, resource: Any) -> Recorder:
        self[resource] = recorder = Recorder(self.history, resource)
        return recorder
