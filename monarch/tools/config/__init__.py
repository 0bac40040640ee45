"""Monarch 0.7's ``monarch.tools.config``: a job's scheduler settings and its :class:`Workspace`.

``Config`` is kept for scripts written for Monarch (its test of
``sync_workspace`` builds one to carry the workspace); scheduling here is done
by the jobs of :mod:`monarch.job`, so only ``workspace`` is used.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from monarch.tools.config.environment import CondaEnvironment, Environment
from monarch.tools.config.workspace import Workspace

__all__ = ["NOT_SET", "CondaEnvironment", "Config", "Environment", "Workspace"]

NOT_SET: str = "__NOT_SET__"


@dataclass
class Config:
    """A scheduler's name and arguments, the workspace to mirror, and the job spec (torchx's)."""

    scheduler: str = NOT_SET
    scheduler_args: dict[str, Any] = field(default_factory=dict)
    workspace: Workspace = field(default_factory=Workspace.null)
    dryrun: bool = False
    appdef: Any = None

    def __post_init__(self) -> None:
        if isinstance(self.workspace, str) and self.workspace:  # Monarch's older spelling
            self.workspace = Workspace(dirs={self.workspace: ""})
        elif not self.workspace:
            self.workspace = Workspace.null()
