"""Where a workspace's projects get their packages: Monarch 0.7's ``Environment`` types."""

from __future__ import annotations

import os


class Environment:
    """The dependencies a :class:`~monarch.tools.config.workspace.Workspace`'s projects run with."""


class CondaEnvironment(Environment):
    """A conda environment: ``conda_prefix``, or the active one (``CONDA_PREFIX``) when not given."""

    def __init__(self, conda_prefix: str | None = None) -> None:
        self._conda_prefix = conda_prefix

    @property
    def conda_prefix(self) -> str:
        """The environment's folder; AssertionError when none was given and none is active."""
        prefix = self._conda_prefix or os.environ.get("CONDA_PREFIX")
        assert prefix, "no conda environment is active: give conda_prefix or activate one"
        return prefix

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CondaEnvironment) and other._conda_prefix == self._conda_prefix

    def __hash__(self) -> int:
        return hash(self._conda_prefix)
