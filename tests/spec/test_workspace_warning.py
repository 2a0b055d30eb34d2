"""#33: a task or script beside job.yaml reaches the pods only in an image that carries the workspace: `orch
render` and `orch submit` (without --build) say so when the job's image does not (orchestrator/imaging/workspace.py
image_problem; the workspace layer's tag names its content)."""

from __future__ import annotations

from orchestrator.imaging import workspace
from tests.fakes.cli import run_orch  # in process, as the console script runs: the warnings are on stderr

BASE = "registry.example/team/trainer:abc"


def test_render_and_submit_warn_when_the_image_does_not_carry_the_workspace_as_it_is(tmp_path):
    """The README's path: `orch build ...; orch render --set image=$REF`. The plain trainer image, a layer of
    older files, a digest: a warning with the fix; the layer orch build printed for these files: none."""
    root = tmp_path / "p"
    (root / "mypkg").mkdir(parents=True)
    (root / "mypkg" / "tasks.py").write_text("def make_task():\n    pass\n")
    (root / "job.yaml").write_text(
        f"name: demo\nimage: {BASE}\nresources: {{cpu: 1}}\ntrain: {{task: 'mypkg.tasks:make_task'}}\n"
    )
    job = str(root / "job.yaml")
    fix = ("build it first: REF=$(orch build --image registry.example/team/trainer --push) and render with --set "
           "image=$REF, or orch submit --build (workspace: false when the image installs the code itself; "
           "docs/images.md, Workspaces)")  # fmt: skip
    what = f"warning: train.task 'mypkg.tasks:make_task': the workspace {root.resolve()}"
    for command in (["render", job], ["submit", job, "--dry-run=client"]):
        plain = run_orch(*command)
        assert plain.returncode == 0, plain.stderr
        assert plain.stderr.splitlines() == [
            f"{what} is not in the image {BASE}: every pod would fail to find the code; {fix}"
        ]
    layer = f"registry.example/team/trainer:{workspace.tag(root, BASE)}"
    assert run_orch("render", job, "--set", f"image={layer}").stderr == ""
    (root / "mypkg" / "tasks.py").write_text("def make_task():\n    return 2\n")  # edited after orch build
    stale = run_orch("render", job, "--set", f"image={layer}")
    assert stale.stderr.splitlines() == [
        f"{what} is in the image {layer} as it was when that was built; its files have changed since; {fix}"
    ]
    digest = "registry.example/team/trainer@sha256:" + "a" * 64
    pinned = run_orch("render", job, "--set", f"image={digest}")
    assert "(orch cannot tell from a digest: name it by the tag orch build prints)" in pinned.stderr
    # --build makes the image, so submit says nothing; `workspace: false` says the image carries the code.
    built = run_orch("submit", job, "--build", "--build-context", str(root), "--build-tool", "buildah",
                     "--dry-run=client")  # fmt: skip
    assert built.returncode == 0 and "warning" not in built.stderr, built.stderr
    assert run_orch("render", job, "--set", "workspace=false").stderr == ""
