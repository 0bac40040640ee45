"""A script that ends the way argv[1] says on the rank argv[2] names (every rank for exit0).

Modes: ``raise`` (an exception), ``exit3`` (``sys.exit(3)``), ``exit0``
(``sys.exit(0)``), ``exitmsg`` (``sys.exit("message")``), ``ok``.
"""

import os
import sys


def train_step(step: int) -> None:
    raise RuntimeError(f"loss went NaN at step {step}")


if __name__ == "__main__":
    mode, on_rank = sys.argv[1], int(sys.argv[2])
    if int(os.environ["RANK"]) == on_rank or mode == "exit0":
        if mode == "raise":
            train_step(1)
        elif mode == "exit3":
            sys.exit(3)
        elif mode == "exit0":
            sys.exit(0)
        elif mode == "exitmsg":
            sys.exit("bad config: no data")
