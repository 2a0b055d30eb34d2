"""GPU throughput and MFU of orch's trainer on the `gpt` task, one GPU, one command, under 5 minutes.

    python -m benchmarks.gpu [--json results.json]      # on a machine with a CUDA GPU
    python -m benchmarks.gpu --tiny                      # a small model, CPU allowed: checks the script
    python -m benchmarks.gpu --check [--tiny]            # make gpu-check: the whole GPU path (gpu_check.py)

Runs orch's trainer (`torchrun --nproc-per-node 1 -m orchestrator.trainer`) on a GPT-2-medium-sized model
(24 layers, width 1024, 16 heads, vocabulary 50304, sequence 1024: about 355M parameters), micro-batch 16,
as separate processes: bf16 eager with metrics on and off, bf16 with torch.compile, fp32 (TF32 matmuls,
orch's default) and the bare hand-written loop in bf16. Step times come from CUDA events recorded at each
step's loss (benchmarks/workload.py), read after the run, so the clock adds no host-device sync.
MFU = model FLOPs per token (6N + 12·L·H·Q·T, PaLM appendix B, N without position embeddings; what the
trainer reports) x tokens/s / the GPU's dense bf16 peak (orch's table in trainer/metrics.py, e.g. 989
TFLOP/s for H100 SXM and H200; ORCH_PEAK_TFLOPS overrides). The fp32 row uses the same bf16 peak, so
its MFU shows the speed given up, not the fp32 units' utilisation.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

if not __package__:  # `python benchmarks/gpu.py`: make the repo root importable, as `-m` would
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness  # noqa: E402
from benchmarks.harness import BenchError, ms, ratio, table  # noqa: E402

GPT_350M = {"inner": "gpt", "n_layer": 24, "n_head": 16, "n_embd": 1024, "seq_len": 1024, "vocab_size": 50304,
            "samples": 1024, "eval_samples": 0}  # fmt: skip
GPT_TINY = {"inner": "gpt", "n_layer": 2, "n_head": 4, "n_embd": 128, "seq_len": 128, "vocab_size": 512,
            "samples": 512, "eval_samples": 0}  # fmt: skip


# Under runs/, which git ignores (as orch run's outputs): a check leaves nothing untracked in the checkout.
CHECK_REPORT = "runs/gpu-check.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument(
        "--check",
        action="store_true",
        help=f"the GPU check (make gpu-check): every row of docs/performance.md, written to {CHECK_REPORT}",
    )
    parser.add_argument("--tiny", action="store_true", help="small model, CPU allowed, no compile")
    parser.add_argument("--steps", type=int, help="optimizer steps per run (default 30; tiny 15)")
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--json", help=f"also write the results here (--check: instead of {CHECK_REPORT})")
    args = parser.parse_args(argv)
    if args.check:
        from benchmarks import gpu_check

        return gpu_check.main(tiny=args.tiny, json_path=args.json or CHECK_REPORT, steps=args.steps)
    steps = args.steps or (15 if args.tiny else 30)
    task_args = GPT_TINY if args.tiny else GPT_350M
    micro = 4 if args.tiny else args.micro_batch

    def config(precision: str, compile_: bool = False, **extra: object) -> dict:
        return harness.train_config(world=1, accumulation=1, steps=steps, task_args=task_args,
                                    micro_batch_size=micro, precision=precision, compile=compile_,
                                    optimizer={"name": "adamw", "lr": 3e-4, "betas": [0.9, 0.95]},
                                    log_every=10, **extra)  # fmt: skip

    workdir = harness.scratch_dir("orch-bench-gpu-")
    port = harness.free_port()
    on = harness.base_env(ORCH_METRICS_PORT=str(port), ORCH_JOB_NAME="bench-gpu")
    off = harness.base_env(ORCH_METRICS_PORT=None, ORCH_JOB_NAME="bench-gpu")
    runs_spec: list[tuple] = [  # (name, module, precision, compile, env, scrape port[, train overrides])
        ("orch bf16 eager, metrics on", "orchestrator.trainer", "bf16", False, on, port),
        ("orch bf16 eager, metrics off", "orchestrator.trainer", "bf16", False, off, None),
        ("bare loop bf16 eager", "benchmarks.bare_ddp", "bf16", False, off, None),
        ("orch fp32 (TF32) eager, metrics on", "orchestrator.trainer", "fp32", False, on, port),
        # FSDP2 on the same GPU: fully_shard per block, bf16 MixedPrecisionPolicy, DCP checkpoint at the end.
        # One GPU shards nothing: the row checks the CUDA path and shows FSDP's bookkeeping cost vs DDP.
        (
            "orch bf16 eager FSDP, metrics on",
            "orchestrator.trainer",
            "bf16",
            False,
            on,
            port,
            {"parallel": "fsdp"},
        ),
    ]
    if not args.tiny:
        runs_spec.insert(
            1, ("orch bf16 torch.compile, metrics on", "orchestrator.trainer", "bf16", True, on, port)
        )

    started = time.perf_counter()
    results: dict[str, dict] = {}
    rows = []
    for index, (name, module, precision, compile_, env, scrape, *overrides) in enumerate(runs_spec):
        path = workdir / f"run{index}.json"
        path.write_text(json.dumps(config(precision, compile_, **(overrides[0] if overrides else {}))))
        warmup = 8 if compile_ else 5  # compile and autotuning happen in the first steps
        try:
            run = harness.run_training(harness.torchrun(1, module, "--config", str(path)), env,
                                       accumulation=1, steps=steps, warmup=warmup, scrape_port=scrape, timeout=600)  # fmt: skip
        except BenchError as error:
            print(f"{name}: {error}", file=sys.stderr)
            return 1
        report = run.report
        step = run.median_step
        tokens = micro * report["tokens_per_sample"]
        flops = micro * report["flops_per_sample"]
        peak = _peak_flops(report.get("device_name"))
        results[name] = {
            "step_seconds": step,
            "tokens_per_second": tokens / step,
            "mfu": flops / step / peak if peak else None,
            "device": report.get("device_name"),
            "parameters": report["parameters"],
            "wall_seconds": run.wall_seconds,
        }
        mfu = results[name]["mfu"]
        rows.append([name, ms(step), f"{tokens / step:,.0f}", f"{100 * mfu:.1f}%" if mfu else "n/a",
                     f"{run.wall_seconds:.0f} s"])  # fmt: skip
        print(f"  {name}: {ms(step)}/step", flush=True)

    first = next(iter(results.values()))
    print(
        f"\n== GPU: orch trainer, gpt task ({first['parameters'] / 1e6:.1f}M parameters, sequence "
        f"{task_args['seq_len']}, micro-batch {micro}), 1 x {first['device'] or 'CPU'}, {steps} steps/run"
    )
    print(table(["run", "median step", "tokens/s", "MFU", "wall"], rows))
    eager_on, eager_off = results["orch bf16 eager, metrics on"], results["orch bf16 eager, metrics off"]
    summary = {
        "exporter_ratio": eager_on["step_seconds"] / eager_off["step_seconds"],
        "orch_vs_bare_bf16": eager_off["step_seconds"] / results["bare loop bf16 eager"]["step_seconds"],
        "bf16_speedup_over_fp32": results["orch fp32 (TF32) eager, metrics on"]["step_seconds"]
        / eager_on["step_seconds"],
    }
    if "orch bf16 torch.compile, metrics on" in results:
        summary["compile_speedup"] = (
            eager_on["step_seconds"] / results["orch bf16 torch.compile, metrics on"]["step_seconds"]
        )
    for key, value in summary.items():
        print(f"  {key.replace('_', ' ')}: {ratio(value)}")
    print("  target: MFU >= 45% in bf16 on an H100/H200-class GPU")
    print(f"done in {time.perf_counter() - started:.0f} s")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"runs": results, "summary": summary, "steps": steps}, indent=2)
        )
    return 0


def _peak_flops(device_name: str | None) -> float | None:
    from orchestrator.runtime_env import RuntimeEnv
    from orchestrator.trainer.mfu import peak_flops  # stdlib-only at import

    return peak_flops(peak_tflops=RuntimeEnv.from_environ().peak_tflops, device_name=device_name)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
