"""`output.url`: an object store instead of a volume. The pods get the URL (ORCH_OUTPUT_URL), no claim,
and the store's credentials as secretKeyRefs; bad URLs are one line at load time."""

from __future__ import annotations

import pytest

from orchestrator import naming
from orchestrator.errors import SpecError
from orchestrator.rendering import render
from tests.spec.conftest import load

MULTI = (
    "name: demo\nimage: example.com/trainer:1\nnodes: 4\ngpus_per_node: 8\n"
    "train: {task: digits, batch_size: 64}\nscheduling: {queue: q}\n"
    "output: {url: s3://bucket/runs/demo}\n"
    "env: {AWS_ENDPOINT_URL: 'https://minio.example.com'}\n"
    "secret_env:\n"
    "  AWS_ACCESS_KEY_ID: {secret: s3-credentials, key: access-key}\n"
    "  AWS_SECRET_ACCESS_KEY: {secret: s3-credentials, key: secret-key}\n"
)


def pods(found: dict) -> list[dict]:
    if "PyTorchJob" in found:
        return [r["template"]["spec"] for r in found["PyTorchJob"]["spec"]["pytorchReplicaSpecs"].values()]
    (rjob,) = found["TrainingRuntime"]["spec"]["template"]["spec"]["replicatedJobs"]
    return [rjob["template"]["spec"]["template"]["spec"]]


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
def test_an_object_store_output_needs_no_claim_and_carries_url_and_credentials(tmp_path, api):
    spec = load(MULTI, tmp_path)
    found = {o["kind"]: o for o in render.render(spec, api=api)}
    for pod in pods(found):
        assert not any("persistentVolumeClaim" in v for v in pod["volumes"])
        (container,) = pod["containers"]
        mount = next(m for m in container["volumeMounts"] if m["mountPath"] == naming.OUTPUT_DIR)
        assert "subPath" not in mount  # the local side is the pod's own emptyDir
        # TrainJob: the env rides on the TrainJob's trainer, which the torch plugin puts on the node container
        carried = found["TrainJob"]["spec"]["trainer"]["env"] if api == "trainjob" else container["env"]
        env = {e["name"]: e for e in carried}
        assert env["ORCH_OUTPUT_URL"]["value"] == "s3://bucket/runs/demo"
        assert env["AWS_ENDPOINT_URL"]["value"] == "https://minio.example.com"
        assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"] == {
            "secretKeyRef": {"name": "s3-credentials", "key": "secret-key"}
        }
    # 4 nodes restarted as new pods: the checkpoints are in the store, so nothing to warn about
    assert not [w for w in render.warnings(spec, api) if "starts from step 0" in w]


@pytest.mark.parametrize(
    ("output", "message"),
    [
        (
            "{url: ftp://host/x}",
            "output.url: scheme ftp:// is not supported (supported: s3://, gs://, az://)",
        ),
        ("{url: 's3:///x'}", "output.url: 's3:///x' names no bucket (s3://BUCKET/prefix)"),
        ("{url: s3://b/x, pvc: c}", "output: set exactly one of pvc (a volume) or url (an object store)"),
        (
            "{url: s3://b/x, sub_path: y}",
            "output.sub_path: applies to output.pvc; put the folder in output.url",
        ),
    ],
)
def test_bad_output_urls_are_one_line(tmp_path, output, message):
    with pytest.raises(SpecError) as caught:
        load(f"name: demo\nimage: i:1\ntrain: {{task: digits}}\noutput: {output}\n", tmp_path)
    assert message in str(caught.value) and "\n" not in str(caught.value).strip()


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
def test_orch_status_shows_the_output_url(tmp_path, api):
    from orchestrator import status
    from orchestrator.apis import by_key
    from orchestrator.commands import tables

    job_api = by_key(api)
    job = next(o for o in render.render(load(MULTI, tmp_path), api=api) if o["kind"] == job_api.resource.kind)
    lines = tables.format_status(status.job_status(job_api, job)).splitlines()
    assert "Output:      s3://bucket/runs/demo (checkpoints, model.pt, summary.json)" in lines


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (
            "s3://AKIAEXAMPLE:wJalrXUtnFEMIsecret@bucket/runs",
            "output.url: carries credentials (user:password@ "
            "before the bucket), which would be written into the job's objects and its run's records: give them to "
            "the pods as secret_env (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY; for orch run, the shell's environment)",
        ),
        ("s3://wJalrXUtnFEMIsecret@bucket/runs", "output.url: carries credentials"),
        (
            "s3://bucket/runs?X-Amz-Signature=wJalrXUtnFEMIsecret",
            "output.url: has a query string or fragment (? or "
            "#), where signed URLs and SAS tokens keep credentials: a prefix cannot hold one; give credentials to the "
            "pods as secret_env",
        ),
        ("az://container/runs#sig=wJalrXUtnFEMIsecret", "output.url: has a query string"),
    ],
)
def test_an_output_url_with_credentials_is_refused_without_showing_them(tmp_path, url, message):
    """#33: the URL would be the pods' ORCH_OUTPUT_URL, in the job object for anyone who may read it."""
    with pytest.raises(SpecError) as caught:
        load(f"name: demo\nimage: i:1\ntrain: {{task: digits}}\noutput: {{url: '{url}'}}\n", tmp_path)
    assert message in str(caught.value) and "wJalrXUtnFEMIsecret" not in str(caught.value)


def test_orch_run_out_refuses_a_url_with_credentials_in_one_line(tmp_path):
    from tests.fakes.cli import run_orch

    (tmp_path / "job.yaml").write_text("name: demo\ntrain: {task: synthetic, max_steps: 1}\n")
    result = run_orch("run", str(tmp_path / "job.yaml"), "--out", "s3://KEY:wJalrXUtnFEMIsecret@bucket/x")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "error: --out s3://KEY:***@bucket/x: carries credentials (user:password@ before the bucket), which would "
        "be written into the job's objects and its run's records: give them to the pods as secret_env "
        "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY; for orch run, the shell's environment)"
    ]
