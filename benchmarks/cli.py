"""4. CLI latency: wall time of fresh `orch --help` and `orch render` processes, next to TorchX's dry run.

TorchX 0.7 pins urllib3 < 1.27 while the kubernetes client orch uses needs urllib3 >= 2.8, so TorchX is
not installed into orch's venv; it is looked for (a) importable here, or (b) in a `pip install --target`
folder named by ORCH_BENCH_TORCHX_SITE (default `build/torchx-site`), run with this Python and PYTHONPATH
pointing there. Without it, the TorchX rows are left out with a note.

Every command reads byte-compiled modules, as it does from an installed wheel (pip compiles at install) or
a checkout that has run once: the processes share a bytecode folder in the scratch directory
(PYTHONPYCACHEPREFIX), filled by one untimed round first. Without it, a machine that sets
PYTHONDONTWRITEBYTECODE (the development VM does) would compile orch's sources in every timed run (~40 ms
of `orch render`'s CPU) and TorchX's not (pip compiled those at install).
"""

from __future__ import annotations

import importlib.util
import os
import statistics
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.harness import ms, ratio, table

TARGETS = {
    "orch --help": 0.150,
    "orch render (2-node DDP job)": 0.250,  # #32 item 6
    "orch render examples/digits.yaml": 0.250,
    "orch render examples/gpt-multinode.yaml": 0.250,
}

# A job comparable to TorchX's `dist.ddp -j 2x1`: 2 pods, 1 GPU and 1 process each, the built-in trainer.
DDP_JOB = """\
name: ddp-2x1
image: ghcr.io/acme/trainer:1.0
nodes: 2
gpus_per_node: 1
train:
  task: gpt
  batch_size: 16
  max_steps: 100
"""


def torchx_command() -> tuple[list[str], dict[str, str]] | None:
    """How to start TorchX's CLI here, or None when it is not installed."""
    if importlib.util.find_spec("torchx") is not None:
        return [harness.PYTHON, "-m", "torchx.cli.main"], dict(os.environ)
    site = Path(os.environ.get("ORCH_BENCH_TORCHX_SITE") or harness.REPO / "build" / "torchx-site")
    if (site / "torchx").is_dir():
        return [harness.PYTHON, "-m", "torchx.cli.main"], dict(os.environ, PYTHONPATH=str(site))
    return None


def latency(*, repeats: int) -> dict[str, Any]:
    workdir = harness.scratch_dir("orch-bench-cli-")
    job = workdir / "ddp-2x1.yaml"
    job.write_text(DDP_JOB)
    orch = harness.REPO / ".venv" / "bin" / "orch"
    orch_cmd = [str(orch)] if orch.exists() else [harness.PYTHON, "-m", "orchestrator"]
    bytecode = {"PYTHONPYCACHEPREFIX": str(workdir / "bytecode"), "PYTHONDONTWRITEBYTECODE": None}
    env = harness.base_env(**bytecode)
    commands: dict[str, tuple[list[str], dict[str, str]]] = {
        "python -c pass (interpreter start)": ([harness.PYTHON, "-c", "pass"], env),
        "orch --help": ([*orch_cmd, "--help"], env),
        "orch render (2-node DDP job)": ([*orch_cmd, "render", str(job)], env),
    }
    for example in ("digits.yaml", "gpt-multinode.yaml"):
        if (path := harness.REPO / "examples" / example).exists():
            commands[f"orch render examples/{example}"] = ([*orch_cmd, "render", str(path)], env)
    notes = []
    torchx = torchx_command()
    if torchx:
        prefix, tx_env = torchx
        tx_env = {k: v for k, v in tx_env.items() if k != "PYTHONDONTWRITEBYTECODE"}
        tx_env["PYTHONPYCACHEPREFIX"] = bytecode["PYTHONPYCACHEPREFIX"]
        commands["torchx --help"] = ([*prefix, "--help"], tx_env)
        # --workspace "": no image patching (that would need a docker daemon); the dry run prints the
        # Volcano Job it would submit for 2 nodes x 1 process, as `orch render` prints its PyTorchJob.
        commands["torchx run --dryrun -s kubernetes dist.ddp -j 2x1"] = (
            [*prefix, "run", "--workspace", "", "--dryrun", "-s", "kubernetes", "-cfg", "queue=default",
             "dist.ddp", "-j", "2x1", "--image", "ghcr.io/acme/trainer:1.0", "--script", "train.py"],
            tx_env,
        )  # fmt: skip
    else:
        notes.append("TorchX: not installed (see benchmarks/cli.py for why and how); its rows are left out")

    for cmd, cmd_env in commands.values():  # untimed: writes the bytecode every timed run then reads
        harness.timed_process_cpu(cmd, env=cmd_env, cwd=workdir)
    samples: dict[str, list[float]] = {name: [] for name in commands}
    cpu: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(repeats):  # interleaved: a busy moment hits every command alike
        for name, (cmd, cmd_env) in commands.items():
            wall, used = harness.timed_process_cpu(cmd, env=cmd_env, cwd=workdir)
            samples[name].append(wall)
            cpu[name].append(used)
    medians = {name: statistics.median(values) for name, values in samples.items()}
    cpu_medians = {name: statistics.median(values) for name, values in cpu.items()}
    rows = []
    for name, seconds in medians.items():
        target = TARGETS.get(name)
        verdict = "" if target is None else (f"< {ms(target)}: " + ("met" if seconds < target else "MISSED"))
        rows.append([name, ms(seconds), ms(min(samples[name])), ms(cpu_medians[name]), verdict])
    result: dict[str, Any] = {"median_seconds": medians, "best_seconds": {n: min(v) for n, v in samples.items()},
                              "median_cpu_seconds": cpu_medians, "repeats": repeats, "notes": notes}  # fmt: skip
    print(f"\n== 4. CLI latency: wall time of a fresh process (median of {repeats}, interleaved); CPU = user + "
          "system time, what the command needs on an idle machine")  # fmt: skip
    print(table(["command", "median", "best", "CPU (median)", "target (median wall)"], rows))
    render, help_ = "orch render (2-node DDP job)", "orch --help"
    result["render_vs_help"] = medians[render] / medians[help_]
    result["render_vs_python"] = medians[render] / medians["python -c pass (interpreter start)"]
    result["render_vs_help_cpu"] = cpu_medians[render] / cpu_medians[help_]
    print(f"  orch render / orch --help = {ratio(result['render_vs_help'])} wall, "
          f"{ratio(result['render_vs_help_cpu'])} CPU; orch render / python -c pass = "
          f"{ratio(result['render_vs_python'])}")  # fmt: skip
    if torchx:
        dry = "torchx run --dryrun -s kubernetes dist.ddp -j 2x1"
        result["render_vs_torchx_dryrun"] = medians[render] / medians[dry]
        result["render_vs_torchx_dryrun_cpu"] = cpu_medians[render] / cpu_medians[dry]
        result["help_vs_torchx_help"] = medians[help_] / medians["torchx --help"]
        print(f"  orch render / torchx dry run = {ratio(result['render_vs_torchx_dryrun'])} wall, "
              f"{ratio(result['render_vs_torchx_dryrun_cpu'])} CPU; "
              f"orch --help / torchx --help = {ratio(result['help_vs_torchx_help'])}")  # fmt: skip
    for note in notes:
        print(f"  note: {note}")
    return result
