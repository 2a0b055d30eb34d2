"""Trainer overhead, exporter overhead, gradient accumulation and `orch run` start-up, on CPU (2 processes).

Every loop trains `benchmarks.workload:timed` (the same model, data, global batch, accumulation and
precision) under the same launcher, and every loop is timed by the same clock (see workload.py). Runs
alternate (round 1: bare, orch, ...; round 2: the same again) so that a busy minute on a shared machine
hits every loop alike; each figure is the median over rounds of each run's median step time, and each
ratio the median of the per-round ratios.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.harness import BenchError, ms, ratio, table

WORLD = 2
WARMUP_STEPS = 5
TURN_STEPS = 10  # optimizer steps a loop runs before handing the turn on (see workload.py)
PIN = {"ORCH_BENCH_PIN": "1"}  # rank r on core r in every loop


def _write(config: dict[str, Any], directory: Path, name: str = "train.json") -> str:
    path = directory / name
    path.write_text(json.dumps(config))
    return str(path)


def accelerate_installed() -> bool:
    return importlib.util.find_spec("accelerate") is not None


def overhead(*, rounds: int, steps: int, accumulation: int = 1) -> dict[str, Any]:
    """1. orch's trainer vs the bare DDP loop vs Accelerate; 2. orch with metrics on vs off."""
    workdir = harness.scratch_dir("orch-bench-cfg-")
    config = _write(harness.train_config(world=WORLD, accumulation=accumulation, steps=steps), workdir)
    port = harness.free_port()
    variants: dict[str, tuple[list[str], dict[str, str], int | None]] = {
        "bare DDP loop": (harness.torchrun(WORLD, "benchmarks.bare_ddp", "--config", config),
                          harness.base_env(**PIN), None),
        "orch, metrics on": (harness.torchrun(WORLD, "orchestrator.trainer", "--config", config),
                             harness.base_env(ORCH_METRICS_PORT=str(port), ORCH_JOB_NAME="bench", **PIN), port),
        "orch, metrics off": (harness.torchrun(WORLD, "orchestrator.trainer", "--config", config),
                              harness.base_env(ORCH_METRICS_PORT=None, ORCH_JOB_NAME="bench", **PIN), None),
    }  # fmt: skip
    # The A/A control: the bare loop again. Its distance from 1.000x is what this machine's noise does to
    # two identical loops in the same run; ratios closer to 1 than that are not resolved.
    variants["bare DDP loop, again (control)"] = variants["bare DDP loop"]
    notes = []
    if accelerate_installed():
        variants["Accelerate"] = (
            harness.torchrun(WORLD, "benchmarks.accelerate_loop", "--config", config),
            harness.base_env(**PIN),
            None,
        )
    else:
        notes.append("Accelerate: not installed (pip install '.[bench]'); column skipped")

    runs: dict[str, list[harness.Run]] = {name: [] for name in variants}
    names = list(variants)
    for round_index in range(rounds):
        # all loops at once, taking turns of TURN_STEPS steps; the first turn rotates between rounds
        order = names[round_index % len(names) :] + names[: round_index % len(names)]
        round_runs = harness.run_in_turns(
            {name: variants[name] for name in order}, accumulation=accumulation, steps=steps,
            warmup=WARMUP_STEPS, turn_steps=TURN_STEPS,
        )  # fmt: skip
        for name, run in round_runs.items():
            runs[name].append(run)

    # Each process has its own persistent speed on this machine (run medians of identical loops in one
    # round differ by up to ~50%, in CPU time too), so a loop's figure is its best run of the rounds:
    # the minimum of the per-run medians (timeit's rule). Medians over rounds are printed beside it.
    def best(name: str, clock: str = "step") -> float:
        return min(getattr(r, f"median_{clock}") for r in runs[name])

    def typical(name: str) -> float:
        return statistics.median(r.median_step for r in runs[name])

    bare, on, off = "bare DDP loop", "orch, metrics on", "orch, metrics off"
    rows = []
    for name in names:
        rows.append([name, ms(best(name)), ratio(best(name) / best(bare)), ms(typical(name)),
                     ratio(typical(name) / typical(bare)), ms(best(name, "cpu")),
                     ratio(best(name, "cpu") / best(bare, "cpu"))])  # fmt: skip
    scrapes = sum(r.scrapes for r in runs[on])
    result = {
        "best_step_seconds": {name: best(name) for name in names},
        "median_step_seconds": {name: typical(name) for name in names},
        "best_cpu_seconds": {name: best(name, "cpu") for name in names},
        "ratio_vs_bare": {name: best(name) / best(bare) for name in names},
        "cpu_ratio_vs_bare": {name: best(name, "cpu") / best(bare, "cpu") for name in names},
        "run_medians": {name: [r.median_step for r in runs[name]] for name in names},
        "exporter_ratio": best(on) / best(off),
        "exporter_cpu_ratio": best(on, "cpu") / best(off, "cpu"),
        "scrapes": scrapes,
        "rounds": rounds,
        "steps": steps,
        "accumulation": accumulation,
        "notes": notes,
    }
    print(f"\n== 1. Trainer overhead: time per optimizer step ({WORLD} processes, CPU/gloo, fp32, "
          f"micro-batch {harness.MICRO_BATCH}, accumulation {accumulation}, {steps} steps/run; all loops "
          f"run at once taking turns of {TURN_STEPS} steps; {rounds} rounds)")  # fmt: skip
    print(table(["loop", "best run", "vs bare", "median run", "vs bare", "CPU/step, best", "vs bare"], rows))
    print(f"  target: orch (metrics on) <= 1.02x bare (best runs) -> {ratio(result['ratio_vs_bare'][on])}"
          f"; CPU time {ratio(result['cpu_ratio_vs_bare'][on])}")  # fmt: skip
    control = "bare DDP loop, again (control)"
    print(f"  noise floor (the same bare loop twice): wall {ratio(result['ratio_vs_bare'][control])}, "
          f"CPU {ratio(result['cpu_ratio_vs_bare'][control])}")  # fmt: skip
    for note in notes:
        print(f"  note: {note}")
    print("\n== 2. Exporter overhead: orch metrics on / off (same runs as above)")
    print(f"  wall {ratio(result['exporter_ratio'])} = {100 * (result['exporter_ratio'] - 1):+.2f}%, CPU "
          f"{ratio(result['exporter_cpu_ratio'])} = {100 * (result['exporter_cpu_ratio'] - 1):+.2f}% (target < 1%); "
          f"/metrics scraped once a second during the 'on' loop's turns: {scrapes} scrapes")  # fmt: skip
    return result


def accumulation(*, steps_by_accumulation: dict[int, int], rounds: int = 1) -> dict[str, Any]:
    """3. All-reduces per optimizer step, counted by a DDP comm hook; orch vs a loop that syncs every micro-step."""
    workdir = harness.scratch_dir("orch-bench-cfg-")
    env_count = {"ORCH_BENCH_COUNT_COMM": "1", **PIN}
    rows, result = [], {}
    for accum, steps in steps_by_accumulation.items():
        config = _write(
            harness.train_config(world=WORLD, accumulation=accum, steps=steps), workdir, f"a{accum}.json"
        )
        loops = {
            "orch": (harness.torchrun(WORLD, "orchestrator.trainer", "--config", config),
                     harness.base_env(**env_count), None),
            "naive (sync every micro-step)": (
                harness.torchrun(WORLD, "benchmarks.bare_ddp", "--config", config, "--sync-every-micro-step"),
                harness.base_env(**env_count), None),
        }  # fmt: skip
        if accum == 1:
            loops.pop("naive (sync every micro-step)")  # identical to orch's at accumulation 1
        runs: dict[str, list[harness.Run]] = {name: [] for name in loops}
        for _ in range(rounds):
            turn_steps = max(2, 10 // accum) if len(loops) > 1 else None
            for name, run in harness.run_in_turns(
                loops, accumulation=accum, steps=steps, warmup=2, turn_steps=turn_steps
            ).items():
                runs[name].append(run)
        entry = {}
        for name, rs in runs.items():
            report = rs[0].report
            done = report["steps_completed"]  # counted up to the start of the last step
            calls, size = report["grad_allreduce_calls"] / done, report["grad_allreduce_bytes"] / done
            syncs = report["grad_syncs"] / done
            step = min(r.median_step for r in rs)  # best run, as in section 1
            cpu = min(r.median_cpu for r in rs)
            entry[name] = {"syncs_per_step": syncs, "allreduce_calls_per_step": calls, "bytes_per_step": size,
                           "other_allreduces": report["other_allreduce_calls"], "step_seconds": step,
                           "cpu_seconds": cpu}  # fmt: skip
            rows.append([accum, name, f"{syncs:g}", f"{calls:g}", f"{size / 1e6:.2f} MB", ms(step), ms(cpu)])
        if "naive (sync every micro-step)" in entry:
            naive = entry["naive (sync every micro-step)"]
            entry["naive_over_orch"] = naive["step_seconds"] / entry["orch"]["step_seconds"]
            entry["naive_over_orch_cpu"] = naive["cpu_seconds"] / entry["orch"]["cpu_seconds"]
        result[accum] = entry
    print(f"\n== 3. Gradient accumulation: gradient all-reduces per optimizer step ({WORLD} processes; "
          "counted by a DDP comm hook on every bucket, not timed)")  # fmt: skip
    print(
        table(
            [
                "accum",
                "loop",
                "syncs/step",
                "bucket all-reduces/step",
                "bytes/step",
                "step (wall)",
                "step (CPU)",
            ],
            rows,
        )
    )
    for accum, entry in result.items():
        if "naive_over_orch" in entry:
            print(f"  accumulation {accum}: naive / orch time per optimizer step = {ratio(entry['naive_over_orch'])} "
                  f"wall, {ratio(entry['naive_over_orch_cpu'])} CPU")  # fmt: skip
    print("  target: exactly 1 gradient sync per optimizer step (a sync = one backward that all-reduces; DDP "
          "splits it into buckets, the first one small)")  # fmt: skip
    print(
        "  orch's other all-reduces: one per log line (the loss averaged over ranks): "
        + ", ".join(f"accum {a}: {e['orch']['other_allreduces']}" for a, e in result.items())
    )
    return result


def startup(*, rounds: int) -> dict[str, Any]:
    """5. Seconds from launching `orch run job.yaml` to the end of the first optimizer step, 2 processes.

    Next to it: the bare loop launched by torchrun directly, to the same point, and a plain
    `python -c "import torch"` (the floor every process pays).
    """
    workdir = harness.scratch_dir("orch-bench-run-")
    steps = 3
    config = harness.train_config(world=WORLD, accumulation=1, steps=steps)
    job = workdir / "job.yaml"
    job.write_text(json.dumps({"name": "bench-startup", "nodes": 1, "procs_per_node": WORLD, "train": config,
                               "metrics": {"enabled": True, "port": harness.free_port()}}))  # fmt: skip
    bare_config = _write(config, workdir)
    orch = harness.REPO / ".venv" / "bin" / "orch"
    orch_cmd = [str(orch) if orch.exists() else "orch", "run", str(job), "--out"]  # + a fresh folder
    measured: dict[str, list[float]] = {
        "orch run": [],
        "torchrun + bare loop": [],
        "python -c 'import torch'": [],
    }
    for _ in range(rounds):
        measured["orch run"].append(_seconds_to_first_step(orch_cmd, workdir, out_last=True))
        measured["torchrun + bare loop"].append(
            _seconds_to_first_step(
                harness.torchrun(WORLD, "benchmarks.bare_ddp", "--config", bare_config), workdir
            )
        )
        measured["python -c 'import torch'"].append(
            harness.timed_process([harness.PYTHON, "-c", "import torch"])
        )
    result = {name: statistics.median(values) for name, values in measured.items()}
    result["ratio"] = result["orch run"] / result["torchrun + bare loop"]
    print(
        f"\n== 5. Local start-up: launch to the end of the first optimizer step ({WORLD} processes, "
        f"median of {rounds})"
    )
    print(table(["command", "seconds"], [[name, f"{result[name]:.2f} s"] for name in measured]))
    print(f"  orch run / torchrun + bare loop = {ratio(result['ratio'])}")
    return result


def _seconds_to_first_step(cmd: list[str], workdir: Path, out_last: bool = False) -> float:
    """Launch, wait for exit; the end of step 1 is the clock's first loss call of step 2 (time.time).

    `out_last`: append a fresh output folder to the command (a reused one would resume, not start).
    """
    with tempfile.TemporaryDirectory(prefix="orch-bench-") as tmp:
        if out_last:
            cmd = [*cmd, str(Path(tmp) / "out")]
        env = harness.base_env(
            ORCH_BENCH_DIR=tmp, ORCH_OUTPUT_DIR=str(Path(tmp) / "out"), ORCH_BENCH_STEPS="3"
        )
        launched = time.time()
        proc = subprocess.run(
            cmd, env=env, cwd=workdir, capture_output=True, text=True, check=False, timeout=300
        )
        report_path = Path(tmp) / "rank0.json"
        if proc.returncode != 0 or not report_path.exists():
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
            raise BenchError(f"{' '.join(cmd[:3])} failed (exit {proc.returncode}):\n{tail}")
        times = json.loads(report_path.read_text())["loss_calls"]
    return times[1] - launched


def workload(*, rounds: int, steps: int, accumulation: int = 4) -> dict[str, Any]:
    """7. The shape users run (#14): bf16, accumulation 4, an MLP, clipping, AdamW, metrics on; DDP and FSDP.

    orch's trainer (metrics on) against the bare hand-written loop, each under DDP and under FSDP2, all
    four taking turns as in section 1. FSDP's own cost shows as its rows against the DDP rows: on CPU at
    this size its per-unit all-gathers and reduce-scatters cost more than one bucketed all-reduce.
    """
    workdir = harness.scratch_dir("orch-bench-cfg-")
    shape = {"precision": "bf16", "grad_clip": 1.0, "optimizer": {"name": "adamw", "lr": 1e-3}}
    ddp = _write(harness.train_config(world=WORLD, accumulation=accumulation, steps=steps, **shape), workdir)
    fsdp = _write(
        harness.train_config(world=WORLD, accumulation=accumulation, steps=steps, parallel="fsdp", **shape),
        workdir,
        "fsdp.json",
    )
    ports = harness.free_port(), harness.free_port()  # both orch loops run at once: one port each
    variants: dict[str, tuple[list[str], dict[str, str], int | None]] = {
        "bare DDP loop": (harness.torchrun(WORLD, "benchmarks.bare_ddp", "--config", ddp),
                          harness.base_env(**PIN), None),
        "orch DDP, metrics on": (harness.torchrun(WORLD, "orchestrator.trainer", "--config", ddp),
                                 harness.base_env(ORCH_METRICS_PORT=str(ports[0]), ORCH_JOB_NAME="bench-ddp",
                                                  **PIN), ports[0]),
        "bare FSDP loop": (harness.torchrun(WORLD, "benchmarks.bare_ddp", "--config", fsdp, "--fsdp"),
                           harness.base_env(**PIN), None),
        "orch FSDP, metrics on": (harness.torchrun(WORLD, "orchestrator.trainer", "--config", fsdp),
                                  harness.base_env(ORCH_METRICS_PORT=str(ports[1]), ORCH_JOB_NAME="bench-fsdp",
                                                   **PIN), ports[1]),
    }  # fmt: skip
    names = list(variants)
    runs: dict[str, list[harness.Run]] = {name: [] for name in names}
    for round_index in range(rounds):
        order = names[round_index % len(names) :] + names[: round_index % len(names)]
        for name, run in harness.run_in_turns(
            {name: variants[name] for name in order}, accumulation=accumulation, steps=steps,
            warmup=WARMUP_STEPS, turn_steps=max(2, TURN_STEPS // accumulation),
        ).items():  # fmt: skip
            runs[name].append(run)

    def best(name: str, clock: str = "step") -> float:
        return min(getattr(r, f"median_{clock}") for r in runs[name])

    pairs = {"orch DDP / bare DDP": ("orch DDP, metrics on", "bare DDP loop"),
             "orch FSDP / bare FSDP": ("orch FSDP, metrics on", "bare FSDP loop"),
             "bare FSDP / bare DDP": ("bare FSDP loop", "bare DDP loop"),
             "orch FSDP / orch DDP": ("orch FSDP, metrics on", "orch DDP, metrics on")}  # fmt: skip
    result = {
        "best_step_seconds": {name: best(name) for name in names},
        "best_cpu_seconds": {name: best(name, "cpu") for name in names},
        "ratios": {label: best(a) / best(b) for label, (a, b) in pairs.items()},
        "cpu_ratios": {label: best(a, "cpu") / best(b, "cpu") for label, (a, b) in pairs.items()},
        "rounds": rounds,
        "steps": steps,
        "accumulation": accumulation,
    }
    print(f"\n== 7. The users' shape: bf16, accumulation {accumulation}, MLP, clip 1.0, AdamW, metrics on "
          f"({WORLD} processes, CPU/gloo, {steps} steps/run, taking turns; {rounds} rounds)")  # fmt: skip
    rows = [[name, ms(best(name)), ms(best(name, "cpu"))] for name in names]
    print(table(["loop", "best run (wall/step)", "CPU/step"], rows))
    for label in pairs:
        print(f"  {label}: wall {ratio(result['ratios'][label])}, CPU {ratio(result['cpu_ratios'][label])}")
    print("  target: orch >= 1.00x the bare loop's speed (ratio <= 1.00x) under DDP and under FSDP")
    return result


def goodput_overhead(*, rounds: int, steps: int) -> dict[str, Any]:
    """12. What the goodput accounting and the hang heartbeat cost per step: orch with them (the default,
    and a heartbeat every 0.5 s, its fastest) beside orch without them (ORCH_HEARTBEAT=0), taking turns; and
    the loop's phase marks, which stay in both, timed in process (a step's marks)."""
    import timeit

    from orchestrator.trainer.timeline import Timeline

    workdir = harness.scratch_dir("orch-bench-cfg-")
    base = harness.train_config(world=WORLD, accumulation=1, steps=steps)
    default = _write(base, workdir, "default.json")
    fastest = _write({**base, "collective_timeout": 10}, workdir, "fastest.json")  # heartbeats every 0.5 s
    env = dict(ORCH_METRICS_PORT=None, ORCH_JOB_NAME="bench", **PIN)
    on, fast, off, control = ("orch, heartbeat + journal", "orch, heartbeat every 0.5 s",
                              "orch, neither (ORCH_HEARTBEAT=0)", "orch, neither, again (control)")  # fmt: skip
    variants: dict[str, tuple[list[str], dict[str, str], int | None]] = {
        on: (harness.torchrun(WORLD, "orchestrator.trainer", "--config", default), harness.base_env(**env), None),
        fast: (harness.torchrun(WORLD, "orchestrator.trainer", "--config", fastest), harness.base_env(**env), None),
        off: (harness.torchrun(WORLD, "orchestrator.trainer", "--config", default),
              harness.base_env(ORCH_HEARTBEAT="0", **env), None),
    }  # fmt: skip
    variants[control] = variants[off]
    runs: dict[str, list[harness.Run]] = {name: [] for name in variants}
    names = list(variants)
    for round_index in range(rounds):
        order = names[round_index % len(names) :] + names[: round_index % len(names)]
        round_runs = harness.run_in_turns(
            {name: variants[name] for name in order}, accumulation=1, steps=steps,
            warmup=WARMUP_STEPS, turn_steps=TURN_STEPS,
        )  # fmt: skip
        for name, run in round_runs.items():
            runs[name].append(run)

    def best(name: str, clock: str = "step") -> float:
        return min(getattr(r, f"median_{clock}") for r in runs[name])

    # The marks of one step with accumulation 1, as the loop and train_step make them.
    timeline = Timeline()

    def one_step() -> None:
        with timeline.step(1):
            with timeline.phase("data"):
                pass
            with timeline.phase("forward"):
                pass
            with timeline.phase("backward"):
                pass
            with timeline.phase("optimizer"):
                pass

    repeats = 20_000
    marks = min(timeit.repeat(one_step, number=repeats, repeat=5)) / repeats
    beat, per_beat_steps = _one_beat(), 5.0 / best(off)  # the default heartbeat: every 5 s
    rows = [[name, ms(best(name)), ratio(best(name) / best(off)), ms(best(name, "cpu")),
             ratio(best(name, "cpu") / best(off, "cpu"))] for name in names]  # fmt: skip
    result = {
        "best_step_seconds": {name: best(name) for name in names},
        "best_cpu_seconds": {name: best(name, "cpu") for name in names},
        "ratio_vs_off": {name: best(name) / best(off) for name in names},
        "cpu_ratio_vs_off": {name: best(name, "cpu") / best(off, "cpu") for name in names},
        "marks_seconds_per_step": marks,
        "marks_share_of_step": marks / best(off),
        "beat_seconds": beat,
        "beat_share_of_step": beat / per_beat_steps / best(off),
        "rounds": rounds,
        "steps": steps,
    }
    print(f"\n== 12. Goodput accounting and hang heartbeat: time per optimizer step ({WORLD} processes, "
          f"CPU/gloo, fp32, micro-batch {harness.MICRO_BATCH}, {steps} steps/run, turns of {TURN_STEPS} steps, "
          f"{rounds} rounds)")  # fmt: skip
    print(table(["loop", "best run", "vs neither", "CPU/step, best", "vs neither"], rows))
    print(
        f"  target: < 1% of step time -> heartbeat + journal {ratio(result['ratio_vs_off'][on])} wall, "
        f"{ratio(result['cpu_ratio_vs_off'][on])} CPU; noise floor {ratio(result['ratio_vs_off'][control])}"
    )
    print(
        f"  the phase marks (in both): {marks * 1e6:.2f} us per step = "
        f"{100 * result['marks_share_of_step']:.3f}% of the step"
    )
    print(
        f"  one beat of rank 0's thread (its heartbeat into a TCPStore, the journal's record and goodput): "
        f"{beat * 1e6:.0f} us, every 5 s = {100 * result['beat_share_of_step']:.4f}% of each step"
    )
    return result


def _one_beat() -> float:
    """What rank 0's heartbeat thread does every interval, timed in process: the journal's record written to
    OUT and its goodput computed, and the heartbeat `set` into a c10d TCPStore (a store of its own here)."""
    import json
    import timeit

    import torch.distributed as dist

    from orchestrator.trainer import journal
    from orchestrator.trainer.timeline import Timeline

    workdir = harness.scratch_dir("orch-bench-beat-")
    timeline = Timeline()
    record = journal.Journal(timeline, places=[workdir / "goodput"], job_started=None)
    record.begin(resumed_from=None)
    store = dist.TCPStore("127.0.0.1", harness.free_port(), is_master=True, wait_for_workers=False)
    where = timeline.where()

    def beat() -> None:
        record.flush()
        record.account()
        store.set("orch/heartbeat/rank-0", json.dumps({"step": where.step, "seq": where.seq, "phase": where.phase,
                                                       "since": where.since, "beat": 0.0}))  # fmt: skip

    return min(timeit.repeat(beat, number=50, repeat=5)) / 50
