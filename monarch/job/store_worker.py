"""The worker child a :class:`~monarch.job.store_job.StoreJob` rank starts (``python -m``).

It listens where its parent rank said (``MONARCH_STORE_WORKER_ADDR``) until a
client attaches, as ``run_worker_loop_forever`` does, and ends as soon as the
parent rank ends: a thread blocks reading a pipe only the parent writes to,
and the kernel closes it when the parent goes, whether it returned, raised or
was killed. Nothing is passed on the command line (``ps`` shows no address).
"""

from __future__ import annotations

import os
import sys
import threading

from monarch.actor import run_worker_loop_forever
from monarch.job.store_job import PARENT_PIPE_ENV, WORKER_ADDR_ENV, WORKER_NAME_ENV


def _end_with_parent(fd: int) -> None:
    """Block until the parent's end of the pipe closes, then end this process at once."""
    try:
        while os.read(fd, 1024):
            pass  # the parent never writes; anything read is ignored
    except OSError as e:
        print(f"monarch worker: lost the pipe to its parent rank ({e}); exiting", file=sys.stderr)
    os._exit(0)  # its procs see their agent go and stop (supervision reports them)


def main() -> None:
    fd = os.environ.get(PARENT_PIPE_ENV)
    if fd is not None:
        threading.Thread(target=_end_with_parent, args=(int(fd),), daemon=True).start()
    run_worker_loop_forever(
        address=os.environ[WORKER_ADDR_ENV], name=os.environ.get(WORKER_NAME_ENV)
    )


if __name__ == "__main__":
    main()
