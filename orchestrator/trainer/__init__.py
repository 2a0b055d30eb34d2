"""The training entrypoint that runs in every pod under torchrun: `python -m orchestrator.trainer`."""
