"""The run's results, written by rank 0 at its end: model.pt, TensorBoard's events and summary.json, in the
output directory and, with output.url (`--out s3://...`), in the object store too.

summary.json says that a run finished and that its results are beside it (`orch run` prints it, `orch sweep`
takes a trial whose summary exists as finished, a cluster sweep reads the store's), so it is the last thing
written, locally after the store, and only once everything before it is written. The summary an earlier run
left (a resume into the same output) is removed first, so that it never stands beside this run's model. A
write that fails (a store that refuses, throttles past its retries or is gone, a full disk) stops there with
ResultsNotKept: one line naming what could not be written, where (the store's endpoint) and why; the
trainer's entrypoint ends every rank with it and exit_codes.RESULTS_NOT_KEPT. The run's last checkpoint is
already written, so the same run again resumes there and writes the results, without training again.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from orchestrator import outputs, storage


class ResultsNotKept(RuntimeError):
    """The training finished, but its results are not all where the run keeps them; the message names what
    could not be written, where, why and what to do (exit_codes.RESULTS_NOT_KEPT)."""


def keep(
    output_dir: Path,
    summary: dict[str, Any],
    *,
    model: dict[str, Any] | None,
    store: Any = None,
    tensorboard: str | None = None,
) -> None:
    """Write the results: model.pt (when `model`) in `output_dir`; with `store` (a storage.location), model.pt
    and the `tensorboard` folder's events there; then summary.json, in the store and in `output_dir`. Raises
    ResultsNotKept at the first write that fails, with nothing written after it."""
    from orchestrator.trainer import checkpoint

    step = summary.get("steps")
    places = [store, output_dir] if store is not None else [output_dir]
    for place in places:  # an earlier run's summary must not stand beside this run's results
        with _writing(outputs.SUMMARY, place, step):
            _remove(place / outputs.SUMMARY)
    if model is not None:
        with _writing(outputs.MODEL, output_dir, step):
            output_dir.mkdir(parents=True, exist_ok=True)
            checkpoint.write_atomic(output_dir / outputs.MODEL, model)
    if store is not None:
        if model is not None:
            with _writing(outputs.MODEL, store, step):
                storage.upload(output_dir / outputs.MODEL, store / outputs.MODEL)
        if tensorboard:  # the events as written locally; their copies at each checkpoint lag behind
            with _writing(f"TensorBoard's events ({tensorboard}/)", store, step):
                storage.upload(output_dir / tensorboard, store / tensorboard)
        with _writing(outputs.SUMMARY, store, step):
            (store / outputs.SUMMARY).write_bytes(json.dumps(summary, indent=2).encode() + b"\n")
    with _writing(outputs.SUMMARY, output_dir, step):
        output_dir.mkdir(parents=True, exist_ok=True)
        outputs.write_json(output_dir / outputs.SUMMARY, summary)


def _remove(path: Any) -> None:
    if storage.is_remote(path):
        if path.exists():
            path.unlink()
    else:
        path.unlink(missing_ok=True)


@contextmanager
def _writing(what: str, place: Any, step: Any) -> Iterator[None]:
    """Any failure inside is ResultsNotKept, saying `what` could not be written to `place` and why."""
    try:
        yield
    except Exception as error:  # a store's or a disk's, whatever layer raised it: the results are not kept
        from orchestrator.trainer.checkpoint import files

        reason = files.describe_failure(error, place)
        if storage.is_remote(place):
            where, remedy = (
                _store(str(place), reason),
                "check the store (its credentials, its endpoint, that it is up)",
            )
        else:
            where, remedy = str(place), "free space there"
        unclaimed = f"no {outputs.SUMMARY} was written; " if what != outputs.SUMMARY else ""
        raise ResultsNotKept(
            f"training finished at step {step}, but {what} could not be written to {where}: {reason}; "
            f"{unclaimed}{remedy} and run again with the same output: it resumes from its last checkpoint "
            "and writes the results"
        ) from error


def _store(url: str, reason: str) -> str:
    """`url`, with the endpoint its requests went to unless `reason` names it already (and never a secret:
    storage.endpoint redacts)."""
    scheme = url.partition("://")[0].lower()
    configured = storage.endpoint(scheme)
    if reason.startswith("the store at") or configured is None:
        return url
    return f"{url} (the store at {configured[0]}, {configured[1]})"
