"""Logging on the procs of a mesh, as remote functions (Monarch's ``monarch.builtins.log``).

``log_remote(msg, *args, level=...)`` logs through the procs' logger
``monarch.builtins.log``; the procs forward log records to the client like
any other output. ``set_logging_level_remote(level)`` sets that logger's
level on every proc. Both run in order with the tensor ops around them and
cost no round trip.
"""

from __future__ import annotations

import logging

from monarch.tensors.remote import remote

logger = logging.getLogger(__name__)


def _nothing(*args: object, **kwargs: object) -> None:
    return None


@remote(propagate=_nothing)
def log_remote(*args: object, level: int = logging.WARNING, **kwargs: object) -> None:
    """``logger.log(level, *args, **kwargs)`` on every proc of the mesh."""
    logger.log(level, *args, **kwargs)


@remote(propagate=_nothing)
def set_logging_level_remote(level: int) -> None:
    """``logger.setLevel(level)`` on every proc of the mesh."""
    logger.setLevel(level)
