"""Plays one training rank for the exporter tests: calls build_metrics/on_step exactly like the trainer does.

Usage: python tests/metrics/drive_exporter.py --port P --rank R --local-rank L --steps N [--fake-gpus] ...
After N steps it prints a JSON line with what it reported, keeps the process (and so the endpoint) alive
until --stop-file exists (or --hold-seconds pass), then closes the exporter and exits 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # repo root, when run as a script

from orchestrator import goodput  # noqa: E402
from orchestrator.runtime_env import RuntimeEnv  # noqa: E402
from orchestrator.trainer.metrics import build_metrics  # noqa: E402
from orchestrator.trainer.report import StepStats, Workload  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--job", default="drive")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--local-rank", type=int, default=0)
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--fake-gpus", action="store_true", help="serve the fake GPUs of fake_gpu.py")
    parser.add_argument("--sample-gpus", action="store_true", help="try real NVML (absent here)")
    parser.add_argument("--nan-at", type=int, default=-1)
    parser.add_argument("--crash", action="store_true", help="exit without closing after the steps")
    parser.add_argument("--stop-file", default="")
    parser.add_argument("--hold-seconds", type=float, default=60.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    gpu = {}
    if args.fake_gpus:
        from tests.metrics.fake_gpu import FAKE_DEVICES, FakeGpuReader

        own = FAKE_DEVICES[args.local_rank % len(FAKE_DEVICES)].uuid
        gpu = dict(gpu_reader=FakeGpuReader(), gpu_devices=FAKE_DEVICES, sample_gpus=True, gpu_uuid=own)
    elif args.sample_gpus:
        gpu = dict(sample_gpus=True)
    # The trainer's runtime facts as its launcher would set them (ORCH_PEAK_TFLOPS etc. from the test's env).
    runtime = dataclasses.replace(RuntimeEnv.from_environ(), job_name=args.job, metrics_port=args.port)
    metrics = build_metrics(
        runtime, rank=args.rank, local_rank=args.local_rank, node_rank=args.node_rank, device="cpu", **gpu
    )
    work = Workload(samples=32, tokens=32 * 128, flops=4e9)
    samples = tokens = step = 0
    while step < args.steps and not (args.stop_file and os.path.exists(args.stop_file)):
        time.sleep(args.sleep)
        step += 1
        loss = math.nan if step == args.nan_at else 2.0 / step
        metrics.on_step(
            StepStats(
                step=step,
                max_steps=args.steps,
                lr=1e-3 * step,
                grad_norm=0.5,
                seconds=0.02 + 0.001 * args.rank,
                data_wait_seconds=0.005,
                skipped=step % 10 == 0,
                skipped_total=step // 10,
                work=work,
                loss=loss,
                loss_scale=65536.0,
            )
        )
        samples, tokens = samples + 32, tokens + 32 * 128
        # what rank 0's heartbeat thread does every few seconds: the job's goodput so far (every rank calls it
        # here; only rank 0's exporter writes the job's series)
        metrics.on_goodput(goodput.Goodput(started=0.0, as_of=float(step), goodput_seconds=0.5 * step,
                                           badput_seconds={**dict.fromkeys(goodput.CAUSES, 0.0),
                                                           "data_loading_sync": 0.25 * step}))  # fmt: skip
        if step == 1:  # as parallel.MemoryMeter publishes after the first optimizer step
            size = 1000 * (args.rank + 1)
            metrics.set_memory(parameter_bytes=size, gradient_bytes=size, optimizer_bytes=2 * size,
                               peak_allocated_bytes=None)  # fmt: skip
    if args.crash:
        os._exit(3)  # die like a killed rank: no close(), its files stay behind
    report = dict(
        rank=args.rank, steps=step, samples=samples, tokens=tokens, serving_port=metrics.serving_port
    )
    print(json.dumps(report), flush=True)
    deadline = time.monotonic() + args.hold_seconds
    while time.monotonic() < deadline and not (args.stop_file and os.path.exists(args.stop_file)):
        time.sleep(0.05)
    metrics.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
