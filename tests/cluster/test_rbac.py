"""manifests/rbac.yaml grants every API call orch makes, and nothing orch does not use."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tests.fakes.emulator import CONFIGMAPS, JOBS

ROOT = Path(__file__).resolve().parents[2]
NS = "team-a"


def rbac_rules() -> set[tuple[str, str, str]]:
    role = next(
        d for d in yaml.safe_load_all((ROOT / "manifests" / "rbac.yaml").read_text()) if d["kind"] == "Role"
    )
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def rbac_attributes(request) -> tuple[str, str, str] | None:
    """The (apiGroup, resource, verb) the API server's authorizer checks for a request; None for discovery."""
    path = request.url.path.rstrip("/")
    match = re.fullmatch(r"/api/v1/namespaces/[^/]+/([^/]+)(?:/([^/]+))?(?:/([^/]+))?", path) or re.fullmatch(
        r"/apis/([^/]+)/[^/]+/namespaces/[^/]+/([^/]+)(?:/([^/]+))?(?:/([^/]+))?", path
    )
    if match is None:
        assert re.fullmatch(r"/api(/v1)?|/apis(/[^/]+){0,2}|/version", path), f"unexpected call {path}"
        return None
    if path.startswith("/api/"):
        group, (resource, name, sub) = "", match.groups()
    else:
        group, resource, name, sub = match.groups()
    verb = {"POST": "create", "DELETE": "delete", "PATCH": "patch", "PUT": "update"}.get(request.method.value)
    if verb is None:
        verb = "get" if name else ("watch" if request.params.get("watch") == "true" else "list")
    return group, f"{resource}/{sub}" if sub else resource, verb


def test_the_role_covers_every_call_and_only_those(env, job_file):
    kube = env.kube
    # A whole life: submit, status, list, logs, wait, replace, delete, and a submit that rolls back.
    assert env.orch("submit", str(job_file)).exit_code == 0
    kube.set_conditions(NS, "demo", ("Created", "True"), ("Running", "True"))
    master = kube.add_pod(NS, "demo", "master", 0)
    kube.write_log(NS, master, "hello")
    assert env.orch("status", "demo").exit_code == 0
    assert env.orch("list").exit_code == 0
    assert env.orch("logs", "demo").exit_code == 0
    kube.end_log(NS, master)
    kube.set_conditions(NS, "demo", ("Succeeded", "True"))
    assert env.orch("logs", "demo", "-f").exit_code == 0
    assert env.orch("wait", "demo").exit_code == 0
    assert env.orch("submit", str(job_file), "--replace").exit_code == 0
    assert env.orch("delete", "demo", "--wait").exit_code == 0
    kube.fail("post", "/apis/monitoring.coreos.com/v1/namespaces/team-a/podmonitors", 500, times=10)
    assert env.orch("submit", str(job_file)).exit_code == 1
    assert kube.names(JOBS) == [] and kube.names(CONFIGMAPS) == []

    used = {a for a in map(rbac_attributes, kube.requests()) if a is not None}
    granted = rbac_rules()
    assert used - granted == set(), "orch makes calls manifests/rbac.yaml does not allow"
    # everything granted is used, except what only admission plugins check (blockOwnerDeletion)
    assert granted - used == {("kubeflow.org", "pytorchjobs/finalizers", "update")}


def test_rolebinding_points_at_the_role():
    docs = list(yaml.safe_load_all((ROOT / "manifests" / "rbac.yaml").read_text()))
    role, binding = (next(d for d in docs if d["kind"] == k) for k in ("Role", "RoleBinding"))
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert "namespace" not in role["metadata"]  # applied with -n into the user's namespace
