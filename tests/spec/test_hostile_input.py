"""Careless and hostile input (issue #12): each case ends in exit 2 and one `error:` line, no traceback.

The cases are generated per class (size and shape, restricted strings, numbers, reserved paths, --set and
init mistakes, secrets). The size-and-shape class runs the real `orch` console script in a subprocess under a
memory limit (RLIMIT_AS) and a timeout, so an alias bomb or an endless file fails the test instead of the
machine, and so the process-level contract (exit status 2, nothing on stdout, one stderr line, no traceback) is
proven on the real process. The other classes are about the message, so they run `orch` in process through
main() (tests/fakes/cli.py's run_orch: the same error line and exit code, an escaping exception fails the test),
a fraction of a Python start each. The restricted-string class is also checked on the loader for more control
characters, against values proven valid without them.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.errors import SpecError
from orchestrator.job import loading
from tests.fakes.cli import run_orch

ORCH = Path(sys.executable).with_name("orch")
MEMORY_LIMIT = 1 << 30  # bytes of address space per case: a bomb that expands dies here, not the machine
TIMEOUT = 120  # seconds; a safety bound for endless input, not a measurement
BASE = {"name": "digits", "image": "ghcr.io/acme/trainer:1.0", "train": {"task": "digits"}}


def limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def orch_process(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The real console script in a process of its own, memory-limited: for input that could exhaust memory."""
    return subprocess.run(
        [str(ORCH), *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=cwd,
        preexec_fn=limited,
    )


def assert_one_error_line(result: subprocess.CompletedProcess[str], *expected: str) -> str:
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert (result.returncode, result.stdout) == (2, ""), result.stderr[-3000:]
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: "), line
    for text in expected:
        assert text in line, line
    return line


def job(**fields: object) -> str:
    """BASE with `fields` merged in (dotted keys go into nested mappings), as YAML."""
    data = json.loads(json.dumps(BASE))
    for dotted, value in fields.items():
        *parents, last = dotted.split("__")
        target = data
        for part in parents:
            target = target.setdefault(part, {})
        target[last] = value
    return yaml.safe_dump(data, allow_unicode=False)


# --- size and shape: bounded before anything is built ----------------------------------------------------


def alias_bomb() -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]  # 10^9 values
    return "\n".join(lines) + "\nname: digits\n"


def alias_depth_chain() -> str:
    """Each anchor is 10 levels deep and nests the previous one: 100 levels once expanded."""
    lines = ["l0: &l0 x"]
    for i in range(1, 11):
        lines.append(f"l{i}: &l{i} " + "[" * 10 + f"*l{i - 1}" + "]" * 10)
    return "\n".join(lines) + "\n"


SHAPE = {
    "alias-bomb": (alias_bomb(), f"{loading.MAX_VALUES} values"),
    "alias-depth": (alias_depth_chain(), f"{loading.MAX_DEPTH} levels"),
    "recursive-alias": (
        "name: digits\ntask_args: &a {again: *a}\n",
        "alias refers to a node that contains it",
    ),
    "deep-flow": ("name: " + "[" * 5000 + "]" * 5000 + "\n", f"{loading.MAX_DEPTH} levels"),
    "deep-block": (
        "name:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 200)),
        f"{loading.MAX_DEPTH} levels",
    ),
    "int-5000-digits": ("name: digits\nnodes: " + "9" * 5000 + "\n", "int64"),
    "int-past-int64": (job(nodes=2**63), "int64"),
    "huge-file": ("name: digits\n" + "# padding\n" * 30_000, f"{loading.MAX_FILE_BYTES // 1024} KiB"),
}


@pytest.mark.parametrize("case", SHAPE, ids=list(SHAPE))
def test_size_and_shape_end_in_one_line_naming_the_bound(case, tmp_path):
    text, bound = SHAPE[case]
    path = tmp_path / "job.yaml"
    path.write_text(text)
    assert_one_error_line(orch_process("validate", str(path)), str(path), bound)


def test_an_endless_file_is_read_only_up_to_the_bound():
    assert_one_error_line(orch_process("validate", "/dev/zero"), f"{loading.MAX_FILE_BYTES // 1024} KiB")


# --- restricted strings: full match, so a trailing newline or control character is refused -------------

# (field, a valid value): the generator appends control characters to the value.
RESTRICTED = {
    "name": "digits",
    "namespace": "ml",
    "image": "ghcr.io/acme/trainer:1.0",
    "labels__team": "vision",
    "node_selector__pool": "gpu",
    "env__OMP_NUM_THREADS": None,  # the key is the restricted string: see restricted_job
    "resources__memory": "64Gi",
    "resources__cpu": "500m",
    "resources__shm": "8Gi",
    "volumes": "/data",
    "secret_env__TOKEN__key": "token",
    "secret_env__TOKEN__secret": "hf-token",
    "train__task": "gpt",
    "train__checkpoint__dir": "ckpt",
    "output__sub_path": "runs",
    "scheduling__queue": "team-a",
    "scheduling__priority_class": "high",
    "service_account": "trainer",
    "metrics__release": "kube-prometheus-stack",
    "tolerations": "nvidia.com/gpu",
    "annotations": "example.com/owner",
}


def restricted_job(field: str, value: str) -> str:
    """A job whose `field` holds `value` (a valid job when `value` is the RESTRICTED one)."""
    if field == "env__OMP_NUM_THREADS":
        return job(env={f"OMP_NUM_THREADS{value}": "4"})
    if field == "volumes":
        return job(volumes=[{"name": "data", "mount": value, "pvc": "datasets"}])
    if field == "tolerations":
        return job(tolerations=[{"key": value, "operator": "Exists", "effect": "NoSchedule"}])
    if field == "annotations":
        return job(annotations={value: "me"})
    if field == "secret_env__TOKEN__key":
        return job(secret_env={"TOKEN": {"secret": "hf-token", "key": value}})
    if field == "secret_env__TOKEN__secret":
        return job(secret_env={"TOKEN": {"secret": value, "key": "token"}})
    if field == "output__sub_path":
        return job(output={"pvc": "results", "sub_path": value})
    return job(**{field: value})


def valid_value(field: str) -> str:
    return RESTRICTED[field] or ""


@pytest.mark.parametrize("field", RESTRICTED)
def test_restricted_string_is_valid_without_the_control_character(field, tmp_path):
    """The baseline: each generated case differs from a valid job only by the appended character."""
    path = tmp_path / "job.yaml"
    path.write_text(restricted_job(field, valid_value(field)))
    loading.load_job(path)


@pytest.mark.parametrize("suffix", ["\n", "\r", "\t", "\x1b", "\x7f", " "], ids=repr)
@pytest.mark.parametrize("field", RESTRICTED)
def test_restricted_string_with_a_control_character_is_refused(field, suffix, tmp_path):
    if field in ("output__sub_path", "train__checkpoint__dir", "volumes") and suffix == " ":
        pytest.skip("a space is a valid character of a path")
    path = tmp_path / "job.yaml"
    path.write_text(restricted_job(field, valid_value(field) + suffix))
    with pytest.raises(SpecError) as caught:
        loading.load_job(path)
    assert "\n" not in str(caught.value).replace("\\n", "")


@pytest.mark.parametrize("field", RESTRICTED)
def test_trailing_newline_ends_in_one_line(field, tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(restricted_job(field, valid_value(field) + "\n"))
    assert_one_error_line(run_orch("validate", str(path)), str(path))


# --- numbers: Kubernetes' int32/int64 and finite floats ----------------------------------------------------

NUMBERS = {
    "lr-inf": (job(train={"task": "digits", "optimizer": {"lr": float("inf")}}), "finite"),
    "lr-nan": ("name: digits\nimage: i:1\ntrain: {task: digits, optimizer: {lr: .nan}}\n", "finite"),
    "float-overflow": ("name: digits\nimage: i:1\ntrain: {task: digits, grad_clip: 1.0e+400}\n", "finite"),
    "backoff-1e20": (job(restart={"backoff_limit": 1e20}), "int64"),
    "backoff-int": (job(restart={"backoff_limit": 10**20}), "int64"),
    "max-restarts-int32": (job(restart={"max_restarts": 2**31}), "2147483647"),
    "nodes-int32": (job(nodes=2**31), "2147483647"),
    "toleration-1e23": (
        job(tolerations=[{"operator": "Exists", "toleration_seconds": 1e23}]),
        "int64",
    ),
    "toleration-past-int64": (
        job(tolerations=[{"operator": "Exists", "toleration_seconds": 2.0**63}]),
        "int64",
    ),
    "deadline-past-int64": (job(deadline="100000000000000000000s"), "68 years"),
    "deadline-seconds": (job(deadline=2**40), "68 years"),
    "seed-32-bit": (job(train={"task": "digits", "seed": 2**32}), "4294967295"),
}


@pytest.mark.parametrize("case", NUMBERS, ids=list(NUMBERS))
def test_out_of_range_numbers_end_in_one_line(case, tmp_path):
    text, bound = NUMBERS[case]
    path = tmp_path / "job.yaml"
    path.write_text(text)
    assert_one_error_line(run_orch("validate", str(path)), bound)


# --- reserved mount paths, compared in normal form -------------------------------------------------------

RESERVED = ["/dev/shm/", "/etc/orch/", "/orch/output//", "/dev/./shm", "//etc/orch", "/orch/x/../output"]


@pytest.mark.parametrize("mount", RESERVED)
def test_reserved_mount_paths_are_found_however_written(mount, tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(job(volumes=[{"name": "v", "mount": mount, "empty_dir": True}]))
    assert_one_error_line(run_orch("validate", str(path)), "is reserved by orch")


def test_mount_paths_render_in_normal_form(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(job(volumes=[{"name": "v", "mount": "/data//sets/./", "empty_dir": True}]))
    assert loading.load_job(path).volumes[0].mount == "/data/sets"


# --- --set and orch init -----------------------------------------------------------------------------------

OVERRIDES = {
    "index-past-the-end": (["--set", "volumes.3.name=x"], "index 3 does not exist"),
    "index-of-a-missing-list": (["--set", "tolerations.0.key=x"], "tolerations"),
    "word-as-index": (["--set", "volumes.first.name=x"], "'first' is not an index"),
    "into-a-scalar": (["--set", "name.first=x"], "name is not a mapping"),
    "bounded-value": (["--set", "nodes=" + "9" * 5000], "int64"),
}


@pytest.mark.parametrize("case", OVERRIDES, ids=list(OVERRIDES))
def test_bad_overrides_end_in_one_line(case, tmp_path):
    args, expected = OVERRIDES[case]
    path = tmp_path / "job.yaml"
    path.write_text(job(volumes=[{"name": "v", "mount": "/data", "empty_dir": True}]))
    assert_one_error_line(run_orch("validate", str(path), *args), expected)


def test_set_indexes_a_list(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(job(volumes=[{"name": "v", "mount": "/data", "empty_dir": True}]))
    spec = loading.load_job(path, ["volumes.0.read_only=true", "volumes.0.mount=/other/"])
    assert (spec.volumes[0].read_only, spec.volumes[0].mount) == (True, "/other")


def test_init_into_a_missing_directory(tmp_path):
    assert_one_error_line(run_orch("init", "missing/job.yaml", cwd=tmp_path), "does not exist")
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("name", ["x\nimage: evil", "ok\nnodes: 9", "a: b", "yes", "#x", "'x", "x\n"])
def test_init_name_is_data_not_text(name, tmp_path):
    """A newline in --name cannot add keys: the file reads back with exactly the name given, or nothing is
    written and the error names the flag."""
    result = run_orch("init", "--name", name, cwd=tmp_path)
    written = tmp_path / "job.yaml"
    if result.returncode == 0:
        assert yaml.safe_load(written.read_text())["name"] == name
    else:
        assert_one_error_line(result, "--name")
        assert not written.exists()
    if written.exists():
        assert set(yaml.safe_load(written.read_text())) == {
            "name",
            "image",
            "nodes",
            "gpus_per_node",
            "resources",
            "train",
        }


# --- secrets never appear in an error --------------------------------------------------------------------

SECRET = "hunter2-s3cret-value"


def test_secret_in_the_wrong_place_is_not_echoed(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(job(secret_env={"TOKEN": SECRET}))
    line = assert_one_error_line(run_orch("validate", str(path)), "secret_env.TOKEN")
    assert SECRET not in line


def test_secret_given_by_set_is_not_echoed(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(job())
    line = assert_one_error_line(run_orch("validate", str(path), "--set", f"secret_env.TOKEN={SECRET}"))
    assert SECRET not in line and "secret_env.TOKEN" in line


# --- second round (issue #25): shapes of the new features' inputs -----------------------------------------

TRAINJOB_RUNTIME = {"api": "trainjob", "runtime": "torch-distributed", "metrics": {"enabled": False}}

# (case) -> (job fields, words the one error line must hold)
SECOND_ROUND = {
    # class 1: pod_overrides and affinity have the shape of the Kubernetes objects they override
    "overrides-int-container": (
        {"pod_overrides": {"containers": [5]}},
        "pod_overrides.containers[0]: must be an object",
    ),
    "overrides-int-container-runtime": (
        {**TRAINJOB_RUNTIME, "pod_overrides": {"containers": [5]}},
        "pod_overrides.containers[0]",
    ),
    "overrides-null-container": ({"pod_overrides": {"containers": [None]}}, "cannot be null"),
    "overrides-nested-list": ({"pod_overrides": {"containers": [[{}]]}}, "pod_overrides.containers[0]"),
    "overrides-list-name": (
        {"pod_overrides": {"containers": [{"name": ["a"]}]}},
        "pod_overrides.containers[0].name: must be a string",
    ),
    "overrides-map-name-runtime": (
        {**TRAINJOB_RUNTIME, "pod_overrides": {"volumes": [{"name": {"a": 1}}]}},
        "pod_overrides.volumes[0].name",
    ),
    "overrides-scalar-for-list": ({"pod_overrides": {"tolerations": "all"}}, "must be a list"),
    "overrides-no-name": ({"pod_overrides": {"containers": [{"image": "x:1"}]}}, "needs a name"),
    "overrides-unknown-field": ({"pod_overrides": {"hostNetwrk": True}}, "did you mean 'hostNetwork'"),
    "overrides-string-int": (
        {"pod_overrides": {"terminationGracePeriodSeconds": "30"}},
        "must be an integer",
    ),
    "affinity-wrong-shape": ({"affinity": {"nodeAffinity": [1]}}, "affinity.nodeAffinity"),
    # class 3: no control character but tab and newline in any string
    "nul-in-env": ({"env": {"A": "a\x00b"}}, "env.A: holds the control character U+0000"),
    "esc-in-command": ({"train": None, "command": ["python", "\x1b[2J"]}, "command[1]"),
    "cr-in-experiment": (
        {"tracking": {"mlflow": {"tracking_uri": "http://mlflow:5000", "experiment": "a\rb"}}},
        "tracking.mlflow.experiment: holds the control character U+000D",
    ),
    "nul-in-task-args-key": ({"train": {"task": "digits", "task_args": {"k\x00": 1}}}, "U+0000"),
    "c1-in-annotation": ({"annotations": {"example.com/a": "x\x9by"}}, "U+009B"),
    # class 4: a credential never reaches an annotation or a printed line
    "uri-with-password": (
        {"tracking": {"mlflow": {"tracking_uri": "http://bob:hunter22@mlflow:5000"}}},
        "tracking.mlflow.tracking_uri: holds a credential",
    ),
    # class 5: a field the chosen scheduler cannot carry
    "volcano-with-kueue-priority": (
        {"scheduling": {"scheduler": "volcano", "queue": "q", "priority": "high"}},
        "scheduling.priority",
    ),
    "volcano-with-topology": (
        {"scheduling": {"scheduler": "volcano", "queue": "q", "topology": {"required": "rack"}}},
        "scheduling.topology",
    ),
}


@pytest.mark.parametrize("case", SECOND_ROUND, ids=list(SECOND_ROUND))
def test_second_round_shapes_end_in_one_line(case, tmp_path):
    fields, expected = SECOND_ROUND[case]
    data = {**json.loads(json.dumps(BASE)), **fields}
    data = {key: value for key, value in data.items() if value is not None}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=False))
    for command in ("validate", "render"):
        line = assert_one_error_line(run_orch(command, str(path)), str(path), expected)
        assert "hunter22" not in line


# class 2: the loader builds JSON-compatible data only (render -o json and train.json cannot crash)
HEAD = "name: digits\nimage: ghcr.io/acme/trainer:1.0\n"
YAML_TAGS = {
    "binary": ("train: {task: digits, task_args: {blob: !!binary aGVsbG8=}}\n", "!!binary", ":3:"),
    "set": ("train: {task: digits}\npod_overrides: {nodeSelector: !!set {a, b}}\n", "!!set", ":4:"),
    "timestamp": ("train: {task: digits}\naffinity: {x: !!timestamp 2024-01-01}\n", "!!timestamp", ":4:"),
    "omap": ("train: {task: digits, task_args: !!omap [a: 1]}\n", "!!omap", ":3:"),
    "custom": ("train: {task: digits, task_args: {a: !secret x}}\n", "!secret", ":3:"),
}


@pytest.mark.parametrize("case", YAML_TAGS, ids=list(YAML_TAGS))
def test_yaml_values_without_a_json_form_are_refused_at_their_position(case, tmp_path):
    text, tag, line = YAML_TAGS[case]
    path = tmp_path / "job.yaml"
    path.write_text(HEAD + text)
    assert_one_error_line(run_orch("render", "-o", "json", str(path)), f"{path}{line}", tag, "no JSON form")


def test_a_plain_date_is_the_string_it_reads_as(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(
        job(train={"task": "digits", "task_args": {"since": "DATE"}}).replace("DATE", "2024-01-01")
    )
    assert "2024-01-01" in path.read_text() and "'2024-01-01'" not in path.read_text()
    assert loading.load_job(path).train.task_args == {"since": "2024-01-01"}
    result = run_orch("render", "-o", "json", str(path))
    assert result.returncode == 0, result.stderr
    assert '\\"since\\": \\"2024-01-01\\"' in result.stdout


def test_a_python_dict_with_a_date_is_refused_naming_the_field():
    import datetime

    with pytest.raises(SpecError, match=r"train\.task_args\.since: a date has no JSON form"):
        loading.validate(
            {**BASE, "train": {"task": "digits", "task_args": {"since": datetime.date(2024, 1, 1)}}},
            file="job",
            positions={},
        )


# #20: two input crashes; --set takes the list index form that errors print
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--set", "volumes[0].name=x"], "volumes is a list of 0 items; index 0 does not exist"),
        (["--set", "volumes.0.name=x"], "volumes is a list of 0 items; index 0 does not exist"),
        (["--set", "a[b]=1"], "unknown field"),
        (["--set", 'env.A="a\\0b"'], "U+0000"),
        (["--set", "tracking.mlflow.tracking_uri=http://bob:hunter22@h"], "tracking_uri=http://bob:***@h"),
    ],
)
def test_set_on_a_missing_list_or_an_odd_key_ends_in_one_line(args, expected, tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(job())
    assert_one_error_line(run_orch("validate", str(path), *args), expected)


def test_a_key_that_looks_like_an_index_is_named_in_the_error(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(job() + "volumes[0]: 3\n")
    assert_one_error_line(run_orch("validate", str(path)), "unknown field; did you mean 'volumes'")
