"""Where a run's bytes go: a local directory, or an object store (`s3://`, `gs://`, `az://` URLs).

Object stores are reached through fsspec with obstore (the Rust `object_store` crate's Python binding) as the
implementation, and `universal_pathlib`'s UPath gives them the pathlib interface the checkpoint code uses for
local directories, so both share one reading of a checkpoint. Why obstore and not s3fs: s3fs needs botocore,
which pins python-dateutil below what the kubernetes client needs (the same conflict that keeps the MLflow
server in a venv of its own), and obstore retries throttling (HTTP 503 SlowDown, 5xx, dropped connections)
with exponential backoff by itself.

Credentials and endpoints come from the environment, as every S3 tool reads them: AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION, AWS_ENDPOINT_URL (S3-compatible stores: MinIO, Ceph);
GOOGLE_SERVICE_ACCOUNT / GOOGLE_APPLICATION_CREDENTIALS for gs://; AZURE_STORAGE_ACCOUNT_NAME /
AZURE_STORAGE_ACCOUNT_KEY for az://. In a pod they come from `secret_env`. AWS_ENDPOINT_URL_S3 (the AWS
SDKs' and CLI's S3-only variable) wins over AWS_ENDPOINT_URL, as it does there; object_store itself reads only
the latter. An `http://` endpoint is allowed (object_store refuses plain HTTP unless told).
ORCH_STORAGE_RETRY_SECONDS bounds how long one request is retried (default 180 s) before the run fails; the
probe at start (`check_writable`) waits PROBE_SECONDS at most, so a store that does not answer stops a run
before it starts, not three minutes later.

A failure names the endpoint that was asked and where it came from (`the store at http://127.0.0.1:9000
(AWS_ENDPOINT_URL) cannot be reached (connection refused)`; with no endpoint set, AWS's own), with any
credential in it redacted: most failures of a new setup are a wrong or unset endpoint.

Imports nothing heavy at module level: `orch render` and the spec's validation use `url_problem`.
"""

from __future__ import annotations

import os
import re
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

SCHEMES = ("s3", "gs", "az")
"""Object stores orch writes to (each is one obstore backend; `s3` covers S3-compatible stores)."""
RETRY_SECONDS = "ORCH_STORAGE_RETRY_SECONDS"
DEFAULT_RETRY_SECONDS = 180.0
PROBE_SECONDS = 15.0
"""The start's probe: its whole wait, retries included (requests time out after PROBE_REQUEST_SECONDS)."""
PROBE_REQUEST_SECONDS = 5
URL = re.compile(r"^(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*)://(?P<bucket>[^/]*)(?P<prefix>/.*)?$")
S3_ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT")
"""Where an S3-compatible store's endpoint is read from, first set wins (the SDKs' order; AWS_ENDPOINT is
object_store's older spelling)."""
SECRET_VARIABLES = (
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_SAS_KEY",
)
"""Never in a message, even where a store's answer would echo one."""
CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f]")
DOT_SEGMENT = re.compile(r"^(\.|%2e){1,2}$", re.IGNORECASE)  # ., .., and their percent-encoded forms


class StorageError(RuntimeError):
    """The object store cannot be used (no bucket, bad credentials, unreachable); the message says which."""


def is_url(text: str | os.PathLike[str]) -> bool:
    return isinstance(text, str) and URL.match(text) is not None


def url_problem(text: str) -> str | None:
    """None for a URL orch can write to, else what is wrong (one phrase, the URL's credentials never in it).

    A URL that carries credentials (`s3://KEY:SECRET@bucket`, a `?X-Amz-Signature=`/`?sig=` token) is refused:
    the URL goes into the pods' env, the job's objects and `orch status`, where anyone who may read the job
    would read them too."""
    from orchestrator.redaction import redact

    match = URL.match(text)
    if match is None:
        return f"{redact(text)!r} is not a URL (scheme://bucket/prefix)"
    scheme = match["scheme"].lower()
    if scheme not in SCHEMES:
        return f"scheme {scheme}:// is not supported (supported: {', '.join(s + '://' for s in SCHEMES)})"
    if "@" in match["bucket"]:
        return (
            "carries credentials (user:password@ before the bucket), which would be written into the job's "
            "objects and its run's records: give them to the pods as secret_env (AWS_ACCESS_KEY_ID, "
            "AWS_SECRET_ACCESS_KEY; for orch run, the shell's environment)"
        )
    if "?" in text or "#" in text:
        return (
            "has a query string or fragment (? or #), where signed URLs and SAS tokens keep credentials: a "
            "prefix cannot hold one; give credentials to the pods as secret_env"
        )
    if CONTROL_CHARACTER.search(text):
        return "has a control character (a newline, a tab, ESC): a key cannot hold one"
    bucket = match["bucket"]
    if not bucket:
        return f"{text!r} names no bucket ({scheme}://BUCKET/prefix)"
    if ":" in bucket:  # s3://127.0.0.1:9000/bucket: the address of a local store where the bucket goes
        where = f"AWS_ENDPOINT_URL=http://{bucket}" if scheme == "s3" else "the store's variables"
        return f"{bucket!r} is not a bucket name: a store's address goes in {where}, not in the URL"
    segments = [bucket, *(match["prefix"] or "").rstrip("/").split("/")[1:]]
    if any(DOT_SEGMENT.match(segment) for segment in segments):
        return f"{text!r} has a . or .. segment: object-store keys are not paths (.. goes up nowhere, and obstore refuses it): write the prefix without it"
    if "" in segments:
        return f"{text!r} has an empty segment (//): object stores refuse such keys"
    return None


def location(text: str | os.PathLike[str]) -> Any:
    """A Path for a local directory, a UPath (pathlib's interface over fsspec) for an object-store URL."""
    if not is_url(text):
        return Path(text)
    problem = url_problem(str(text))
    if problem:
        raise StorageError(problem)
    register()
    from upath import UPath

    return UPath(str(text).rstrip("/"))


def is_remote(path: Any) -> bool:
    return not isinstance(path, Path)


def remove_tree(path: Any) -> None:
    """Delete a checkpoint directory (local) or every object under a prefix (object store)."""
    import shutil

    if not is_remote(path):
        shutil.rmtree(path) if path.is_dir() else path.unlink()
        return
    if path.fs.exists(path.path):
        path.fs.rm(path.path, recursive=True)


def check_writable(url: str) -> None:
    """Write and delete a probe object under `url`: a missing bucket, bad credentials or an endpoint that is
    down or does not answer fail here, at start, as one StorageError line within about PROBE_SECONDS, not
    at the first checkpoint. Through obstore itself, whose errors say why a request failed (a refused
    connection, a timeout); fsspec's file objects keep only the first line."""
    import obstore

    # Short requests and a short retry budget: a silent endpoint would otherwise hold the start for
    # ORCH_STORAGE_RETRY_SECONDS (10 retries of 30 s requests).
    store, key = object_store(url, request_seconds=PROBE_REQUEST_SECONDS,
                              retry_seconds=PROBE_SECONDS - PROBE_REQUEST_SECONDS)  # fmt: skip
    probe = f"{key}/.orch-write-check".lstrip("/")
    started = time.monotonic()
    try:
        obstore.put(store, probe, b"orch\n")
        obstore.delete(store, probe)
    except Exception as error:  # obstore's errors carry the whole HTTP exchange: one phrase of it
        waited = round(time.monotonic() - started)
        raise StorageError(f"cannot write to {url}: {describe(error, waited=waited)}") from error


def object_store(
    url: str, *, request_seconds: float | None = None, retry_seconds: float | None = None
) -> tuple[Any, str]:
    """obstore's store for the bucket of `url` and the key of its prefix, configured as fsspec's (the same
    environment, endpoint and retries): for what fsspec does not offer (conditional writes, whole errors).
    `request_seconds`/`retry_seconds`: shorter limits than a checkpoint's uploads need."""
    from obstore.store import from_url

    problem = url_problem(url)
    if problem:
        raise StorageError(problem)
    match = URL.match(url.rstrip("/"))
    assert match is not None  # url_problem said it is one
    scheme = match["scheme"].lower()
    options = client_options()
    if request_seconds is not None:
        options |= {"timeout": f"{request_seconds:g}s", "connect_timeout": f"{request_seconds:g}s"}
    # (one overload per scheme's config type; the scheme is known only at run time)
    store = from_url(f"{scheme}://{match['bucket']}", config=_config(scheme), client_options=options,  # type: ignore[call-overload]
                     retry_config=_retry_config(retry_seconds))  # fmt: skip
    return store, (match["prefix"] or "").strip("/")


def small_files(url: str, names: tuple[str, ...] = (), *, under: str = "") -> dict[str, str]:
    """The text of small objects below `url` for a reader that must not wait for minutes (`orch status`):
    each of `names`, and every object under the prefix `under`, by its path relative to `url`; a missing one
    is left out. Requests time out after PROBE_REQUEST_SECONDS, retries stop after PROBE_SECONDS; errors are
    StorageError with `describe`'s phrase."""
    import obstore

    store, key = object_store(url, request_seconds=PROBE_REQUEST_SECONDS,
                              retry_seconds=PROBE_SECONDS - PROBE_REQUEST_SECONDS)  # fmt: skip
    base = f"{key}/" if key else ""
    found: dict[str, str] = {}
    started = time.monotonic()
    try:
        paths = [base + name for name in names]
        if under:
            paths += [
                meta["path"] for batch in obstore.list(store, prefix=base + under + "/") for meta in batch
            ]
        for path in paths:
            try:
                found[path[len(base) :]] = bytes(obstore.get(store, path).bytes()).decode(errors="replace")
            except FileNotFoundError:
                continue
    except Exception as error:  # obstore's errors carry the whole HTTP exchange: one phrase of it
        waited = round(time.monotonic() - started)
        raise StorageError(f"cannot read {url}: {describe(error, waited=waited)}") from error
    return found


def endpoint(scheme: str) -> tuple[str, str] | None:
    """The endpoint an `s3://` request goes to and the variable that set it (redacted); None for AWS's own
    (no variable set) and for the other schemes, whose endpoints obstore derives."""
    if scheme != "s3":
        return None
    for name in S3_ENDPOINT_VARIABLES:
        if value := os.environ.get(name):
            from orchestrator.redaction import redact_url

            return redact_url(value.rstrip("/")), name
    return None


METADATA_PATHS = ("/latest/api/token", "/latest/meta-data")  # the cloud's instance metadata service (IMDS)


def _origin(url: str) -> str | None:
    """scheme://host[:port] of a URL, without credentials or path."""
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}" if parts.scheme and parts.netloc else None


def _asked(text: str) -> str | None:
    """The origin of the request an obstore error reports (`Error performing PUT URL in ...`)."""
    match = re.search(r"Error performing [A-Z]+ (\S+)", text)
    return _origin(match[1]) if match else None


def _where(text: str) -> str:
    """`the store at URL (where it came from)` for the request in an obstore error, as well as it is known."""
    asked = _asked(text)
    configured = endpoint("s3")
    if configured is not None and (asked is None or asked == _origin(configured[0])):
        return f"the store at {configured[0]} ({configured[1]})"
    if asked is not None and asked.endswith(".amazonaws.com") and configured is None:
        return f"the store at {asked} (AWS's own: AWS_ENDPOINT_URL is not set)"
    return f"the store at {asked}" if asked else "the store"


def describe(error: BaseException, *, waited: float | None = None) -> str:
    """One phrase for an object-store failure (obstore's messages run to dozens of lines), naming the
    endpoint asked and where it came from when the store could not be reached. `waited`: how long the
    caller's retries lasted at most, said when the store did not answer. Credentials never appear."""
    text = str(error)
    for code, meaning in (
        ("NoSuchBucket", "the bucket does not exist"),
        ("InvalidAccessKeyId", "the access key is not known to the store (check AWS_ACCESS_KEY_ID)"),
        ("SignatureDoesNotMatch", "the secret key does not match (check AWS_SECRET_ACCESS_KEY)"),
        ("AccessDenied", "access denied (the credentials may not write there)"),
        ("SlowDown", "the store kept throttling (503 SlowDown) past the retry budget"),
    ):
        if code in text:
            return meaning
    asked = _asked(text) or ""
    if any(f"{asked}{path}" in text for path in METADATA_PATHS):
        return (
            f"no credentials: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY are not set and the cloud's instance "
            f"metadata service ({asked}) did not give any; set them (in a pod, through secret_env)"
        )
    if "Missing" in text and ("credential" in text.lower() or "region" in text.lower()):
        return "no credentials (set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, in a pod through secret_env)"
    if "Connection refused" in text or "ConnectionRefused" in text:
        return f"{_where(text)} cannot be reached (connection refused)"
    if "dns error" in text:
        return f"{_where(text)} cannot be reached (its host name does not resolve)"
    if "TimedOut" in text or "kind: Timeout" in text or "timed out" in text:
        within = f" in {waited:g} s" if waited else ""
        return f"{_where(text)} did not answer{within} (timed out)"
    if "error sending request" in text or "tcp connect" in text:
        return f"{_where(text)} cannot be reached (the connection failed)"
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return scrubbed(first[:200])


def _retry_config(budget: float | None = None) -> dict[str, Any]:
    """obstore's retries: exponential backoff within `budget` seconds (ORCH_STORAGE_RETRY_SECONDS)."""
    if budget is None:
        seconds = os.environ.get(RETRY_SECONDS)
        try:
            budget = float(seconds) if seconds else DEFAULT_RETRY_SECONDS
        except ValueError:
            budget = DEFAULT_RETRY_SECONDS
    return {
        "max_retries": 10,
        "retry_timeout": timedelta(seconds=budget),
        "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=15)},
    }


def client_options() -> dict[str, Any]:
    configured = endpoint("s3")
    return {"allow_http": True} if configured and configured[0].startswith("http://") else {}


def _config(scheme: str) -> dict[str, Any] | None:
    """The endpoint from AWS_ENDPOINT_URL_S3 as well (object_store reads AWS_ENDPOINT_URL and AWS_ENDPOINT
    from the environment itself; the rest of its configuration too). An endpoint with credentials in it is
    refused: S3 signs requests with the access keys, and obstore's errors repeat the endpoint whole."""
    import urllib.parse

    configured = endpoint(scheme)
    if configured is None:
        return None
    value = os.environ[configured[1]]
    parts = urllib.parse.urlsplit(value)
    if parts.username is not None or parts.password is not None:
        raise StorageError(
            f"{configured[1]} carries credentials (user:password@ in {configured[0]}): the store's requests are "
            "signed with AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY; give the endpoint without them"
        )
    return {"endpoint": value}


def scrubbed(text: str) -> str:
    """`text` (a reader's or a store's error) with URL credentials and the store secrets of the environment
    replaced by ***."""
    from orchestrator.redaction import scrub

    return scrub(text, [os.environ.get(name, "") for name in SECRET_VARIABLES])


_registered = False


def register() -> None:
    """Make fsspec (and so torch.distributed.checkpoint and UPath) use obstore for orch's schemes."""
    global _registered
    if _registered:
        return
    import fsspec  # type: ignore[import-untyped]
    from obstore.fsspec import BufferedFile, FsspecStore

    class CopyingFile(BufferedFile):
        """obstore's writer keeps the buffers it is given and uploads them later; torch.save reuses its
        buffers, so what arrived was overwritten (corrupt .distcp files). Copy on write."""

        def write(self, data: Any) -> int:
            return int(super().write(bytes(data)))

        def close(self) -> None:
            if not hasattr(self, "_reader") and not hasattr(self, "_writer"):
                self.closed = True  # the open itself failed (and raised); nothing to close
                return
            super().close()

    for scheme in SCHEMES:

        class OrchStore(FsspecStore):
            protocol = scheme
            cachable = False  # a new instance reads the environment again (rotated keys, another endpoint)

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                kwargs.setdefault("retry_config", _retry_config())
                kwargs["client_options"] = {**client_options(), **(kwargs.get("client_options") or {})}
                kwargs["config"] = {**(_config(self.protocol) or {}), **(kwargs.get("config") or {})} or None
                super().__init__(*args, **kwargs)

            def _open(self, path: str, mode: str = "rb", *args: Any, **kwargs: Any) -> Any:
                if mode not in ("wb", "rb"):
                    raise ValueError(f"only 'rb' and 'wb' modes are supported, got {mode!r}")
                return CopyingFile(self, path, mode, **kwargs)  # type: ignore[call-overload]

        fsspec.register_implementation(scheme, OrchStore, clobber=True)
    _registered = True


def upload(local: Path, remote: Any) -> None:
    """Copy a local file, or a directory's files, to `remote` (a UPath): TensorBoard's event files, which
    its writer appends to locally, and what `orch run` also keeps on this machine."""
    if local.is_dir():
        for file in sorted(p for p in local.rglob("*") if p.is_file()):
            remote.fs.put_file(str(file), (remote / file.relative_to(local).as_posix()).path)
    elif local.is_file():
        remote.fs.put_file(str(local), remote.path)


# --- one run per prefix: a lease ------------------------------------------------------------------------------

LEASE_SECONDS = "ORCH_STORAGE_LEASE_SECONDS"
DEFAULT_LEASE_SECONDS = 30.0
"""How long a lease outlives its holder's last renewal (renewed every third of it): a run killed on another
machine is taken over after this long unchanged."""


class LeaseHeld(StorageError):
    """Another run holds the lease; the message names it, `holder` says who (job, host, pid)."""

    def __init__(self, message: str, holder: str) -> None:
        super().__init__(message)
        self.holder = holder


def holder_identity() -> dict[str, Any]:
    """Who holds a lease: the job, the host, the process, and where a pid means something (the kernel's
    boot id and the pid namespace, Linux's; elsewhere empty), so that a lease left by a dead process of this
    machine is known dead at once, and a live one refused at once."""
    import socket

    me: dict[str, Any] = {"job": os.environ.get("ORCH_JOB_NAME", ""), "host": socket.gethostname(),
                          "pid": os.getpid(), "machine": _machine(), "started": _started(os.getpid())}  # fmt: skip
    return me


def _machine() -> str:
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""


def _started(pid: int) -> str:
    """A process's start time in clock ticks since boot (/proc/PID/stat's 22nd field): a pid reused by another
    process has another. Empty where there is no /proc."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return ""


def _alive_here(holder: dict[str, Any]) -> bool | None:
    """True/False when `holder` was a process of this machine (same boot, same pid namespace), None when
    that cannot be told from here (another machine, or no /proc)."""
    if (
        not holder.get("machine")
        or holder.get("machine") != _machine()
        or not isinstance(holder.get("pid"), int)
    ):
        return None
    return bool(_started(holder["pid"])) and _started(holder["pid"]) == holder.get("started")


def _lease_seconds() -> float:
    try:
        seconds = float(os.environ.get(LEASE_SECONDS) or DEFAULT_LEASE_SECONDS)
    except ValueError:
        return DEFAULT_LEASE_SECONDS
    return seconds if seconds > 0 else DEFAULT_LEASE_SECONDS


class Lease:
    """One run's hold on an object-store prefix, where there is no flock: the object `url` holds the holder's
    identity. Taken with a conditional PUT that succeeds only if the object is absent (If-None-Match), renewed
    by a thread every third of the lease with one that succeeds only if it is still ours (If-Match: its
    ETag), deleted at release. Two runs never both hold it: a run killed without releasing stops renewing,
    and its lease is taken over (conditionally on the ETag seen) once it has stayed unchanged for a whole
    lease, as observed here (no clocks compared); a dead process of this machine is known at once. A renewal
    that finds the lease taken (this run was presumed dead: stalled past the lease, cut off from the store)
    sets `lost`, which the holder checks before it writes.
    A store without conditional writes cannot keep two runs apart: `acquire` says so, returns False and
    the run goes on without a lease."""

    def __init__(self, url: str, *, lease_seconds: float | None = None) -> None:
        self.url = url
        self.seconds = lease_seconds or _lease_seconds()
        # Requests bounded by the renewal period: a renewal stuck on a store that is down must not hold the
        # run's end (release joins the renewer), and a lease not renewed in time is lost anyway.
        third = max(1, int(self.seconds / 3))
        self.store, self.key = object_store(url, request_seconds=third, retry_seconds=third)
        self.me = holder_identity()
        self.etag: str | None = None
        self.lost: str | None = None
        self._renewer: Any = None
        import threading

        self._stop = threading.Event()

    def _body(self) -> bytes:
        import json

        return (
            json.dumps({**self.me, "lease_seconds": self.seconds, "renewed": time.time()}) + "\n"
        ).encode()

    def _read(self) -> tuple[str | None, dict[str, Any]] | None:
        """(ETag, holder) of the lease object; None when there is none."""
        import json

        import obstore

        try:
            got = obstore.get(self.store, self.key)
            body = bytes(got.bytes())
        except FileNotFoundError:
            return None
        try:
            holder = json.loads(body)
        except ValueError:
            holder = {}
        return got.meta.get("e_tag"), holder if isinstance(holder, dict) else {}

    def acquire(self, *, wait_seconds: float | None = None, say: Any = None) -> bool:
        """Take the lease, waiting up to `wait_seconds` (default 1.5 leases: long enough to see a dead
        holder's lease run out) for one another machine holds; LeaseHeld names a live holder. True once
        held; False when this process holds it already, or the store cannot do conditional writes (said:
        nothing is held)."""
        import obstore
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        wait = wait_seconds if wait_seconds is not None else 1.5 * self.seconds
        deadline = time.monotonic() + wait
        seen: tuple[str | None, float] | None = None  # the holder's ETag and when it was first seen so
        told = False
        while True:
            try:
                self.etag = obstore.put(self.store, self.key, self._body(), mode="create")["e_tag"]
                break
            except AlreadyExistsError:
                pass
            except NotImplementedError:
                if say:
                    say(f"warning: {self.url}: the store does not do conditional writes, so a second run on "
                        "this prefix is not kept out: one run at a time is yours to keep")  # fmt: skip
                return False
            found = self._read()
            if found is None:
                continue  # released in between: try again
            etag, holder = found
            alive = _alive_here(holder)
            if alive and holder.get("pid") == os.getpid():
                return False  # this process holds it already (an earlier holder of the same run)
            now = time.monotonic()
            if seen is None or seen[0] != etag:
                seen = (etag, now)
            stale = alive is False or (alive is None and now - seen[1] >= self.seconds)
            if stale and etag is not None:
                try:
                    self.etag = obstore.put(self.store, self.key, self._body(), mode={"e_tag": etag})["e_tag"]
                    break
                except (PreconditionError, FileNotFoundError):
                    continue  # another run took it over first, or it was released: look again
            if alive is True or now >= deadline:
                who = ", ".join(f"{key} {holder[key]}" for key in ("job", "host", "pid") if holder.get(key))
                raise LeaseHeld(
                    f"{self.url} is held by another run ({who or 'unknown'}), renewed within the last "
                    f"{self.seconds:g} s: one run at a time per prefix; wait for it to finish, or give this run "
                    "its own prefix",
                    who or "unknown",
                )
            if say and not told:
                told = True
                say(f"waiting up to {wait:g} s for {self.url}, held by "
                    f"{holder.get('host', 'unknown')} pid {holder.get('pid', '?')}: taken over if it is not "
                    "renewed in that time (a run that was killed)")  # fmt: skip
            time.sleep(min(1.0, self.seconds / 10))
        self._start_renewing()
        return True

    def _start_renewing(self) -> None:
        import threading

        self._renewer = threading.Thread(target=self._renew, name="orch-lease", daemon=True)
        self._renewer.start()

    def _renew(self) -> None:
        import obstore
        from obstore.exceptions import PreconditionError

        while not self._stop.wait(self.seconds / 3):
            try:
                self.etag = obstore.put(self.store, self.key, self._body(), mode={"e_tag": self.etag})[
                    "e_tag"
                ]
            except (PreconditionError, FileNotFoundError):
                found = self._read()
                holder = found[1] if found else {}
                who = ", ".join(f"{key} {holder[key]}" for key in ("job", "host", "pid") if holder.get(key))
                self.lost = (
                    f"{self.url} was taken over by another run ({who or 'unknown'}) while this one could not "
                    f"renew it for {self.seconds:g} s: this run stops writing there"
                )
                return
            except Exception:  # noqa: BLE001 (the store is down: the next renewal tries again)
                continue

    def release(self) -> None:
        """Stop renewing and delete the lease object if it is still ours. A store that fails now leaves it to
        run out (the next run waits a lease at most): a run that ended well does not fail for it."""
        import obstore

        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
            self._renewer = None
        if self.etag is None or self.lost:
            return
        try:
            found = self._read()
            if found is not None and found[0] == self.etag:  # (S3 has no conditional delete)
                obstore.delete(self.store, self.key)
        except Exception:  # noqa: BLE001, S110 (see above)
            pass
        self.etag = None
