"""The ``MONARCH_*`` variables of the bulk/RDMA layer, read when used.

They are read on each use rather than once (an ``os.environ`` lookup is
cheap next to any transfer), so a test or a benchmark may change them
between transfers. A bad value raises ``ValueError`` naming the variable.

=============================  =========  ==========================================
``MONARCH_RDMA_TRANSPORT``     ``auto``   ``auto`` (best that works: ibverbs, same_host,
                                          tcp) or one of them, forced
``MONARCH_BULK_THRESHOLD``     262144     message bodies above this many bytes travel
                                          out of band (always when over max_payload;
                                          never when 1 KiB or less)
``MONARCH_BULK_TTL``           600        seconds an out-of-band body waits for readers
``MONARCH_BULK_TIMEOUT``       120        seconds a receiver may take to fetch one
``MONARCH_RDMA_HOST``          unset      address the bulk server listens on and
                                          advertises (default: the local address
                                          this process reaches the broker from)
``MONARCH_RDMA_DEVICE``        unset      ibverbs device name (default: the first)
``MONARCH_RDMA_GID_INDEX``     0          ibverbs GID table index (RoCE v2 often needs 1 or 3)
=============================  =========  ==========================================
"""

from __future__ import annotations

import os

TRANSPORTS = ("ibverbs", "same_host", "tcp")


def _number(name: str, default: float, *, integer: bool = False) -> float:
    raw = os.environ.get(name, "")
    if raw == "":
        return default
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected a number") from None
    if value < 0:
        raise ValueError(f"{name}={raw!r}: must not be negative")
    return value


def forced_transport() -> str | None:
    """The transport ``MONARCH_RDMA_TRANSPORT`` forces, or None for ``auto``."""
    raw = os.environ.get("MONARCH_RDMA_TRANSPORT", "").strip().lower().replace("-", "_")
    if raw in ("", "auto"):
        return None
    if raw not in TRANSPORTS:
        raise ValueError(f"MONARCH_RDMA_TRANSPORT={raw!r}: expected auto, {', '.join(TRANSPORTS)}")
    return raw


def bulk_threshold() -> int:
    return int(_number("MONARCH_BULK_THRESHOLD", 256 * 1024, integer=True))


def bulk_ttl() -> float:
    return _number("MONARCH_BULK_TTL", 600.0)


def bulk_timeout() -> float:
    return _number("MONARCH_BULK_TIMEOUT", 120.0)


def bind_host() -> str | None:
    return os.environ.get("MONARCH_RDMA_HOST") or None


def ibverbs_device() -> str | None:
    return os.environ.get("MONARCH_RDMA_DEVICE") or None


def gid_index() -> int:
    return int(_number("MONARCH_RDMA_GID_INDEX", 0, integer=True))
