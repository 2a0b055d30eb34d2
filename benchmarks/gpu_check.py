"""`make gpu-check` (`python -m benchmarks.gpu --check`): the whole GPU path in one command, one GPU, < 8 min.

Prints a table, writes runs/gpu-check.json (git-ignored; --json elsewhere), exits 1 when any row fails. Each row (docs/performance.md says what
each means) runs orch's trainer as a user's pod does (`torchrun --nproc-per-node=1 -m orchestrator.trainer`):
  versions    torch, CUDA, NCCL, driver, GPU name, a C compiler; every TF32 flag set and read back
  pytest-gpu  `pytest -m gpu`: the suite's CUDA tests (precision, scaler, fused AdamW, NVML for real)
  bf16-eager  the gpt task in bf16, metrics on: tokens/s, MFU, peak memory; the exporter scraped meanwhile
  bf16-eager-metrics-off   the same without the exporter: the exporter's on/off step-time ratio
  bf16-compile  the same under torch.compile: compile time, recompiles and graph breaks (TORCH_LOGS)
  fp16        10 steps: loss scale, skipped steps, fused AdamW with the GradScaler
  resume      train, stop, run again on the same output: resumes at the checkpoint, the loss carries on
  exporter    the scrape of bf16-eager: orch_gpu_* present, gpu_uuid = `nvidia-smi -L`'s UUIDs, power and
              energy read, no "reading failed" warning in the log
  fsdp        bf16 with train.parallel: fsdp, once the trainer has it
`--tiny` runs the same logic on CPU with a small model, skipping (and saying so) what needs CUDA, and compiles
with the aot_eager backend (no code generation); a test runs it, so the device run cannot fail for a typo.
Benchmark rows skip the final checkpoint and model.pt (ORCH_FINAL_SAVE=0): their time goes to the measurement.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import harness

# Sizes: the full check uses GPT-2 medium (355M) for the speed rows, a smaller GPT for the others.
GPT_MEDIUM = {"inner": "gpt", "n_layer": 24, "n_head": 16, "n_embd": 1024, "seq_len": 1024, "vocab_size": 50304,
              "samples": 2048, "eval_samples": 0}  # fmt: skip
GPT_SMALL = {"inner": "gpt", "n_layer": 6, "n_head": 8, "n_embd": 512, "seq_len": 512, "vocab_size": 8192,
             "samples": 4096, "eval_samples": 0}  # fmt: skip
GPT_TINY = {"inner": "gpt", "n_layer": 2, "n_head": 4, "n_embd": 64, "seq_len": 32, "vocab_size": 128,
            "samples": 1024, "eval_samples": 0}  # fmt: skip

PROBE = r"""
import json, shutil
import torch
from orchestrator.trainer import compat, precision
facts = {"torch": str(torch.__version__), "torch_ok": True, "cuda": torch.version.cuda,
         "cuda_available": torch.cuda.is_available(), "nccl": None, "gpu": None, "driver": None,
         "c_compiler": shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")}
try:
    compat.check_torch()
except compat.TorchTooOld as error:
    facts["torch_ok"], facts["torch_error"] = False, str(error)
if torch.cuda.is_available():
    facts["gpu"] = torch.cuda.get_device_name()
    facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
try:
    import pynvml
    pynvml.nvmlInit()
    version = pynvml.nvmlSystemGetDriverVersion()
    facts["driver"] = version.decode() if isinstance(version, bytes) else str(version)
except Exception as error:
    facts["driver_error"] = f"{type(error).__name__}: {error}"
precision.set_tf32(True)
facts["tf32_on"] = precision.tf32_flags()
precision.set_tf32(False)
facts["tf32_off"] = precision.tf32_flags()
print(json.dumps(facts))
"""


@dataclass
class Row:
    name: str
    status: str  # pass | fail | skip
    detail: str
    values: dict[str, Any] = field(default_factory=dict)


@dataclass
class TrainRun:
    """What one trainer process left behind."""

    returncode: int
    log: str
    out: Path
    summary: dict[str, Any] | None
    events: list[dict[str, Any]]
    clock: dict[str, Any] | None
    scrape: str | None  # the last /metrics text that had GPU series (or any orch_ series on CPU)
    wall_seconds: float

    def losses(self) -> dict[int, float]:
        return {e["step"]: e["loss"] for e in self.events if e["event"] == "step"}


class Check:
    def __init__(self, *, tiny: bool, workdir: Path, steps: int | None = None) -> None:
        self.tiny, self.workdir = tiny, workdir
        self.speed_args = GPT_TINY if tiny else GPT_MEDIUM
        self.small_args = GPT_TINY if tiny else GPT_SMALL
        self.micro = 4 if tiny else 8
        self.steps = steps or (12 if tiny else 30)
        self.warmup = 3 if tiny else 5
        self.rows: list[Row] = []
        self.runs: dict[str, TrainRun] = {}
        self.facts: dict[str, Any] = {}

    # --- running the trainer ---------------------------------------------------------------------------------

    def config(self, task_args: dict[str, Any], **train: Any) -> dict[str, Any]:
        train.setdefault("max_steps", self.steps)
        return harness.train_config(
            world=1, accumulation=1, task_args=task_args, steps=train.pop("max_steps"),
            micro_batch_size=self.micro, optimizer={"name": "adamw", "lr": 3e-4, "betas": [0.9, 0.95]},
            **{"precision": "bf16", "log_every": 1, **train},
        )  # fmt: skip

    def train(self, name: str, config: dict[str, Any], *, metrics: bool = False, out: Path | None = None,
              env: dict[str, str] | None = None, timeout: float = 420) -> TrainRun:  # fmt: skip
        out = out or self.workdir / name
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench").mkdir(exist_ok=True)
        config_file = out / f"{name}.train.json"
        config_file.write_text(json.dumps(config))
        port = harness.free_port() if metrics else None
        progress = out / "progress.jsonl"
        progress.unlink(missing_ok=True)
        scraped_file = out / "scraped"  # the run holds at its last step until a scrape with steps was taken
        scraped_file.unlink(missing_ok=True)
        full_env = harness.base_env(
            ORCH_JOB_NAME=f"gpu-check-{name}", ORCH_OUTPUT_DIR=str(out), ORCH_PROGRESS_FILE=str(progress),
            ORCH_METRICS_PORT=str(port) if port else None, ORCH_METRICS_ADDR="127.0.0.1",
            PROMETHEUS_MULTIPROC_DIR=str(out / "metrics-db"), ORCH_BENCH_DIR=str(out / "bench"),
            ORCH_BENCH_ACCUMULATION="1", ORCH_BENCH_STEPS=str(config["max_steps"]), TMPDIR=str(out),
            ORCH_BENCH_HOLD_STEP=str(config["max_steps"] - 1) if port else None,
            ORCH_BENCH_HOLD_UNTIL=str(scraped_file) if port else None,
        )  # fmt: skip
        full_env.update(env or {})
        cmd = harness.torchrun(1, "orchestrator.trainer", "--config", str(config_file))
        scraped: list[str] = []
        stop = threading.Event()
        scraper = (
            threading.Thread(target=_scrape, args=(port, stop, scraped, scraped_file), daemon=True)
            if port
            else None
        )
        started = time.perf_counter()
        with open(out / "log.txt", "w+") as log:
            process = subprocess.Popen(cmd, env=full_env, cwd=out, stdout=log, stderr=subprocess.STDOUT)
            if scraper:
                scraper.start()
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            finally:
                stop.set()
                if scraper:
                    scraper.join(timeout=5)
            log.seek(0)
            text = log.read()
        run = TrainRun(
            returncode=process.returncode, log=text, out=out,
            summary=_read_json(out / "summary.json"),
            events=[json.loads(line) for line in progress.read_text().splitlines()] if progress.exists() else [],
            clock=_read_json(out / "bench" / "rank0.json"), scrape=scraped[-1] if scraped else None,
            wall_seconds=time.perf_counter() - started,
        )  # fmt: skip
        self.runs[name] = run
        if run.returncode != 0:
            tail = "\n".join(text.strip().splitlines()[-12:])
            raise CheckFailed(f"the trainer exited {run.returncode}:\n{tail}")
        return run

    def speed(self, run: TrainRun) -> dict[str, Any]:
        """tokens/s, MFU and peak memory of a run, from the workload clock (CUDA events on a GPU)."""
        from orchestrator.runtime_env import RuntimeEnv
        from orchestrator.trainer.mfu import peak_flops

        report = run.clock
        if not report:
            raise CheckFailed("the workload clock wrote no report")
        if report.get("cuda_seconds"):
            report["step_pre"] = report["step_post"] = report["cuda_seconds"]
        periods = harness.step_periods(report, self.warmup)
        if len(periods) < 3:
            raise CheckFailed(f"only {len(periods)} timed steps")
        step = statistics.median(periods)
        peak = peak_flops(
            peak_tflops=RuntimeEnv.from_environ().peak_tflops, device_name=report.get("device_name")
        )
        flops = self.micro * report["flops_per_sample"]
        all_periods = harness.step_periods(report, 0)
        return {
            "step_seconds": step,
            "tokens_per_second": self.micro * report["tokens_per_sample"] / step,
            "mfu": flops / step / peak if peak else None,
            "peak_memory_bytes": report.get("peak_memory_bytes"),
            "first_steps_seconds": sum(all_periods[: self.warmup]),
            "parameters": report.get("parameters"),
            "device": report.get("device_name") or "cpu",
        }

    # --- the rows --------------------------------------------------------------------------------------------

    def row(self, name: str, body: Callable[[], Row | None]) -> Row:
        print(f"  {name} ...", flush=True)
        started = time.perf_counter()
        try:
            row = body() or Row(name, "pass", "")
        except CheckFailed as error:
            row = Row(name, "fail", str(error))
        except Exception as error:  # a bug in a row must not hide the other rows
            row = Row(name, "fail", f"{type(error).__name__}: {error}")
        row.name = name
        row.values.setdefault("seconds", round(time.perf_counter() - started, 1))
        self.rows.append(row)
        print(f"  {name}: {row.status} {row.detail.splitlines()[0] if row.detail else ''}", flush=True)
        return row

    def versions(self) -> Row:
        probe = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=harness.REPO,
                               env=harness.base_env(), timeout=300)  # fmt: skip
        if probe.returncode != 0:
            raise CheckFailed(f"the probe failed: {probe.stderr.strip()[-800:]}")
        facts = self.facts = json.loads(probe.stdout.strip().splitlines()[-1])
        problems = []
        if not facts["torch_ok"]:
            problems.append(facts["torch_error"])
        on, off = facts["tf32_on"], facts["tf32_off"]
        if (on["float32_matmul_precision"], on["cuda.matmul.allow_tf32"], on["cudnn.allow_tf32"]) != (
            "high",
            True,
            True,
        ):
            problems.append(f"TF32 on reads back as {on}")
        if (off["cuda.matmul.allow_tf32"], off["cudnn.allow_tf32"]) != (False, False):
            problems.append(f"TF32 off reads back as {off}")
        if on.get("cuda.matmul.fp32_precision", "tf32") != "tf32":
            problems.append(f"TF32 on: new flag {on['cuda.matmul.fp32_precision']!r}")
        if not facts["c_compiler"]:
            problems.append("no C compiler (cc/gcc/clang): torch.compile's Triton kernels cannot build")
        wanted_cuda = not self.tiny
        if wanted_cuda and not facts["cuda_available"]:
            problems.append("torch sees no CUDA device")
        detail = (f"torch {facts['torch']}, CUDA {facts['cuda']}, NCCL {facts['nccl']}, driver {facts['driver']}, "
                  f"{facts['gpu'] or 'no GPU'}; TF32 flags read back")  # fmt: skip
        return Row("versions", "fail" if problems else "pass", "; ".join(problems) or detail, facts)

    def pytest_gpu(self) -> Row:
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "tests"],
            capture_output=True, text=True, cwd=harness.REPO, env=harness.base_env(), timeout=600,
        )  # fmt: skip
        last = (result.stdout.strip().splitlines() or [""])[-1]
        counts = {
            kind: int(n)
            for n, kind in re.findall(r"(\d+) (passed|failed|skipped|error|errors|deselected)", last)
        }
        values = {"counts": counts, "summary": last}
        if (
            result.returncode not in (0, 5)
            or counts.get("failed")
            or counts.get("error")
            or counts.get("errors")
        ):
            return Row("pytest-gpu", "fail", result.stdout.strip()[-1500:], values)
        if not counts.get("passed"):
            if self.facts.get("cuda_available"):
                return Row("pytest-gpu", "fail", f"no CUDA test ran on a CUDA machine: {last}", values)
            return Row("pytest-gpu", "skip", f"no CUDA here: {last}", values)
        return Row("pytest-gpu", "pass", last, values)

    def bf16_eager(self) -> Row:
        run = self.train(
            "bf16-eager", self.config(self.speed_args), metrics=True, env={"ORCH_FINAL_SAVE": "0"}
        )
        values = self.speed(run)
        return Row("bf16-eager", "pass", _speed_text(values), values)

    def bf16_eager_metrics_off(self) -> Row:
        run = self.train("bf16-eager-metrics-off", self.config(self.speed_args), env={"ORCH_FINAL_SAVE": "0"})
        values = self.speed(run)
        on = self.runs.get("bf16-eager")
        if on is not None:
            values["exporter_ratio"] = self.speed(on)["step_seconds"] / values["step_seconds"]
        text = _speed_text(values)
        if "exporter_ratio" in values:
            text += f"; exporter on/off step time {values['exporter_ratio']:.3f}x"
        return Row("bf16-eager-metrics-off", "pass", text, values)

    def bf16_compile(self) -> Row:
        config = self.config(self.speed_args, compile=True)
        env = {"ORCH_FINAL_SAVE": "0", "TORCH_LOGS": "recompiles,graph_breaks"}
        if self.tiny:
            # On a CPU, inductor's C++ code generation and compiler runs were half of the whole --tiny check.
            # Dynamo's tracing (what decides recompiles and graph breaks) and AOTAutograd's are kept; only the
            # code generation is left out (torch's own override of the backend, a debug setting).
            env["TORCH_COMPILE_OVERRIDE_BACKENDS"] = ">=0:aot_eager"
        run = self.train("bf16-compile", config, env=env, timeout=600)
        values = self.speed(run)
        values["recompiles"] = len(re.findall(r"Recompiling function", run.log))
        breaks = re.findall(r"Graph break.* in user code at (\S+)", run.log)
        # DDP's own forward is Python Dynamo does not trace (its logger call, the @contextmanager around the
        # inner forward, @_disable_dynamo): it breaks there by design and compiles the model as its own
        # frames, split at the buckets (DDPOptimizer). A break anywhere else is in the model: a failure.
        in_ddp = [at for at in breaks if re.search(r"torch/nn/parallel/distributed\.py|/contextlib\.py", at)]
        values["graph_breaks"] = len(breaks) - len(in_ddp)
        values["ddp_wrapper_breaks"] = len(in_ddp)
        eager = self.runs.get("bf16-eager")
        if eager is not None:
            values["compile_speedup"] = self.speed(eager)["step_seconds"] / values["step_seconds"]
        text = (f"{_speed_text(values)}; first {self.warmup} steps {values['first_steps_seconds']:.1f} s "
                f"(compile); {values['recompiles']} recompiles, {values['graph_breaks']} graph breaks in the model "
                f"({values['ddp_wrapper_breaks']} in DDP's wrapper, by design)")  # fmt: skip
        if values["recompiles"] or values["graph_breaks"]:
            lines = [line for line in run.log.splitlines() if "Recompiling" in line or "Graph break" in line
                     or "Reason:" in line]  # fmt: skip
            return Row("bf16-compile", "fail", text + "\n" + "\n".join(lines[:10]), values)
        return Row("bf16-compile", "pass", text, values)

    def fp16(self) -> Row:
        run = self.train("fp16", self.config(self.small_args, precision="fp16", max_steps=10))
        summary = run.summary or {}
        values = {k: summary.get(k) for k in ("loss_scale", "skipped_steps", "final_loss")}
        values["fused_adamw"] = "fused AdamW" in run.log
        problems = []
        if values["loss_scale"] is None:
            problems.append("no loss scale in summary.json")
        if (values["skipped_steps"] or 0) >= 10:
            problems.append("every step was skipped")
        if not isinstance(values["final_loss"], float) or not math.isfinite(values["final_loss"]):
            problems.append(f"final loss {values['final_loss']}")
        if self.facts.get("cuda_available") and not values["fused_adamw"]:
            problems.append("AdamW is not fused on CUDA")
        detail = (f"loss scale {values['loss_scale']}, {values['skipped_steps']} skipped of 10, final loss "
                  f"{values['final_loss']}, {'fused' if values['fused_adamw'] else 'unfused'} AdamW")  # fmt: skip
        return Row("fp16", "fail" if problems else "pass", "; ".join(problems) or detail, values)

    def resume(self) -> Row:
        first, more = (10, 6) if self.tiny else (20, 10)
        out = self.workdir / "resume"
        checkpoint = {"every_steps": first // 2, "keep": 2}
        before = self.train(
            "resume-1", self.config(self.small_args, max_steps=first, checkpoint=checkpoint), out=out
        )
        after = self.train("resume-2", self.config(self.small_args, max_steps=first + more, checkpoint=checkpoint),
                           out=out)  # fmt: skip
        losses_before, losses_after = before.losses(), after.losses()
        resumed = (after.summary or {}).get("resumed_from_step")
        last = statistics.mean(losses_before[s] for s in range(first - 2, first + 1))
        carried = statistics.mean(losses_after[s] for s in range(first + 1, first + 4))
        start = losses_before[1]
        values = {"resumed_from_step": resumed, "loss_at_first_step": start, "loss_before_stop": last,
                  "loss_after_resume": carried}  # fmt: skip
        problems = []
        if resumed != first:
            problems.append(f"resumed from step {resumed}, not {first}")
        # The loss carries on: near where it stopped, not back at the start.
        if not abs(carried - last) <= 0.25 * abs(start - last) + 0.05 * abs(last):
            problems.append(f"loss {last:.4f} before the stop, {carried:.4f} after (first step: {start:.4f})")
        detail = f"resumed at step {resumed}: loss {start:.3f} at step 1, {last:.3f} before the stop, {carried:.3f} after"
        return Row("resume", "fail" if problems else "pass", "; ".join(problems) or detail, values)

    def exporter(self) -> Row:
        run = self.runs.get("bf16-eager")
        if run is None:
            raise CheckFailed("bf16-eager did not run")
        if run.scrape is None:
            raise CheckFailed("no scrape of the exporter answered during bf16-eager")
        from prometheus_client.parser import text_string_to_metric_families

        samples = [s for f in text_string_to_metric_families(run.scrape) for s in f.samples]
        names = {s.name for s in samples}
        warnings = [
            line for line in run.log.splitlines() if "reading failed" in line or "metrics off" in line
        ]
        values: dict[str, Any] = {"series": len(samples), "warnings": warnings[:5]}
        problems = [f"exporter warning: {line.strip()}" for line in warnings[:3]]
        if "orch_train_step" not in names:
            problems.append("no orch_train_step")
        if not self.facts.get("cuda_available"):
            detail = f"{len(samples)} series, orch_train_* present; no GPU: orch_gpu_* not expected"
            return Row("exporter", "fail" if problems else "skip", "; ".join(problems) or detail, values)
        gpu_uuids = sorted({s.labels["gpu_uuid"] for s in samples if s.name.startswith("orch_gpu_")})
        smi = nvidia_smi_uuids()
        rank_uuids = sorted({s.labels.get("gpu_uuid", "") for s in samples if s.name == "orch_rank_info"})
        values.update(gpu_uuids=gpu_uuids, nvidia_smi_uuids=smi, rank_uuids=rank_uuids)
        if not any(n.startswith("orch_gpu_") for n in names):
            problems.append("no orch_gpu_* series")
        if smi and gpu_uuids != smi:
            problems.append(f"gpu_uuid {gpu_uuids} != nvidia-smi -L {smi}")
        if not smi:
            problems.append("nvidia-smi -L listed no GPU")
        if not set(rank_uuids) <= set(smi):
            problems.append(f"orch_rank_info gpu_uuid {rank_uuids} not among {smi}")
        for name in ("orch_gpu_power_watts", "orch_gpu_energy_joules_total"):
            if name not in names:
                problems.append(f"no {name}")
        detail = (
            f"{len(samples)} series; gpu_uuid {', '.join(gpu_uuids)} = nvidia-smi -L; power and energy read"
        )
        return Row("exporter", "fail" if problems else "pass", "; ".join(problems) or detail, values)

    def fsdp(self) -> Row:
        from orchestrator.trainer.config import TrainSpec

        if "parallel" not in TrainSpec.model_fields:
            return Row("fsdp", "skip", "train.parallel is not in this orch yet")
        run = self.train("fsdp", self.config(self.speed_args, parallel="fsdp"), env={"ORCH_FINAL_SAVE": "0"})
        values = self.speed(run)
        return Row("fsdp", "pass", _speed_text(values), values)

    def run_all(self) -> list[Row]:
        self.row("versions", self.versions)
        self.row("pytest-gpu", self.pytest_gpu)
        self.row("bf16-eager", self.bf16_eager)
        self.row("bf16-eager-metrics-off", self.bf16_eager_metrics_off)
        self.row("bf16-compile", self.bf16_compile)
        self.row("fp16", self.fp16)
        self.row("resume", self.resume)
        self.row("exporter", self.exporter)
        self.row("fsdp", self.fsdp)
        return self.rows


class CheckFailed(Exception):
    pass


def _speed_text(values: dict[str, Any]) -> str:
    mfu = (
        f"MFU {100 * values['mfu']:.1f}%" if values.get("mfu") else "MFU n/a (no peak FLOP/s for this device)"
    )
    memory = values.get("peak_memory_bytes")
    return (f"{values['tokens_per_second']:,.0f} tokens/s, {harness.ms(values['step_seconds'])}/step, {mfu}"
            + (f", peak memory {memory / 2**30:.1f} GiB" if memory else ""))  # fmt: skip


def _read_json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def _scrape(port: int, stop: threading.Event, scraped: list[str], release: Path) -> None:
    """Scrape every 0.2 s and keep the latest of the most complete answers: with GPU series and training steps,
    over one with fewer (the first ones come before step 1). The run waits at its last step until an answer
    with training steps came (`release`), so a tiny run on a loaded machine cannot end unscraped."""

    def rank(text: str) -> tuple[bool, bool]:
        return "orch_gpu_" in text, "orch_train_step" in text

    while not stop.wait(0.2):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                text = response.read().decode()
        except OSError:
            continue
        if "orch_" in text and (not scraped or rank(text) >= rank(scraped[-1])):
            scraped[:] = [text]
        if "orch_train_step" in text:
            release.touch()


def nvidia_smi_uuids() -> list[str]:
    """`nvidia-smi -L`'s UUIDs of the GPUs this process may use (CUDA_VISIBLE_DEVICES as indices)."""
    if shutil.which("nvidia-smi") is None:
        return []
    text = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
    uuids = re.findall(r"\(UUID: ((?:GPU|MIG)-[0-9a-fA-F-]+)\)", text)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible and all(part.strip().isdigit() for part in visible.split(",")):
        uuids = [uuids[int(i)] for i in visible.split(",") if int(i) < len(uuids)]
    return sorted(uuids)


def main(*, tiny: bool, json_path: str, steps: int | None = None) -> int:
    started = time.perf_counter()
    workdir = harness.scratch_dir("orch-gpu-check-")
    check = Check(tiny=tiny, workdir=workdir, steps=steps)
    print(f"orch gpu-check{' --tiny (CPU allowed, CUDA rows skipped)' if tiny else ''}", flush=True)
    rows = check.run_all()
    print()
    print(harness.table(["row", "status", "result"],
                        [[r.name, r.status.upper(), r.detail.splitlines()[0] if r.detail else ""] for r in rows]))  # fmt: skip
    failed = [r for r in rows if r.status == "fail"]
    for row in failed:
        print(f"\n{row.name} failed:\n{row.detail}")
    seconds = time.perf_counter() - started
    report = {"tiny": tiny, "seconds": seconds, "ok": not failed, "rows": [asdict(r) for r in rows]}
    Path(json_path).parent.mkdir(parents=True, exist_ok=True)
    Path(json_path).write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"\n{'FAILED' if failed else 'OK'}: {len(rows) - len(failed)}/{len(rows)} rows pass or skip, "
          f"{seconds:.0f} s -> {json_path}")  # fmt: skip
    return 1 if failed else 0
