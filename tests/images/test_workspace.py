"""Workspaces (#24.1): which folder, which files go in, the content tag, the layer's Dockerfile, and the
warning for code the job names that neither the image nor the workspace has. Real files in tmp_path; the
builds themselves are in test_workspace_image.py (buildah)."""

from __future__ import annotations

import os
import re
import shutil
import stat
from pathlib import Path

import pytest

from orchestrator.errors import UsageError
from orchestrator.imaging import workspace
from orchestrator.job import loading
from tests.fakes.cli import run_orch  # in process, as the console script runs: the warnings are on stderr

BASE = "registry.example/team/trainer:abc"


def project(root: Path, job: str = "train: {task: 'mypkg.tasks:make_task'}\n") -> Path:
    """A user's folder: job.yaml, a package with the task, and what must never ship."""
    (root / "mypkg").mkdir(parents=True)
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "mypkg" / "tasks.py").write_text("def make_task():\n    pass\n")
    (root / "job.yaml").write_text(f"name: demo\nimage: {BASE}\nresources: {{cpu: 1}}\n{job}")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / ".venv" / "bin").mkdir(parents=True)
    (root / ".venv" / "pyvenv.cfg").write_text("home = /usr\n")
    (root / "env2").mkdir()  # a venv under another name
    (root / "env2" / "pyvenv.cfg").write_text("home = /usr\n")
    (root / "runs" / "demo-1").mkdir(parents=True)
    (root / "runs" / "demo-1" / "summary.json").write_text("{}")
    (root / "out").mkdir()  # `orch run --out out`
    (root / "out" / "run.json").write_text("{}")
    (root / "out" / "model.pt").write_text("weights")
    (root / "mypkg" / "__pycache__").mkdir()
    (root / "mypkg" / "__pycache__" / "tasks.cpython-311.pyc").write_text("")
    return root


def spec_of(root: Path):
    return loading.load_job(root / "job.yaml")


def test_the_files_that_go_in_leave_out_git_venvs_and_run_outputs(tmp_path):
    root = project(tmp_path / "p")
    assert workspace.files(root) == ["job.yaml", "mypkg/__init__.py", "mypkg/tasks.py"]


def test_orchignore_wins_over_dockerignore_and_cannot_bring_back_git(tmp_path):
    root = project(tmp_path / "p")
    (root / "data.bin").write_text("big")
    (root / ".dockerignore").write_text("mypkg\n")
    assert "mypkg/tasks.py" not in workspace.files(root)
    (root / ".orchignore").write_text("*.bin\n!.git\n")
    assert workspace.files(root) == [".dockerignore", ".orchignore", "job.yaml", "mypkg/__init__.py",
                                     "mypkg/tasks.py"]  # fmt: skip


def test_the_default_workspace_is_the_job_folder_only_when_it_holds_the_code(tmp_path):
    root = project(tmp_path / "p")
    assert workspace.resolve(spec_of(root), root / "job.yaml") == root.resolve()
    shutil.rmtree(root / "mypkg")
    assert workspace.resolve(spec_of(root), root / "job.yaml") is None
    builtin = project(tmp_path / "b", job="train: {task: digits}\n")
    assert workspace.resolve(spec_of(builtin), builtin / "job.yaml") is None  # the image has digits
    named = project(tmp_path / "n", job="workspace: mypkg\ntrain: {task: digits}\n")
    assert workspace.resolve(spec_of(named), named / "job.yaml") == (named / "mypkg").resolve()
    off = project(tmp_path / "o", job="workspace: false\ntrain: {task: 'mypkg.tasks:make_task'}\n")
    assert workspace.resolve(spec_of(off), off / "job.yaml") is None


@pytest.mark.parametrize(
    ("command", "reference"),
    [
        ("[python, train.py, --lr, '1']", ("command", "train.py", None, "train.py")),
        ("[python3, -m, mypkg.train]", ("command", "mypkg.train", "mypkg.train", None)),
        ("[bash, scripts/run.sh]", ("command", "scripts/run.sh", None, "scripts/run.sh")),
        ("[./train]", ("command", "./train", None, "./train")),
        ("[/usr/bin/env, echo]", None),
    ],
)
def test_scripts_and_modules_a_command_names(tmp_path, command, reference):
    (tmp_path / "job.yaml").write_text(f"name: demo\ncommand: {command}\n")
    found = workspace.references(loading.load_job(tmp_path / "job.yaml"))
    assert [(r.field, r.name, r.module, r.path) for r in found] == ([reference] if reference else [])


def test_the_tag_is_the_files_and_the_base_not_timestamps_or_the_folder(tmp_path):
    root = project(tmp_path / "p")
    first = workspace.tag(root, BASE)
    assert re.fullmatch(r"workspace-[0-9a-f]{12}-[0-9a-f]{8}", first)
    assert first.split("-")[1] == workspace.content_digest(root)  # the part `orch render` compares
    copy = tmp_path / "elsewhere"
    shutil.copytree(root, copy, symlinks=True)  # another checkout of the same files
    os.utime(copy / "mypkg" / "tasks.py", (0, 0))
    (copy / "mypkg" / "tasks.py").chmod(0o600)  # not part of the layer: it holds 0644 either way
    (copy / "runs" / "demo-2").mkdir()  # outputs do not count
    (copy / "runs" / "demo-2" / "x").write_text("y")
    (copy / ".env").write_text("TOKEN=abc\n")  # nor a secret left out
    assert workspace.tag(copy, BASE) == first
    other_base = workspace.tag(root, BASE.replace("abc", "def"))
    assert other_base != first and other_base.split("-")[1] == first.split("-")[1]  # the same files
    seen = {first}
    for change in (
        lambda: (copy / "mypkg" / "tasks.py").write_text("def make_task():\n    return 1\n"),  # a byte
        lambda: (copy / "mypkg" / "tasks.py").chmod(0o700),  # executable now
        lambda: (copy / "mypkg" / "tasks.py").rename(copy / "mypkg" / "task.py"),  # renamed
        lambda: (copy / "mypkg" / "link").symlink_to("task.py"),  # a symlink added
        lambda: ((copy / "mypkg" / "link").unlink(), (copy / "mypkg" / "link").symlink_to("__init__.py")),
    ):
        change()
        changed = workspace.tag(copy, BASE)
        assert changed not in seen
        seen.add(changed)


def test_the_layer_dockerfile_installs_requirements_only_when_there_are_some():
    plain = workspace.dockerfile(BASE, requirements=False)
    assert plain.splitlines()[1:] == [
        f"FROM {BASE}",
        "COPY --chown=10001:0 . /orch/workspace/",
        "ENV PYTHONPATH=/orch/workspace",
        "WORKDIR /orch/workspace",
    ]
    with_requirements = workspace.dockerfile(BASE, requirements=True)
    assert "-r /orch/workspace/requirements.txt" in with_requirements
    assert "--constraint /tmp/keep-base.txt" in with_requirements  # the base's torch is kept, not reinstalled
    assert with_requirements.splitlines()[-2:] == [
        "ENV PYTHONPATH=/orch/workspace",
        "WORKDIR /orch/workspace",
    ]


@pytest.mark.parametrize("command", ["validate", "render"])
def test_validate_and_render_warn_about_code_neither_the_image_nor_the_workspace_has(tmp_path, command):
    root = project(tmp_path / "p")
    carrying = f"image=registry.example/team/trainer:{workspace.tag(root, BASE)}"  # what orch build printed
    found = run_orch(command, str(root / "job.yaml"), *(["--set", carrying] if command == "render" else []))
    assert "warning" not in found.stderr
    if command == "validate":
        assert f"  workspace: {root.resolve()} (3 files; orch submit --build ships them over the image)" in (
            found.stdout.splitlines()
        )
    shutil.rmtree(root / "mypkg")
    result = run_orch(command, str(root / "job.yaml"))
    assert result.returncode == 0
    assert result.stderr.splitlines() == [
        "warning: train.task 'mypkg.tasks:make_task': module mypkg.tasks is neither in the image's orchestrator "
        f"package nor in a workspace (none: {root.resolve()} does not hold it): the pods cannot find it unless "
        "the image installs it; put it in the workspace (docs/images.md, Workspaces) and submit with --build"
    ]


def test_a_script_outside_the_named_workspace_is_warned_about(tmp_path):
    root = project(tmp_path / "p", job="workspace: mypkg\n")
    (root / "job.yaml").write_text(
        f"name: demo\nimage: {BASE}\nresources: {{cpu: 1}}\nworkspace: mypkg\ncommand: [python, train.py]\n"
    )
    (root / "train.py").write_text("print(1)\n")  # beside job.yaml, but the workspace is mypkg/
    result = run_orch("validate", str(root / "job.yaml"))
    assert result.returncode == 0
    assert result.stderr.splitlines() == [
        f"warning: command 'train.py': script train.py is neither in the image's orchestrator package nor in "
        f"the workspace {(root / 'mypkg').resolve()}: the pods cannot find it unless the image installs it; put "
        "it in the workspace (docs/images.md, Workspaces) and submit with --build"
    ]


# --- what never goes in by default: secrets, links out, special files; the limits; odd names -------------------

SECRETS = [  # one of each kind docs/images.md lists, where users keep them
    ".env", ".env.production", "config/prod.env", ".envrc", ".aws/credentials", ".azure/accessTokens.json",
    ".config/gcloud/application_default_credentials.json", "gcp-credentials.json", "client_secret_123.json",
    "deploy/service-account.json", "keys/id_rsa", "keys/id_ed25519.pub", ".ssh/known_hosts", "tls/server.key",
    "tls/server.pem", "tls/client.p12", "tls/client.pfx", ".kube/config", "kubeconfig.yaml", "prod.kubeconfig",
    ".netrc", ".npmrc", ".pypirc", ".git-credentials", ".docker/config.json", "mypkg/.env",
]  # fmt: skip
# Named like anything else, found by what their first bytes hold.
KEY_CONTENT = {
    "notes/deploy.txt": "ssh key for the box:\n-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn...\n",
    "mypkg/settings.ini": "[default]\naws_access_key_id = AKIAEXAMPLE\n"
    "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEYab\n",
    "sa-4f2a.json": '{"type": "service_account", "project_id": "p", "private_key": "..."}',
}


def with_secrets(root: Path) -> Path:
    for path in SECRETS:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("secret\n")
    for path, text in KEY_CONTENT.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    # code that only names a key is code: it stays in
    (root / "mypkg" / "store.py").write_text("import os\nkey = dict(aws_secret_access_key=os.environ['K'])\n")
    return root


def test_secrets_are_left_out_by_default_and_one_line_says_which_and_how_to_ship_one(tmp_path):
    root = with_secrets(project(tmp_path / "p"))
    selection = workspace.select(root)
    assert selection.files == ["job.yaml", "mypkg/__init__.py", "mypkg/store.py", "mypkg/tasks.py"]
    assert sorted(e.path for e in selection.left_out) == sorted([*SECRETS, *KEY_CONTENT])
    (line,) = selection.notes()
    assert line.startswith(f"workspace {root}: left out {len(SECRETS) + len(KEY_CONTENT)} files that look like "
                           "credentials: .aws/credentials, ")  # fmt: skip
    assert line.endswith(" more (to ship one on purpose, add a line `!PATH` naming it to .orchignore)")
    clean = project(tmp_path / "clean")
    shutil.copy(root / "mypkg" / "store.py", clean / "mypkg")
    assert workspace.tag(root, BASE) == workspace.tag(clean, BASE)  # the secrets are not hashed either


def test_a_secret_goes_in_only_when_the_ignore_file_names_it_not_its_folder(tmp_path):
    root = with_secrets(project(tmp_path / "p"))
    (root / ".env.example").write_text("TOKEN=\n")
    (root / ".orchignore").write_text(
        "# an allowlist\n*\n!job.yaml\n!mypkg\n!tls\n!tls/server.pem\n!**/.env.example\n!.aws\n"
    )
    kept = workspace.files(root)
    assert "mypkg/.env" not in kept and "mypkg/settings.ini" not in kept  # `!mypkg` does not name them
    assert "tls/server.key" not in kept  # nor does `!tls`
    assert {"tls/server.pem", ".env.example", ".aws/credentials"} <= set(kept)  # named, or its secret folder


def test_symlinks_that_point_outside_the_workspace_are_left_out_and_said(tmp_path):
    root = project(tmp_path / "p")
    outside = tmp_path / "outside.txt"
    outside.write_text("not the workspace's\n")
    (root / "data").mkdir()
    (root / "data" / "inside.txt").write_text("x\n")
    links = {
        "data/ok": "inside.txt",  # relative, inside: a symlink in the layer too
        "data/dir": ".",  # a folder link inside: not followed, shipped as a link
        "data/up": "../../outside.txt",
        "data/abs-out": str(outside),
        "data/abs-in": str(root / "data" / "inside.txt"),  # inside, but would dangle in the image
        "data/hop": "up",  # inside, to a link that leaves
        "data/dangling": "missing.txt",
    }
    for name, target in links.items():
        (root / name).symlink_to(target)
    selection = workspace.select(root)
    assert [f for f in selection.files if f.startswith("data/")] == ["data/dangling", "data/dir", "data/inside.txt",
                                                                    "data/ok"]  # fmt: skip
    (line,) = selection.notes()
    assert line == (
        f"workspace {root}: left out 4 symlinks that point outside the workspace: data/abs-in -> "
        f"{root}/data/inside.txt, data/abs-out -> {outside}, data/hop -> up, data/up -> ../../outside.txt (copy what "
        "they point to into the workspace, or point them inside it with a relative target)"
    )


def test_a_fifo_is_left_out_not_read(tmp_path):
    root = project(tmp_path / "p")
    os.mkfifo(root / "pipe")  # reading it would block the tag forever
    selection = workspace.select(root)
    assert "pipe" not in selection.files and [e.why for e in selection.left_out] == ["special"]
    assert workspace.tag(root, BASE)


def test_files_over_the_limits_are_refused_with_one_line(tmp_path):
    root = project(tmp_path / "p")
    with open(root / "weights.bin", "wb") as handle:  # sparse: no disk used
        handle.truncate(workspace.MAX_FILE_BYTES + 1)
    result = run_orch("submit", str(root / "job.yaml"), "--build", "--build-context", str(root), "--build-tool",
                      "buildah", "--dry-run=client")  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"error: workspace {root.resolve()}: weights.bin is 100.0 MiB, over the layer's 100.0 MiB limit for one file: "
        "leave it out in .orchignore and read it from the object store or a volume (docs/images.md, Workspaces)"
    ]
    (root / "weights.bin").unlink()
    for i in range(11):
        with open(root / f"shard-{i}.bin", "wb") as handle:
            handle.truncate(workspace.MAX_FILE_BYTES)
    with pytest.raises(UsageError, match=r"14 files, 1100\.0 MiB, over the layer's 1024\.0 MiB limit"):
        workspace.plan_layer(root, BASE, "registry.example/team/trainer")


def test_odd_file_names_go_in_and_hash_and_print_as_one_line(tmp_path):
    root = project(tmp_path / "p")
    odd = ["with space.py", "new\nline.py", "ünïcödé.py", "-rf", "--help.txt", "a,b.txt"]
    for name in odd:
        (root / "mypkg" / name).write_text("x = 1\n")
    raw = os.fsencode(root / "mypkg") + b"/latin1-\xe9.py"  # not UTF-8
    with open(raw, "wb") as handle:
        handle.write(b"x = 2\n")
    kept = workspace.files(root)
    assert {f"mypkg/{n}" for n in odd} <= set(kept)
    assert "mypkg/latin1-\udce9.py" in kept
    first = workspace.tag(root, BASE)
    (root / "mypkg" / "new\nline.py").rename(root / "mypkg" / "new line.py")
    assert workspace.tag(root, BASE) != first
    (root / "mypkg" / "new line.py").symlink_to  # noqa: B018 (names only)
    os.symlink("/etc/hostname", root / "mypkg" / "evil\nname")
    (line,) = workspace.select(root).notes()
    assert "\n" not in line and "'mypkg/evil\\nname' -> /etc/hostname" in line


def test_the_staged_context_holds_exactly_what_the_tag_hashed(tmp_path):
    root = project(tmp_path / "p")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o4775)  # setuid, group write: neither reaches the layer
    (root / "mypkg" / "tasks.py").chmod(0o600)
    (root / "mypkg" / "link").symlink_to("tasks.py")
    selection = workspace.select(root)
    context = tmp_path / "context"
    workspace._stage(root, selection.files, context)
    staged = {str(p.relative_to(context)): p.lstat() for p in context.rglob("*")}
    assert {k: stat.S_IMODE(v.st_mode) for k, v in staged.items() if not stat.S_ISLNK(v.st_mode)} == {
        "job.yaml": 0o644, "run.sh": 0o755, "mypkg": 0o755, "mypkg/__init__.py": 0o644, "mypkg/tasks.py": 0o644,
    }  # fmt: skip
    assert os.readlink(context / "mypkg" / "link") == "tasks.py"
    assert {v.st_mtime for v in staged.values()} == {0}
    assert workspace.content_digest(context) == workspace.content_digest(root)


@pytest.mark.parametrize(
    ("ignore", "expected"),
    [
        ("mypkg/\n", ["job.yaml"]),  # a trailing / is a folder's name (Docker cleans it away)
        ("**/*.py\n!mypkg/tasks.py\n", ["job.yaml", "mypkg/tasks.py"]),
        ("*\n!mypkg/**\n", ["mypkg/__init__.py", "mypkg/tasks.py"]),
        ("MyPkg\n", ["job.yaml", "mypkg/__init__.py", "mypkg/tasks.py"]),  # case counts, as in Docker
        ("# job.yaml\n #job.yaml\n", ["job.yaml", "mypkg/__init__.py", "mypkg/tasks.py"]),
        ("/job.yaml\n./mypkg/../mypkg/__init__.py\n", ["mypkg/tasks.py"]),
    ],
)
def test_orchignore_follows_dockers_rules(tmp_path, ignore, expected):
    root = project(tmp_path / "p")
    (root / ".orchignore").write_text(".orchignore\n" + ignore)
    assert workspace.files(root) == expected


def test_a_bad_ignore_pattern_is_one_line_naming_the_file_and_line(tmp_path):
    root = project(tmp_path / "p")
    (root / ".orchignore").write_text("*.bin\ndata[\n")
    result = run_orch("validate", str(root / "job.yaml"))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"error: workspace {root.resolve()}/.orchignore:2: bad pattern 'data[': a [class] that is unclosed, empty, "
        "or starts or ends a range with - or ] (docs/images.md, Workspaces: the rules are Docker's)"
    ]
