"""A workspace: local project folders and where each goes on the hosts (Monarch 0.7's ``Workspace``).

``HostMesh.sync_workspace(workspace)`` mirrors each folder to
``$WORKSPACE_DIR/<destination>`` on every host of the mesh
(:mod:`monarch.actors.procs.workspace_sync`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from monarch.tools.config.environment import CondaEnvironment, Environment

ACTIVE_CONDA_ENV = CondaEnvironment()


class Workspace:
    """Local folders mapped to folders under each host's ``$WORKSPACE_DIR``.

    ``dirs`` is a list (each folder goes to ``$WORKSPACE_DIR/<its name>``) or
    a dict ``{local: destination}`` (``""``: straight into ``$WORKSPACE_DIR``);
    an empty entry is refused, as it would mirror the working directory by
    accident. ``env`` is the environment the projects run in (the active
    conda environment by default; None for none).
    """

    def __init__(
        self,
        dirs: list[Path | str] | dict[Path | str, str] | None = None,
        env: Environment | None = ACTIVE_CONDA_ENV,
    ) -> None:
        self.env = env
        self.dirs: dict[Path, str] = {}
        if dirs is None:
            return
        pairs = dirs.items() if isinstance(dirs, dict) else ((d, None) for d in dirs)
        for src, dst in pairs:
            assert src, f"{src!r}: an empty folder would mirror the working directory"
            self.dirs[Path(src)] = Path(src).name if dst is None else str(dst)

    @staticmethod
    def null() -> Workspace:
        """No folders and no environment: nothing is mirrored."""
        return Workspace(dirs=None, env=None)

    def merge(self, outdir: str | Path) -> None:
        """Copy every folder into ``outdir``, each at its destination."""
        out = Path(outdir)
        out.mkdir(parents=True, exist_ok=True)
        for src, dst in self.dirs.items():
            shutil.copytree(src, out / dst, dirs_exist_ok=True)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Workspace) and (self.env, self.dirs) == (other.env, other.dirs)

    def __repr__(self) -> str:
        return f"Workspace(dirs={self.dirs!r}, env={self.env!r})"
