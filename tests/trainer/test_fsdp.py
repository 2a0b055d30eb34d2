"""`train.parallel: fsdp` end to end through `orch run`: the same mathematics as DDP at any world size,
memory divided by the world size, resume at a different world size in both modes, the gpt example.

Real processes, real gloo, real fully_shard and torch.distributed.checkpoint; tiny models, few steps.
"""

from __future__ import annotations

import shutil

import pytest

from tests.trainer.conftest import REPO, assert_same_params, job, orch_run

pytestmark = pytest.mark.slow

# 4 classes and a hidden layer of 64: every weight's first dimension divides by 4 ranks, so the shards
# are even and the memory ratio is exact. SGD with momentum: an optimizer state as big as the model.
TASK_ARGS = {"samples": 256, "eval_samples": 64, "kind": "classification", "classes": 4, "hidden": 64}
OPTIMIZER = {"name": "sgd", "lr": 0.05, "momentum": 0.9}


def spec(name: str, parallel: str, **train) -> dict:
    train = {"task_args": TASK_ARGS, **train}
    return job(name, precision="fp32", parallel=parallel, optimizer=OPTIMIZER, batch_size=16,
               micro_batch_size=4, **train)  # fmt: skip


def test_fsdp_equals_ddp_across_world_sizes_and_shards_the_memory(run_job):
    """fp32, the same 16 samples per step: 1 DDP process == 2 and 4 FSDP processes == 4 DDP processes."""
    runs = {
        (mode, procs): run_job(spec(f"{mode}{procs}", mode, max_steps=8), "--procs", str(procs))
        for mode, procs in [("ddp", 1), ("fsdp", 2), ("fsdp", 4), ("ddp", 4)]
    }
    for (mode, procs), run in runs.items():
        assert run.returncode == 0, run.stderr
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
def test_resume_at_a_different_world_size(run_job, tmp_path, parallel):
    """Saved by 4 ranks, resumed by 2; saved by those 2, resumed by 1: the uninterrupted run's weights."""
    train = {"max_steps": 12, "log_every": 4, "checkpoint": {"every_steps": 4, "keep": 5}}
    four = run_job(spec("four", parallel, **train), "--procs", "4")
    assert four.returncode == 0, four.stderr

    def resume_from(checkpoint_dir, procs: int, name: str):
        out = tmp_path / name
        (out / "checkpoints").mkdir(parents=True)
        shutil.copytree(checkpoint_dir, out / "checkpoints" / checkpoint_dir.name)
        run = run_job(spec(name, parallel, **train), "--procs", str(procs), out=out)
        assert run.returncode == 0, run.stderr
        return run

    two = resume_from(four.out / "checkpoints" / "step-00000004", 2, "two")
    assert two.summary["resumed_from_step"] == 4 and f"resumed from {two.out}" in two.stdout
    one = resume_from(two.out / "checkpoints" / "step-00000008", 1, "one")
    assert one.summary["resumed_from_step"] == 8
    assert_same_params(four.state_dict(), two.state_dict(), rtol=1e-5, atol=1e-6)
    assert_same_params(four.state_dict(), one.state_dict(), rtol=1e-5, atol=1e-6)


def test_the_gpt_example_trains_with_fsdp(tmp_path):
    run = orch_run(REPO / "examples" / "gpt.yaml", tmp_path / "out", "--set", "train.parallel=fsdp",
                   "--steps", "3")  # fmt: skip
    assert run.returncode == 0, run.stderr
    summary = run.summary
    assert (summary["parallel"], summary["steps"], summary["precision"]) == ("fsdp", 3, "bf16")
    assert summary["final_loss"] is not None and summary["tokens_per_second"] > 0
    # the blocks and the root are sharded over the 2 processes: each holds about half the model
    whole = sum(t.numel() * t.element_size() for t in run.state_dict().values()) - (
        run.state_dict()["head.weight"].numel() * 4  # tied to tokens.weight: held once
    )
    assert 0.45 * whole <= summary["memory"]["parameter_bytes"] <= 0.55 * whole


def test_async_checkpoints_land_complete_and_resume(run_job, tmp_path):
    from orchestrator.trainer import checkpoint

    train = {"max_steps": 12, "checkpoint": {"every_steps": 4, "keep": 5, "async": True}}
    run = run_job(spec("async", "fsdp", **train), "--procs", "2")
    assert run.returncode == 0, run.stderr
    directory = run.out / "checkpoints"
    assert sorted(p.name for p in directory.iterdir()) == ["step-00000004", "step-00000008", "step-00000012"]
    assert all(checkpoint.verify(p) is None for p in directory.iterdir())
    out = tmp_path / "resumed"
    (out / "checkpoints").mkdir(parents=True)
    shutil.copytree(directory / "step-00000008", out / "checkpoints" / "step-00000008")
    resumed = run_job(spec("async", "fsdp", **train), "--procs", "2", out=out)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.summary["resumed_from_step"] == 8
    assert_same_params(run.state_dict(), resumed.state_dict())


def test_compile_per_unit_keeps_names_and_mathematics(run_job):
    """compile: true under FSDP compiles each unit in place: model.pt keeps the plain names, and the
    weights match the eager run's (Inductor may reorder float operations: a tolerance, not equality)."""
    runs = {
        compiled: run_job(
            spec(f"compile-{str(compiled).lower()}", "fsdp", max_steps=4, compile=compiled), "--procs", "2"
        )
        for compiled in (False, True)
    }
    for run in runs.values():
        assert run.returncode == 0, run.stderr
    assert set(runs[True].state_dict()) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert_same_params(runs[False].state_dict(), runs[True].state_dict(), rtol=1e-5, atol=1e-6)


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


def test_evaluation_with_uneven_shards_matches_ddp(run_job):
    """65 eval samples on 2 ranks: rank 0 has 9 batches, rank 1 has 8. Under FSDP every forward is
    collective, so rank 1 repeats a batch (discarded); the result is DDP's."""
    args = {**TASK_ARGS, "eval_samples": 65}
    runs = {mode: run_job(spec(f"eval-{mode}", mode, task_args=args, max_steps=4), "--procs", "2")
            for mode in ("ddp", "fsdp")}  # fmt: skip
    for run in runs.values():
        assert run.returncode == 0, run.stderr
    ddp, fsdp = runs["ddp"].summary["eval"], runs["fsdp"].summary["eval"]
    assert fsdp["accuracy"] == ddp["accuracy"]
    assert fsdp["loss"] == pytest.approx(ddp["loss"], rel=1e-5)
