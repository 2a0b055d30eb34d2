"""orch's benchmarks: every claim a ratio measured side by side in one run (`make bench`).

    python -m benchmarks            # everything, a few minutes on 2 cores
    python -m benchmarks --quick    # one round of each, fewer steps: a smoke pass
    python -m benchmarks --only cli --only accum
    python benchmarks/gpu.py        # on a GPU machine: tokens/s and MFU of the gpt task

Benchmarks measure and print; they assert nothing. Results and how they were produced: docs/performance.md.
"""
