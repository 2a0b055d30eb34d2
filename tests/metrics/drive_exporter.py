"""Plays one training rank for the exporter tests: calls build_metrics/on_step exactly like the trainer does.

Usage: python tests/metrics/drive_exporter.py --port P --rank R --local-rank L --steps N [--fake-gpus] ...
After N steps it prints a JSON line with what it reported, keeps the process (and so the endpoint) alive
until --stop-file exists (or --hold-seconds pass), then closes the exporter and exits 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # repo root, when run as a script

from orchestrator.trainer.metrics import build_metrics  # noqa: E402


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
    metrics = build_metrics(
        enabled=True,
        job=args.job,
        rank=args.rank,
        local_rank=args.local_rank,
        node_rank=args.node_rank,
        local_world_size=2,
        port=args.port,
        device="cpu",
        **gpu,
    )
    samples = tokens = step = 0
    while step < args.steps and not (args.stop_file and os.path.exists(args.stop_file)):
        time.sleep(args.sleep)
        step += 1
        loss = math.nan if step == args.nan_at else 2.0 / step
        metrics.on_step(
            step=step,
            samples=32,
            tokens=32 * 128,
            loss=loss,
            lr=1e-3 * step,
            grad_norm=0.5,
            step_seconds=0.02 + 0.001 * args.rank,
            data_wait_seconds=0.005,
            loss_scale=65536.0,
            skipped=step % 10 == 0,
            flops=4e9,
        )
        samples, tokens = samples + 32, tokens + 32 * 128
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
