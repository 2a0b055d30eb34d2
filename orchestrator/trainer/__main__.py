"""`python -m orchestrator.trainer --config train.json` (under torchrun)."""

from torch.distributed.elastic.multiprocessing.errors import record

from orchestrator.trainer.main import main

# record(): a failing rank's traceback goes to torchrun's error file, so the launcher can show it.
record(main)()
