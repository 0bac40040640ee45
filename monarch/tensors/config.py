"""Settings of the tensor engine, from ``MONARCH_TENSOR_*`` environment variables.

Read when used (procs inherit the client's environment), validated here so a
bad value fails with a message naming the variable.
"""

from __future__ import annotations

import os


def _float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number of seconds") from None
    if value <= 0:
        raise ValueError(f"{name}={raw!r} must be > 0")
    return value


def timeout() -> float:
    """Seconds a proc waits for a peer (collectives, rendezvous, tensor transfers), and the
    client for a round trip it needs (``MONARCH_TENSOR_TIMEOUT``, default 300)."""
    return _float("MONARCH_TENSOR_TIMEOUT", 300.0)


def store_host() -> str | None:
    """Address other procs use to reach rank 0's rendezvous store (``MONARCH_TENSOR_HOST``)."""
    return os.environ.get("MONARCH_TENSOR_HOST") or None


def backend() -> str | None:
    """Override the ``torch.distributed`` backend (``MONARCH_TENSOR_BACKEND``, e.g. ``gloo``)."""
    return os.environ.get("MONARCH_TENSOR_BACKEND") or None
