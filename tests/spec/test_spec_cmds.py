"""`orch init`, `orch validate`, `orch render` as a user runs them: in process through main(), as the console
script runs them (exit codes, stdout/stderr; tests/fakes/cli.py's run_orch). The console script's own process
contract is proven in tests/spec/test_bad_specs.py and test_hostile_input.py."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from orchestrator.job import loading
from orchestrator.rendering import render
from tests.fakes.cli import run_orch as orch
from tests.spec.manifest_checks import cluster_errors

EXAMPLES = Path(__file__).parents[2] / "examples"


def test_init_writes_a_commented_job_that_validates_and_renders(tmp_path):
    result = orch("init", "--name", "first-job", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "job.yaml").read_text()
    assert text.count("\n#") >= 5  # commented: it teaches the fields
    spec = loading.load_job(tmp_path / "job.yaml", require_image=True)
    assert spec.name == "first-job" and spec.train.task == "digits"
    assert all(cluster_errors(o) == [] for o in render.render(spec))
    # #33: the starter names an image version and requests, so nothing warns about what it wrote
    for command in ("validate", "render"):
        assert orch(command, "job.yaml", cwd=tmp_path).stderr == ""


def test_init_refuses_to_overwrite_without_force(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("mine\n")
    result = orch("init", str(job))
    assert (
        result.returncode == 2
        and result.stderr == f"error: {job} already exists; pass --force to overwrite it\n"
    )
    assert job.read_text() == "mine\n"
    assert orch("init", str(job), "--force").returncode == 0
    assert job.read_text() != "mine\n"


def test_init_with_a_bad_name_writes_nothing(tmp_path):
    result = orch("init", "--name", "Bad_Name", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("error: --name Bad_Name: name: 'Bad_Name' is not a valid job name")
    assert list(tmp_path.iterdir()) == []


def test_validate_summarises_the_batch_arithmetic():
    result = orch("validate", str(EXAMPLES / "gpt-multinode.yaml"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"OK {EXAMPLES / 'gpt-multinode.yaml'}: gpt-pretrain",
        "  nodes 4 x 8 processes = world size 32 (8 GPUs per node)",
        "  train: task gpt, batch 512 = micro 8 x world 32 x accumulation 2, bf16, ddp, max_steps 600000",
        "  restart: the whole job together on any failure, at most 10 times",
        "  image: ghcr.io/acme/orch-trainer:0.1.0-cuda12.8",
    ]


def test_validate_applies_overrides():
    result = orch("validate", str(EXAMPLES / "gpt-multinode.yaml"), "--set", "train.micro_batch_size=4")
    assert result.returncode == 0, result.stderr
    assert "batch 512 = micro 4 x world 32 x accumulation 4" in result.stdout


def test_render_prints_yaml_documents_and_json_list_of_the_same_objects():
    example = str(EXAMPLES / "gpt-multinode.yaml")
    expected = render.render(loading.load_job(example, ["nodes=2"]))
    as_yaml = orch("render", example, "--set", "nodes=2")
    as_json = orch("render", example, "--set", "nodes=2", "-o", "json")
    assert as_yaml.returncode == as_json.returncode == 0, as_yaml.stderr + as_json.stderr
    assert list(yaml.safe_load_all(as_yaml.stdout)) == expected
    assert json.loads(as_json.stdout) == {"apiVersion": "v1", "kind": "List", "items": expected}
    assert [o["kind"] for o in expected] == ["ConfigMap", "PyTorchJob", "PodMonitor"]
    assert expected[1]["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2


def test_render_says_the_api_warnings_on_stderr_as_submit_does_and_keeps_stdout_yaml():
    """`orch render | kubectl apply -f -` must stay clean, and what submit would warn about is said too."""
    example = str(EXAMPLES / "gpt-multinode.yaml")
    sets = ["nodes=2", "restart.policy=job"]  # a PyTorchJob's max_restarts means something else: a warning
    spec = loading.load_job(example, sets)
    expected = render.warnings(spec)
    assert any("max_restarts" in message for message in expected)
    result = orch("render", example, *(arg for value in sets for arg in ("--set", value)))
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [f"warning: {message}" for message in expected]
    assert list(yaml.safe_load_all(result.stdout)) == render.render(spec)


def test_validate_render_and_submit_say_the_same_warnings_of_an_unversioned_image_and_besteffort_pods(
    tmp_path,
):
    """#33: `image: NAME:latest` and no cpu/memory requests render and run, so each is one `warning:` line,
    the same at validate, render and a client dry run of submit (render.warnings, the one path); the exit
    code stays 0 and stdout stays what it was (YAML for kubectl)."""
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: demo\nimage: registry.example/trainer:latest\ntrain: {task: digits, batch_size: 64}\n"
    )
    said = {}
    for command in (["validate"], ["render"], ["submit", "--dry-run=client"]):
        result = orch(*command, str(job))
        assert result.returncode == 0, result.stderr
        said[command[0]] = result.stderr.splitlines()
        assert "warning" not in result.stdout
    assert said["validate"] == said["render"] == said["submit"]
    assert [line.split(" ", 3)[:3] for line in said["render"]] == [
        ["warning:", "image", "registry.example/trainer:latest"],
        ["warning:", "resources", "sets"],
    ]
    assert "are BestEffort" in said["render"][1] and "set resources: {cpu:" in said["render"][1]
    job.write_text(job.read_text().replace(":latest", ":1.0") + "resources: {cpu: 2}\n")
    assert all(
        orch(*c, str(job)).stderr == "" for c in (["validate"], ["render"], ["submit", "--dry-run=client"])
    )


def test_a_credential_in_plain_env_is_one_warning_naming_it_never_its_value(tmp_path):
    """#33: env values are written as they are into the job's objects. A credential-looking name with a literal
    value is one `warning:` line at validate, render and submit alike, naming the field and the fix
    (secret_env), never the value; names that only contain such a word (TOKENIZERS_PARALLELISM) are not."""
    secret = "s3cr3t-value-4242"
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: demo\nimage: registry.example/trainer:1.0\nresources: {cpu: 2}\n"
        "train: {task: digits, batch_size: 64}\n"
        f"env: {{TOKENIZERS_PARALLELISM: 'false', MAX_TOKENS: '8', AWS_SECRET_ACCESS_KEY: {secret}, "
        f"HF_TOKEN: {secret}}}\n"
    )
    said = {}
    for command in (["validate"], ["render"], ["submit", "--dry-run=client"]):
        result = orch(*command, str(job))
        assert result.returncode == 0, result.stderr
        said[command[0]] = result.stderr.splitlines()
        assert secret not in result.stderr
    assert said["validate"] == said["render"] == said["submit"]
    (line,) = said["render"]
    assert line.startswith("warning: env.AWS_SECRET_ACCESS_KEY, env.HF_TOKEN looks like a credential")
    assert "secret_env: {AWS_SECRET_ACCESS_KEY: {secret: NAME, key: KEY}}" in line
    assert "TOKENIZERS" not in line and "MAX_TOKENS" not in line
    job.write_text(
        job.read_text().replace(f", HF_TOKEN: {secret}", "").replace(f", AWS_SECRET_ACCESS_KEY: {secret}", "")
        + "secret_env: {HF_TOKEN: {secret: hf, key: token}}\n"
    )
    assert orch("render", str(job)).stderr == ""
