"""How a rank's process ends when training raised: at once, as Python would have ended it.

Python's own exit waits for every non-daemon thread. An async checkpoint's save thread (DCP's) is one, and it
runs collectives: when the other ranks are gone (a Ctrl-C, a failure elsewhere) it waits out the collective
timeout, and the launcher SIGKILLs the rank first. The write it was doing is never finalized (no marker, no
rename), so it is ignored, and removed at the next start.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from typing import NoReturn


def exit_now(error: BaseException) -> NoReturn:
    """End the process the way `error` would have, without waiting for threads or running the interpreter's
    finalisation: the traceback printed as Python prints it, and Python's exit status (a KeyboardInterrupt
    dies of SIGINT, a SystemExit keeps its code, any other exception is 1)."""
    if isinstance(error, SystemExit):
        code = error.code if isinstance(error.code, int) else (0 if error.code is None else 1)
    else:
        traceback.print_exception(type(error), error, error.__traceback__)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    if isinstance(error, KeyboardInterrupt):
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)
