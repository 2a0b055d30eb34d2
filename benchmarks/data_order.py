"""9. The epoch's sample order at 10^6 and 10^9 samples: time and memory per optimizer step.

The Feistel order (orchestrator.trainer.data.Permutation) computes a step's B indices from the positions;
the order before it (torch.randperm of the whole dataset, cached per epoch) paid 8 bytes per sample and
built the permutation at the first step of every epoch. Memory is what the order itself allocates:
tracemalloc's peak for the Feistel order (numpy reports its buffers to it), the permutation tensor's bytes
for randperm (run at 10^6 and 10^7 only: 10^9 needs 8 GB, more than a shared 24 GB machine should give).
"""

from __future__ import annotations

import time
import tracemalloc
from typing import Any

import torch

from benchmarks.harness import ms, table
from orchestrator.trainer.data import ORDER_RANDPERM, Layout, _randperm

BATCH = 512


def _feistel(size: int, steps: int) -> dict[str, Any]:
    layout = Layout(dataset_size=size, batch_size=BATCH, micro_batch_size=BATCH, world_size=1, seed=0)
    tracemalloc.start()
    started = time.perf_counter()
    for step in range(steps):
        layout.global_batch(step)
    seconds = (time.perf_counter() - started) / steps
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"order": "feistel", "size": size, "first_step_s": seconds, "step_s": seconds, "bytes": peak}


def _randperm_order(size: int, steps: int) -> dict[str, Any]:
    _randperm.cache_clear()
    layout = Layout(dataset_size=size, batch_size=BATCH, micro_batch_size=BATCH, world_size=1, seed=0,
                    order=ORDER_RANDPERM)  # fmt: skip
    started = time.perf_counter()
    layout.global_batch(0)  # builds the epoch's permutation
    first = time.perf_counter() - started
    started = time.perf_counter()
    for step in range(1, steps + 1):
        layout.global_batch(step)
    seconds = (time.perf_counter() - started) / steps
    nbytes = _randperm(size, 0, 0).element_size() * size
    _randperm.cache_clear()
    return {"order": "randperm", "size": size, "first_step_s": first, "step_s": seconds, "bytes": nbytes}


def order_cost(steps: int = 200) -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    rows = [_feistel(10**6, steps), _feistel(10**9, steps), _randperm_order(10**6, steps),
            _randperm_order(10**7, steps)]  # fmt: skip
    print(f"\n9. epoch order, batch {BATCH}, {steps} steps (time per step; memory of the order)")
    print(table(
        ["order", "samples", "first step", "per step", "memory"],
        [[r["order"], f"{r['size']:.0e}", ms(r["first_step_s"]), ms(r["step_s"]), f"{r['bytes'] / 2**20:.2f} MiB"]
         for r in rows],
    ))  # fmt: skip
    return rows


if __name__ == "__main__":
    order_cost()
