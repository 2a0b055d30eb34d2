"""`output.url`: an object store instead of a volume. The pods get the URL (ORCH_OUTPUT_URL), no claim,
and the store's credentials as secretKeyRefs; bad URLs are one line at load time."""

from __future__ import annotations

import json

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


TRAVERSAL = (
    "has a . or .. segment: object-store keys are not paths (.. goes up nowhere, and obstore refuses it)"
)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("s3://bkt/run/../other", f"'s3://bkt/run/../other' {TRAVERSAL}"),
        ("s3://../etc/run", f"'s3://../etc/run' {TRAVERSAL}"),
        ("s3://bkt/./run", f"'s3://bkt/./run' {TRAVERSAL}"),
        ("gs://bkt/%2E%2e/run", f"'gs://bkt/%2E%2e/run' {TRAVERSAL}"),  # decoded by some tools: refused too
        ("s3://bkt/run//x", "'s3://bkt/run//x' has an empty segment (//): object stores refuse such keys"),
        ("s3://bkt/run\tx", "has a control character (a newline, a tab, ESC): a key cannot hold one"),
        (
            "s3://127.0.0.1:9000/bkt/run",
            "'127.0.0.1:9000' is not a bucket name: a store's address goes in "
            "AWS_ENDPOINT_URL=http://127.0.0.1:9000, not in the URL",
        ),
    ],
)
@pytest.mark.parametrize("field", ["output.url", "train.checkpoint.dir"])
def test_a_store_url_that_is_not_one_prefix_is_refused_at_load_time(tmp_path, url, problem, field):
    """#33: obstore refuses `.`, `..` and empty segments only at the first write (in the pods, after the
    job was created); a tab would reach every line that names the URL."""
    quoted = json.dumps(url)  # a YAML double-quoted string: "\n" is a newline
    place = f"output: {{url: {quoted}}}" if field == "output.url" else ""
    checkpoint = f", checkpoint: {{dir: {quoted}}}" if field == "train.checkpoint.dir" else ""
    with pytest.raises(SpecError) as caught:
        load(f"name: demo\nimage: i:1\ntrain: {{task: digits{checkpoint}}}\n{place}\n", tmp_path)
    assert f"{field}: {problem}" in str(caught.value)
    assert "\n" not in str(caught.value).strip()


def test_a_checkpoint_dir_url_stays_a_url_and_its_credentials_are_refused(tmp_path):
    """#33: train.checkpoint.dir was normalised as a local path: `s3://bkt/ckpt` became the folder `s3:/bkt/ckpt`
    under the output directory, and a URL's credentials went into train.json (the job's ConfigMap)."""
    from pathlib import Path

    from orchestrator.trainer.main import checkpoint_dir

    spec = load(
        "name: demo\nimage: i:1\ntrain: {task: digits, checkpoint: {dir: 's3://bkt/ckpt/'}}\n", tmp_path
    )
    assert spec.train.checkpoint.dir == "s3://bkt/ckpt"
    assert str(checkpoint_dir(Path("/out"), spec.train.checkpoint.dir)) == "s3://bkt/ckpt"
    with pytest.raises(SpecError) as caught:
        load("name: demo\nimage: i:1\ntrain: {task: digits, checkpoint: {dir: 's3://AKIA:wJalrSECRET@bkt/c'}}\n",
             tmp_path)  # fmt: skip
    assert "train.checkpoint.dir: carries credentials" in str(caught.value)
    assert "wJalrSECRET" not in str(caught.value)


def test_orch_run_out_refuses_a_traversing_url_in_one_line(tmp_path):
    from tests.fakes.cli import run_orch

    (tmp_path / "job.yaml").write_text("name: demo\ntrain: {task: synthetic, max_steps: 1}\n")
    result = run_orch("run", str(tmp_path / "job.yaml"), "--out", "s3://bkt/runs/../../x", cwd=tmp_path)
    assert (result.returncode, result.stderr.splitlines()) == (2, [f"error: --out s3://bkt/runs/../../x: "
                                                                     f"'s3://bkt/runs/../../x' {TRAVERSAL}: write the prefix without it"])  # fmt: skip
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),  # AWS's own endpoint
        ({"AWS_ENDPOINT_URL": "http://127.0.0.1:9000/"}, ("http://127.0.0.1:9000", "AWS_ENDPOINT_URL")),
        (  # the AWS SDKs' and CLI's S3-only variable wins, as there (object_store reads only the other)
            {"AWS_ENDPOINT_URL": "http://a:1", "AWS_ENDPOINT_URL_S3": "http://b:2"},
            ("http://b:2", "AWS_ENDPOINT_URL_S3"),
        ),
        ({"AWS_ENDPOINT_URL": "http://minio:pass@m:9000"}, ("http://minio:***@m:9000", "AWS_ENDPOINT_URL")),
    ],
)
def test_the_endpoint_and_where_it_came_from(monkeypatch, env, expected):
    from orchestrator import storage

    for name in storage.S3_ENDPOINT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert storage.endpoint("s3") == expected


def test_an_endpoint_with_credentials_is_refused_without_showing_them(tmp_path):
    """#33: obstore's errors repeat the endpoint whole (`Error performing PUT http://user:pass@host/...`), so a
    password in AWS_ENDPOINT_URL reached every failed upload's traceback; S3 signs with the access keys anyway.
    Refused before any request (none leaves: the probe is not reached)."""
    from tests.fakes.cli import run_orch

    (tmp_path / "job.yaml").write_text("name: demo\ntrain: {task: synthetic, max_steps: 1}\n")
    env = {"AWS_ENDPOINT_URL": "http://minio:wJalrSECRET@127.0.0.1:9", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL_S3": None}  # fmt: skip
    result = run_orch("run", str(tmp_path / "job.yaml"), "--out", "s3://bkt/run", cwd=tmp_path, env=env)
    assert (result.returncode, result.stderr.splitlines()) == (2, [
        "error: AWS_ENDPOINT_URL carries credentials (user:password@ in http://minio:***@127.0.0.1:9): the "
        "store's requests are signed with AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY; give the endpoint without them"
    ])  # fmt: skip
