"""The loader: positions, overrides and the one-line error format. The malformed-file corpus is in tests/spec/."""

from __future__ import annotations

import textwrap

import pytest

from orchestrator.errors import SpecError
from orchestrator.job.loading import load_job

JOB = textwrap.dedent(
    """\
    name: digits-ddp
    image: ghcr.io/acme/trainer:1.0
    nodes: 2
    resources: {cpu: 8, memory: 64Gi}
    train:
      task: digits
      batch_size: 256
      micro_batch_size: 32
      precision: bf16
      max_steps: 100
    env: {OMP_NUM_THREADS: 4}
    deadline: 1h30m
    """
)


@pytest.fixture
def job_file(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(JOB)
    return path


def error_of(path, overrides=(), **kwargs) -> str:
    with pytest.raises(SpecError) as raised:
        load_job(path, overrides, **kwargs)
    assert raised.value.exit_code == 2
    message = str(raised.value)
    assert "\n" not in message
    return message


def test_valid_job_resolves_defaults_and_derived_values(job_file):
    job = load_job(job_file)
    assert (job.nodes, job.procs_per_node, job.world_size) == (2, 1, 2)
    assert job.train.accumulation(job.world_size) == 4  # 256 / (32 x 2)
    assert job.resources.cpu == "8"  # numbers become Kubernetes quantity strings
    assert job.env == {"OMP_NUM_THREADS": "4"}
    assert job.deadline == 5400
    assert job.metrics.port == 9400 and job.metrics.enabled


def test_gpus_set_procs_per_node(job_file):
    job = load_job(job_file, ["gpus_per_node=4", "train.batch_size=512"])
    assert (job.procs_per_node, job.world_size, job.train.accumulation(job.world_size)) == (4, 8, 2)


def test_error_names_file_line_column_and_field(job_file):
    job_file.write_text(JOB.replace("precision: bf16", "precision: fp8"))
    assert error_of(job_file) == (
        f"{job_file}:9:3: train.precision: Input should be 'fp32', 'bf16' or 'fp16' (got 'fp8')"
    )


def test_unknown_key_gets_a_did_you_mean(job_file):
    job_file.write_text(JOB.replace("batch_size: 256", "batch_sise: 256"))
    assert (
        error_of(job_file) == f"{job_file}:7:3: train.batch_sise: unknown field; did you mean 'batch_size'?"
    )


def test_cross_field_rule_points_at_the_field(job_file):
    job_file.write_text(JOB.replace("batch_size: 256", "batch_size: 100"))
    message = error_of(job_file)
    assert message.startswith(f"{job_file}:8:3: train.micro_batch_size: batch_size 100 is not divisible")


def test_override_errors_name_the_flag(job_file):
    assert error_of(job_file, ["nodes=zero"]).startswith(
        "--set nodes=zero: nodes: Input should be a valid integer"
    )


def test_overrides_create_nested_fields(job_file):
    job = load_job(job_file, ["train.optimizer.lr=0.01", "labels.team=vision"])
    assert job.train.optimizer.lr == 0.01
    assert job.labels == {"team": "vision"}


def test_override_needs_key_and_value(job_file):
    assert "expected KEY=VALUE" in error_of(job_file, ["nodes"])


def test_image_is_required_only_when_asked(job_file):
    job_file.write_text(JOB.replace("image: ghcr.io/acme/trainer:1.0\n", ""))
    assert load_job(job_file).image is None
    # A missing field has no line of its own: the error points at the document's start.
    assert error_of(job_file, require_image=True) == (
        f"{job_file}:1:1: image: required to render or submit (the training image the pods run)"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "1:1: the file is empty"),
        ("name: a\nname: b\n", "2:1: invalid YAML: duplicate key 'name' (first defined on line 1)"),
        ("- a\n", "1:1: a job file is a mapping"),
        ("name: [a\n", "2:1: invalid YAML"),
    ],
)
def test_yaml_mistakes(tmp_path, text, expected):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    assert error_of(path).startswith(f"{path}:{expected}")


def test_missing_file(tmp_path):
    assert error_of(tmp_path / "nope.yaml").endswith("no such file; `orch init` writes a starter job.yaml")


# --- decisions read validated values (issue #25, class 5) -----------------------------------------------


@pytest.mark.parametrize("nodes", ['"3"', "3.0", "3"])
def test_the_restart_default_follows_the_validated_node_count(job_file, nodes):
    """`nodes: "3"` is 3 nodes: the whole job restarts (a lone pod cannot rejoin its peers)."""
    job_file.write_text(JOB.replace("nodes: 2", f"nodes: {nodes}").replace("256", "384"))
    spec = load_job(job_file)
    assert (spec.nodes, spec.restart.policy) == (3, "job")


@pytest.mark.parametrize("gpus", ['"2"', "2.0"])
def test_procs_per_node_follows_the_validated_gpu_count(job_file, gpus):
    job_file.write_text(JOB.replace("nodes: 2", f"nodes: 2\ngpus_per_node: {gpus}"))
    spec = load_job(job_file)
    assert (spec.gpus_per_node, spec.procs_per_node) == (2, 2)


def test_a_wrong_gpu_count_is_named_not_procs_per_node(job_file):
    job_file.write_text(JOB.replace("nodes: 2", 'nodes: 2\ngpus_per_node: "two"'))
    assert "gpus_per_node" in error_of(job_file) and "procs_per_node" not in error_of(job_file)


def test_an_explicit_restart_is_kept_and_refused_with_a_runtime(job_file):
    job_file.write_text(JOB + "restart: {}\n")
    assert load_job(job_file).restart.policy == "job"
    job_file.write_text(
        JOB + "api: trainjob\nruntime: torch\nmetrics: {enabled: false}\nrestart: {max_restarts: 1}\n"
    )
    assert "restart: with runtime:" in error_of(job_file)
