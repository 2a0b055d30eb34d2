"""The cluster's errors: every failed request becomes one of these (chained `from` the client's exception)."""

from __future__ import annotations

from orchestrator.errors import OrchError

RBAC_HINT = "manifests/rbac.yaml has a Role with what orch needs; ask a cluster admin to bind it to you"


class ClusterError(OrchError):
    """The cluster refused or failed a request (exit 1)."""


class KubeconfigError(ClusterError):
    """No usable kubeconfig or context: nothing was sent (exit 2, like a usage error)."""

    exit_code = 2


class ClusterUnreachable(ClusterError):
    """The API server could not be reached (after retries)."""


class Forbidden(ClusterError):
    """401/403: the credentials were rejected or lack a permission."""


class Unauthorized(Forbidden):
    """401: the credentials were rejected (whatever the request: no other API will do better)."""


class AdmissionDenied(ClusterError):
    """An admission webhook (the Trainer's, Kueue's, ...) refused the request; its message says why."""


class UnknownFields(ClusterError):
    """The server's schema of the kind has no such field (fieldValidation=Strict): an older CRD version."""

    def __init__(self, message: str, *, fields: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.fields = fields


class NotFound(ClusterError):
    pass


class AlreadyExists(ClusterError):
    pass


class OperatorNotInstalled(ClusterError):
    """The API server serves none of the job APIs orch can submit to (or not the one asked for)."""


class Interrupted(ClusterError):
    """Ctrl-C or a signal ended a command midway (after it cleaned up); exit 128 + the signal number."""

    def __init__(self, message: str, *, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


class Expired(ClusterError):
    """410 Gone: the resourceVersion (of a watch, or a list's continue token) is older than the server keeps;
    list again."""
