"""The ``MONARCH_*`` variables of the bulk/RDMA layer, read when used.

They are read on each use rather than once (one variable's lookup and
validation is cheap next to any transfer), so a test or a benchmark may change
them between transfers. :class:`RdmaSettings` declares them in the project's
settings style (:class:`monarch.broker.settings.EnvSettings`: pydantic, field
``x`` is ``MONARCH_X``); a bad value raises ``ValueError`` naming the variable.

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

from pydantic import Field, field_validator

from monarch.broker.settings import EnvSettings

TRANSPORTS = ("ibverbs", "same_host", "tcp")


class RdmaSettings(EnvSettings):
    """The bulk/RDMA layer's ``MONARCH_*`` variables (the table above)."""

    rdma_transport: str = Field(
        "auto", description="auto (best that works) or one of ibverbs, same_host, tcp, forced."
    )
    bulk_threshold: int = Field(
        256 * 1024, ge=0, description="Bodies above this many bytes travel out of band."
    )
    bulk_ttl: float = Field(600.0, ge=0, description="Seconds an out-of-band body waits.")
    bulk_timeout: float = Field(120.0, ge=0, description="Seconds a receiver may take to fetch.")
    rdma_host: str | None = Field(None, description="Address the bulk server listens on.")
    rdma_device: str | None = Field(None, description="ibverbs device name.")
    rdma_gid_index: int = Field(0, ge=0, description="ibverbs GID table index.")

    @field_validator("rdma_transport", mode="before")
    @classmethod
    def _one_of_the_transports(cls, raw: object) -> str:
        value = str(raw).strip().lower().replace("-", "_") or "auto"
        if value != "auto" and value not in TRANSPORTS:
            raise ValueError(f"expected auto, {', '.join(TRANSPORTS)}")
        return value


def forced_transport() -> str | None:
    """The transport ``MONARCH_RDMA_TRANSPORT`` forces, or None for ``auto``."""
    value = RdmaSettings.read("rdma_transport")
    return None if value == "auto" else value


def bulk_threshold() -> int:
    return RdmaSettings.read("bulk_threshold")


def bulk_ttl() -> float:
    return RdmaSettings.read("bulk_ttl")


def bulk_timeout() -> float:
    return RdmaSettings.read("bulk_timeout")


def bind_host() -> str | None:
    return RdmaSettings.read("rdma_host")


def ibverbs_device() -> str | None:
    return RdmaSettings.read("rdma_device")


def gid_index() -> int:
    return RdmaSettings.read("rdma_gid_index")
