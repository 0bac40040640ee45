"""Monarch 0.7's ``MeshAdminConfig`` and ``job.enable_admin(...)``, for a job over NATS.

In Monarch, enabling a job's admin starts a MeshAdminAgent HTTP server that
collects the topology of every host mesh for the admin TUI. There is no such
server here, and none is needed: every process of a job already answers
over the broker, and ``monarch ps`` / ``monarch top`` / ``monarch stacks``
(``--job NAME``) find the job there by its name, from any machine that
reaches the broker. So ``enable_admin`` checks and records the config (it
travels with the pickled job), starts nothing, and says where to look; an
``admin_addr`` is accepted for scripts written for Monarch, with a warning
that nothing listens on it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class MeshAdminConfig:
    """As Monarch 0.7's: ``admin_addr``, where its admin HTTP server would bind (None:
    Monarch's ``mesh_admin_addr``). Here no server is started (see the module)."""

    admin_addr: str | None = None

    def __post_init__(self) -> None:
        if self.admin_addr is not None and not isinstance(self.admin_addr, str):
            raise TypeError(f"admin_addr must be a str or None, got {self.admin_addr!r}")


def admin_config(config: MeshAdminConfig | None, kwargs: dict[str, Any]) -> MeshAdminConfig:
    """The config ``enable_admin(config, **kwargs)`` asks for, checked, and the note for it."""
    if config is not None and kwargs:
        raise TypeError("enable_admin takes a MeshAdminConfig or its fields, not both")
    config = config if config is not None else MeshAdminConfig(**kwargs)
    if not isinstance(config, MeshAdminConfig):
        raise TypeError(f"enable_admin takes a MeshAdminConfig, not {config!r}")
    if config.admin_addr is not None:
        log.warning(
            "MeshAdminConfig(admin_addr=%r): no admin server listens here; `monarch ps`, "
            "`monarch top` and `monarch stacks` read the job through its broker",
            config.admin_addr,
        )
    else:
        log.info("mesh admin: `monarch ps`, `monarch top`, `monarch stacks` read this job")
    return config
