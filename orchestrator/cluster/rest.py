"""The Kubernetes API calls `Cluster` makes, as paths, sent through the official client's `ApiClient`.

The `ApiClient` still does everything that matters (kubeconfig auth, TLS, proxies, the connection pool). What is
left out are the generated API classes (`CoreV1Api`, `CustomObjectsApi`): importing one builds pydantic models
for every type its methods name, ~250 of them, which cost each orch command more CPU than everything else it
does (benchmarks section 10). orch reads raw JSON anyway (`_preload_content=False`), so it needs none of them.

Each method has the name and positional arguments of the generated method it replaces; keyword arguments are
the same query parameters in snake case (`label_selector`, `_continue`, `tail_lines`...). A non-2xx answer
raises `ApiException` as the generated methods do, so `Cluster`'s retries and translation are unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"


def _query_name(key: str) -> str:
    """label_selector -> labelSelector; _continue -> continue (a Python keyword in the generated client)."""
    head, *rest = key.lstrip("_").split("_")
    return head + "".join(part.capitalize() for part in rest)


def _query_value(value: Any) -> Any:
    return ("true" if value else "false") if isinstance(value, bool) else value


class Rest:
    def __init__(self, api_client: ApiClient) -> None:
        self.api_client = api_client

    def call(
        self, method: str, path: str, body: Any = None, *, content_type: str = JSON, **options: Any
    ) -> Any:
        """One request; the urllib3 response (unread), or ApiException for any answer but 2xx."""
        from kubernetes.client.exceptions import ApiException

        timeout = options.pop("_request_timeout", None)
        options.pop("_preload_content", None)  # always raw: the caller reads the JSON
        query = [(_query_name(k), _query_value(v)) for k, v in options.items() if v is not None]
        headers = {"Accept": JSON, **({"Content-Type": content_type} if body is not None else {})}
        request = self.api_client.param_serialize(
            method=method, resource_path=path, query_params=query, header_params=headers, body=body,
            auth_settings=["BearerToken"],
        )  # fmt: skip
        response = self.api_client.call_api(*request, _request_timeout=timeout)
        if not 200 <= response.status <= 299:
            response.read()  # type: ignore[no-untyped-call]  # kubernetes' RESTResponse is untyped
            raise ApiException.from_response(http_resp=response, body=None, data=None)
        return response.response


class CoreCalls(Rest):
    """What orch calls of the core API (`CoreV1Api`'s methods of the same names)."""

    def get_api_resources(self, **options: Any) -> Any:
        return self.call("GET", "/api/v1/", **options)

    def list_node(self, **options: Any) -> Any:
        return self.call("GET", "/api/v1/nodes", **options)

    def list_namespaced_pod(self, namespace: str, **options: Any) -> Any:
        return self.call("GET", f"/api/v1/namespaces/{namespace}/pods", **options)

    def read_namespaced_pod_log(self, name: str, namespace: str, **options: Any) -> Any:
        return self.call("GET", f"/api/v1/namespaces/{namespace}/pods/{name}/log", **options)

    def list_namespaced_event(self, namespace: str, **options: Any) -> Any:
        return self.call("GET", f"/api/v1/namespaces/{namespace}/events", **options)

    def list_namespaced_config_map(self, namespace: str, **options: Any) -> Any:
        return self.call("GET", f"/api/v1/namespaces/{namespace}/configmaps", **options)

    def create_namespaced_config_map(self, namespace: str, body: Any, **options: Any) -> Any:
        return self.call("POST", f"/api/v1/namespaces/{namespace}/configmaps", body, **options)

    def read_namespaced_config_map(self, name: str, namespace: str, **options: Any) -> Any:
        return self.call("GET", f"/api/v1/namespaces/{namespace}/configmaps/{name}", **options)

    def delete_namespaced_config_map(self, name: str, namespace: str, **options: Any) -> Any:
        return self.call("DELETE", f"/api/v1/namespaces/{namespace}/configmaps/{name}", **options)


class CustomCalls(Rest):
    """What orch calls of custom resources (`CustomObjectsApi`'s methods of the same names)."""

    def get_api_resources(self, group: str, version: str, **options: Any) -> Any:
        return self.call("GET", f"/apis/{group}/{version}", **options)

    def list_cluster_custom_object(self, group: str, version: str, plural: str, **options: Any) -> Any:
        return self.call("GET", f"/apis/{group}/{version}/{plural}", **options)

    def list_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, **options: Any
    ) -> Any:
        return self.call("GET", f"/apis/{group}/{version}/namespaces/{namespace}/{plural}", **options)

    def create_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, body: Any, **options: Any
    ) -> Any:
        return self.call("POST", f"/apis/{group}/{version}/namespaces/{namespace}/{plural}", body, **options)

    def get_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str, **options: Any
    ) -> Any:
        return self.call("GET", f"/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}", **options)

    def patch_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str, body: Any, **options: Any
    ) -> Any:
        path = f"/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}"
        return self.call("PATCH", path, body, content_type=MERGE_PATCH, **options)

    def delete_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str, **options: Any
    ) -> Any:
        path = f"/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}"
        return self.call("DELETE", path, **options)
