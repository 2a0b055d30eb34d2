"""`train.parallel: fsdp` end to end through `orch run`: the same mathematics as DDP at any world size,
memory divided by the world size, resume at a different world size in both modes, the gpt example.

Real processes, real gloo, real fully_shard and torch.distributed.checkpoint; tiny models, few steps.

The uninterrupted runs (`world_sizes`: DDP at 1, 2 and 4 processes, FSDP at 2 and 4) are made once per
module and read by every test that compares against them (docs/testing.md, "Shared training runs"): the
equivalence, the resumes at another world size, async checkpoints, compile and the uneven evaluation.
"""

from __future__ import annotations

import shutil

import pytest

from tests.trainer.conftest import Run, assert_same_params, job, orch_run, write_job

pytestmark = pytest.mark.slow

# 4 classes and a hidden layer of 64: every weight's first dimension divides by 4 ranks, so the shards
# are even and the memory ratio is exact. SGD with momentum: an optimizer state as big as the model.
# 65 eval samples: on 2 ranks rank 0 has 9 batches, rank 1 has 8 (test_evaluation_with_uneven_shards...).
TASK_ARGS = {"samples": 256, "eval_samples": 65, "kind": "classification", "classes": 4, "hidden": 64}
OPTIMIZER = {"name": "sgd", "lr": 0.05, "momentum": 0.9}
# 12 steps, a checkpoint every 4 (all kept; FSDP's written in the background): the resumes start from them.
TRAIN = {"max_steps": 12, "log_every": 4}
WORLD_SIZES = [("ddp", 1), ("ddp", 2), ("ddp", 4), ("fsdp", 2), ("fsdp", 4)]


def spec(name: str, parallel: str, **train) -> dict:
    train = {"task_args": TASK_ARGS, **train}
    return job(name, precision="fp32", parallel=parallel, optimizer=OPTIMIZER, batch_size=16,
               micro_batch_size=4, **train)  # fmt: skip


def checkpoints(parallel: str) -> dict:
    return {"every_steps": 4, "keep": 5, "async": parallel == "fsdp"}


@pytest.fixture(scope="module")
def world_sizes(tmp_path_factory):
    """world_sizes(mode, procs) -> the uninterrupted 12-step run of that mode and world size (made once)."""
    runs: dict[tuple[str, int], Run] = {}

    def run_for(mode: str, procs: int) -> Run:
        if (mode, procs) not in runs:
            tmp = tmp_path_factory.mktemp(f"{mode}{procs}")
            job_file = write_job(tmp, spec(f"{mode}{procs}", mode, **TRAIN, checkpoint=checkpoints(mode)))
            run = orch_run(job_file, tmp / "out", "--procs", str(procs))
            assert run.returncode == 0, run.stderr
            runs[mode, procs] = run
        return runs[mode, procs]

    return run_for


def test_equivalence_across_world_sizes_and_accumulation(world_sizes):
    """fp32: 1 x accumulation 4, 2 x 2 and 4 x 1 see the same 16 samples per step: same weights.
    (Moved here from test_run.py to read the same runs as the FSDP comparison.)"""
    runs = {procs: world_sizes("ddp", procs) for procs in (1, 2, 4)}
    for procs, run in runs.items():
        assert (run.summary["world_size"], run.summary["accumulation"]) == (procs, 4 // procs)
    one = runs[1].state_dict()
    # Different reduction orders (micro-batch sums vs all-reduce) differ in the last bits only.
    assert_same_params(one, runs[2].state_dict(), rtol=1e-5, atol=1e-6)
    assert_same_params(one, runs[4].state_dict(), rtol=1e-5, atol=1e-6)
    # ... a tolerance that notices far less than the last optimizer steps: steps 9..12 move the weights.
    from orchestrator.trainer import checkpoint

    step8 = checkpoint.read_model_state(runs[1].out / "checkpoints" / "step-00000008")
    with pytest.raises(AssertionError):
        assert_same_params(one, step8, rtol=1e-5, atol=1e-6)


def test_fsdp_equals_ddp_across_world_sizes_and_shards_the_memory(world_sizes):
    """fp32, the same 16 samples per step: 1 DDP process == 2 and 4 FSDP processes == 4 DDP processes."""
    runs = {key: world_sizes(*key) for key in [("ddp", 1), ("fsdp", 2), ("fsdp", 4), ("ddp", 4)]}
    for (mode, procs), run in runs.items():
        assert (run.summary["parallel"], run.summary["world_size"]) == (mode, procs)
    one = runs["ddp", 1].state_dict()
    for key in [("fsdp", 2), ("fsdp", 4), ("ddp", 4)]:
        # model.pt is the full model whatever the mode (gathered to rank 0 under FSDP)
        assert_same_params(one, runs[key].state_dict(), rtol=1e-5, atol=1e-6)

    # Memory per rank, measured from the tensors each rank holds: FSDP at 4 ranks holds a quarter.
    ddp, fsdp = runs["ddp", 4].summary["memory"], runs["fsdp", 4].summary["memory"]
    params = (16 * 64 + 64 + 64 * 4 + 4) * 4  # fp32 bytes of the whole model
    assert ddp["parameter_bytes"] == ddp["gradient_bytes"] == ddp["optimizer_bytes"] == params
    assert fsdp["parameter_bytes"] == fsdp["gradient_bytes"] == fsdp["optimizer_bytes"] == params // 4
    assert runs["fsdp", 2].summary["memory"]["parameter_bytes"] == params // 2


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_resume_at_a_different_world_size(world_sizes, tmp_path, parallel):
    """Saved by 4 ranks, resumed by 2; saved by those 2, resumed by 1: the uninterrupted run's weights."""
    four = world_sizes(parallel, 4)

    def resume_from(checkpoint_dir, procs: int, name: str) -> Run:
        out = tmp_path / name
        (out / "checkpoints").mkdir(parents=True)
        shutil.copytree(checkpoint_dir, out / "checkpoints" / checkpoint_dir.name)
        job_file = write_job(tmp_path, spec(name, parallel, **TRAIN, checkpoint=checkpoints(parallel)))
        run = orch_run(job_file, out, "--procs", str(procs))
        assert run.returncode == 0, run.stderr
        return run

    two = resume_from(four.out / "checkpoints" / "step-00000004", 2, "two")
    assert two.summary["resumed_from_step"] == 4 and f"resumed from {two.out}" in two.stdout
    one = resume_from(two.out / "checkpoints" / "step-00000008", 1, "one")
    assert one.summary["resumed_from_step"] == 8
    assert_same_params(four.state_dict(), two.state_dict(), rtol=1e-5, atol=1e-6)
    assert_same_params(four.state_dict(), one.state_dict(), rtol=1e-5, atol=1e-6)


# The gpt example under FSDP (each holds about half the model) is checked where the examples run:
# tests/trainer/test_run.py::test_each_local_example_runs[gpt-fsdp].


def test_async_checkpoints_land_complete_and_resume(world_sizes, tmp_path):
    from orchestrator.trainer import checkpoint

    run = world_sizes("fsdp", 2)  # checkpoints written in the background
    directory = run.out / "checkpoints"
    assert sorted(p.name for p in directory.iterdir()) == ["step-00000004", "step-00000008", "step-00000012"]
    assert all(checkpoint.verify(p) is None for p in directory.iterdir())
    out = tmp_path / "resumed"
    (out / "checkpoints").mkdir(parents=True)
    shutil.copytree(directory / "step-00000008", out / "checkpoints" / "step-00000008")
    job_file = write_job(tmp_path, spec("async", "fsdp", **TRAIN, checkpoint=checkpoints("fsdp")))
    resumed = orch_run(job_file, out, "--procs", "2")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.summary["resumed_from_step"] == 8
    assert_same_params(run.state_dict(), resumed.state_dict())


def test_compile_per_unit_keeps_names_and_mathematics(world_sizes, run_job):
    """compile: true under FSDP compiles each unit in place: model.pt keeps the plain names, and the
    weights match the eager run's at the same step (Inductor may reorder float operations: a tolerance)."""
    from orchestrator.trainer import checkpoint

    compiled = run_job(spec("compiled", "fsdp", max_steps=4, compile=True), "--procs", "2")
    assert compiled.returncode == 0, compiled.stderr
    assert set(compiled.state_dict()) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    eager = checkpoint.read_model_state(world_sizes("fsdp", 2).out / "checkpoints" / "step-00000004")
    assert_same_params(eager, compiled.state_dict(), rtol=1e-5, atol=1e-6)


def test_a_full_disk_during_a_checkpoint_is_one_line_and_leaves_no_tmp(run_job, tiny_disk):
    """#12 through `orch run`: a real tmpfs of 256 KiB; the model's checkpoint does not fit."""
    directory = tiny_disk / "ck"
    big = {**TASK_ARGS, "hidden": 4096}  # ~ 350 KB of parameters, as much again of momentum
    run = run_job(
        spec("full", "fsdp", task_args=big, max_steps=8, checkpoint={"every_steps": 4, "dir": str(directory)}),
        "--procs", "2",
    )  # fmt: skip
    assert run.returncode == 1
    last = run.stderr.strip().splitlines()[-1]
    assert "CheckpointError: checkpoint at step 4: could not write " in last
    assert f"{directory}: no space left on device; free space there" in last
    assert list(directory.iterdir()) == []  # no .tmp left behind


def test_evaluation_with_uneven_shards_matches_ddp(world_sizes):
    """65 eval samples on 2 ranks: rank 0 has 9 batches, rank 1 has 8. Under FSDP every forward is
    collective, so rank 1 repeats a batch (discarded); the result is DDP's."""
    ddp, fsdp = world_sizes("ddp", 2).summary["eval"], world_sizes("fsdp", 2).summary["eval"]
    assert fsdp["accuracy"] == ddp["accuracy"]
    assert fsdp["loss"] == pytest.approx(ddp["loss"], rel=1e-5)
