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
AZURE_STORAGE_ACCOUNT_KEY for az://. In a pod they come from `secret_env`. An `http://` endpoint is allowed
(object_store refuses plain HTTP unless told). ORCH_STORAGE_RETRY_SECONDS bounds how long one request is
retried (default 180 s) before the run fails.

Imports nothing heavy at module level: `orch render` and the spec's validation use `url_problem`.
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

SCHEMES = ("s3", "gs", "az")
"""Object stores orch writes to (each is one obstore backend; `s3` covers S3-compatible stores)."""
RETRY_SECONDS = "ORCH_STORAGE_RETRY_SECONDS"
DEFAULT_RETRY_SECONDS = 180.0
URL = re.compile(r"^(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*)://(?P<bucket>[^/]*)(?P<prefix>/.*)?$")


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
    if not match["bucket"]:
        return f"{text!r} names no bucket ({scheme}://BUCKET/prefix)"
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
    """Write and delete a probe object under `url`: a missing bucket, bad credentials or an unreachable
    endpoint fail here, at start, as one StorageError line, not at the first checkpoint."""
    root = location(url)
    probe = root / ".orch-write-check"
    try:
        probe.write_bytes(b"orch\n")
        probe.fs.rm(probe.path)
    except Exception as error:  # obstore's errors carry the whole HTTP exchange: keep its first line
        raise StorageError(f"cannot write to {url}: {describe(error)}") from error


def describe(error: BaseException) -> str:
    """One phrase for an object-store failure (obstore's messages run to dozens of lines)."""
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
    if "Connection refused" in text or "error sending request" in text or "tcp connect" in text:
        return "the store cannot be reached (connection refused)"
    if "Missing" in text and ("credential" in text.lower() or "region" in text.lower()):
        return "no credentials (set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, in a pod through secret_env)"
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return first[:200]


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

    def retry_config() -> dict[str, Any]:
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

    for scheme in SCHEMES:

        class OrchStore(FsspecStore):
            protocol = scheme
            cachable = False  # a new instance reads the environment again (rotated keys, another endpoint)

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                kwargs.setdefault("retry_config", retry_config())
                if os.environ.get("AWS_ENDPOINT_URL", "").startswith("http://"):
                    kwargs.setdefault("client_options", {"allow_http": True})
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
