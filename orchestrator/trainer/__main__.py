"""`python -m orchestrator.trainer --config train.json` (under torchrun)."""

import os
import sys

from torch.distributed.elastic.multiprocessing.errors import record

from orchestrator import exit_codes, hardware
from orchestrator.storage import StorageError
from orchestrator.trainer.compat import TorchTooOld
from orchestrator.trainer.data import DataError
from orchestrator.trainer.exits import exit_now
from orchestrator.trainer.main import main
from orchestrator.trainer.preflight import PreflightFailed
from orchestrator.trainer.results import ResultsNotKept

# record(): a failing rank's traceback goes to torchrun's error file, so the launcher can show it.
try:
    code = record(main)()  # 0, or 128+signal after a stop that wrote its checkpoint (trainer/stop.py)
except (TorchTooOld, StorageError, DataError) as error:  # one line, not a traceback: the fix is the image,
    # the store or the data
    print(f"error: {error}", file=sys.stderr, flush=True)
    os._exit(exit_codes.REFUSED)
except ResultsNotKept as error:  # one line naming what is not where asked; the last checkpoint is written
    print(f"error: {error}", file=sys.stderr, flush=True)
    os._exit(exit_codes.RESULTS_NOT_KEPT)
except PreflightFailed as error:  # one line naming the bad rank; the launcher reads OUT/preflight.json
    print(f"error: {error}", file=sys.stderr, flush=True)
    os._exit(hardware.EXIT_CODE)
except BaseException as error:  # noqa: BLE001 (record() has written the error file; this only exits)
    # Leave now, without the interpreter's wait for non-daemon threads: an async checkpoint's save thread
    # (DCP's) may be blocked in a collective with ranks that are gone, which held a Ctrl-C'd rank ~30 s
    # until the launcher SIGKILLed it. The write it was doing is never finalized (no marker), so it is
    # ignored, and removed at the next start.
    exit_now(error)
# Everything is written, flushed and closed; the process group is destroyed. Skip the interpreter's
# finalisation: destructors of gloo's background threads running then occasionally abort the process
# ("terminate called without an active exception", SIGABRT) after a successful run, about 1 run in 10
# with 4 ranks on a busy machine, which would turn success into a failed rank. A known upstream problem
# (Gloo worker threads releasing tensors during interpreter teardown; pytorch/pytorch#179291 tried an atexit
# fix and was abandoned as harder than it looks). The cost: atexit handlers of user tasks do not run.
sys.stdout.flush()
sys.stderr.flush()
os._exit(code or 0)
