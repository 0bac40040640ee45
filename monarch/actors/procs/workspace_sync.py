"""``HostMesh.sync_workspace``: mirror local project folders onto every host, over the broker.

Monarch 0.7 runs rsync between the client and each host (``--archive
--delete``); here the files travel as messages like any other (large ones out
of band), so nothing but the broker needs to be reachable. For each folder of
the workspace, a receiver actor on each host (one proc per host, started once
per host mesh) lists what ``$WORKSPACE_DIR/<destination>`` holds (paths and
SHA-256 digests); the client sends only the files that differ and the names of
the ones to remove, and the receiver writes each file beside its target and
renames it into place, so a reader sees the old file or the new one, never half.
What ends up there is what rsync would leave: the same files, folders and
symbolic links, with the same permission bits, and nothing else.

``WORKSPACE_DIR`` is read on each host, in the receiver's environment (an
agent's, or for ``this_host()`` the client's own), as in Monarch. With
``auto_reload=True`` the procs started from this host mesh that are still
running then reload every module loaded from a file the sync changed
(``importlib.reload``; instances made before keep their class's old code).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib
import logging
import os
import stat
import sys
from pathlib import Path
from typing import Any

from monarch.actors.calls.actor import Actor
from monarch.actors.calls.endpoint import endpoint
from monarch.actors.errors import SupervisionError

log = logging.getLogger(__name__)

WORKSPACE_DIR = "WORKSPACE_DIR"
_BATCH_BYTES = 32 * 1024 * 1024  # file bytes per message (larger files go alone)

# A tree's entries by path relative to its root: ("file", sha256 hex, mode bits),
# ("dir",) or ("link", target).
Entry = tuple


def check_destination(dst: str) -> str:
    """``dst`` as a relative path that stays under the workspace root; ValueError otherwise."""
    if not isinstance(dst, str):
        raise TypeError(f"a workspace destination is a str, got {dst!r}")
    norm = os.path.normpath(dst) if dst else ""
    if os.path.isabs(dst) or norm == ".." or norm.startswith(".." + os.sep):
        raise ValueError(f"workspace destination {dst!r} must stay under $WORKSPACE_DIR")
    return "" if norm in ("", ".") else norm


def _digest(path: Path) -> str:
    """SHA-256 of a file, read in chunks (a large file is never held whole)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def scan(root: Path) -> dict[str, Entry]:
    """Every entry under ``root`` (which must be a folder), by relative path."""
    if not root.is_dir():
        raise FileNotFoundError(f"workspace folder {str(root)!r} is not a folder")
    entries: dict[str, Entry] = {}
    for folder, dirnames, filenames in os.walk(root):  # links to folders: not followed
        base = Path(folder)
        for name in [*dirnames, *filenames]:
            path = base / name
            rel = str(path.relative_to(root))
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                entries[rel] = ("link", os.readlink(path))
            elif stat.S_ISDIR(info.st_mode):
                entries[rel] = ("dir",)
            elif stat.S_ISREG(info.st_mode):
                entries[rel] = ("file", _digest(path), stat.S_IMODE(info.st_mode))
    return entries


class WorkspaceReceiver(Actor):
    """One per host: reads and writes that host's ``$WORKSPACE_DIR``."""

    def _root(self, dst: str) -> Path:
        top = os.environ.get(WORKSPACE_DIR)
        if not top or not os.path.isabs(top):
            raise RuntimeError(
                f"{WORKSPACE_DIR} is not set to an absolute path on this host (got {top!r}): "
                "set it in the environment its procs start with (the agent's, or for "
                "this_host() the client's)"
            )
        return Path(top) / check_destination(dst)

    def _inside(self, root: Path, rel: str) -> Path:
        """``root / rel``, refused if it would leave ``root`` (``..``, absolute, or a link)."""
        path = root / rel
        top = os.path.realpath(root)
        if (
            os.path.isabs(rel)
            or ".." in Path(rel).parts
            or os.path.commonpath([os.path.realpath(path.parent), top]) != top
        ):
            raise ValueError(f"workspace path {rel!r} leaves its folder")
        return path

    @endpoint
    def listing(self, dst: str) -> dict[str, Entry]:
        """What the destination holds now (nothing if it does not exist yet)."""
        root = self._root(dst)
        return scan(root) if root.is_dir() else {}

    @endpoint
    def apply(
        self,
        dst: str,
        folders: list[str],
        links: dict[str, str],
        files: dict[str, tuple[bytes, int]],
        remove: list[str],
    ) -> list[str]:
        """Make the destination hold these; the absolute paths of the files that changed."""
        root = self._root(dst)
        root.mkdir(parents=True, exist_ok=True)
        changed = []
        for rel in remove:  # deepest first, so a folder is empty when its turn comes
            path = self._inside(root, rel)
            if path.is_symlink() or path.is_file():
                path.unlink()
                changed.append(str(path))
            elif path.is_dir():
                os.rmdir(path)
        for rel in folders:
            self._inside(root, rel).mkdir(parents=True, exist_ok=True)
        for rel, target in links.items():
            path = self._inside(root, rel)
            if path.is_symlink() or path.exists():
                path.unlink()
            os.symlink(target, path)
        for rel, (data, mode) in files.items():
            path = self._inside(root, rel)
            if path.is_symlink():
                path.unlink()
            tmp = path.with_name(f".{path.name}.monarch-sync-{os.getpid()}")
            tmp.write_bytes(data)
            os.chmod(tmp, mode)
            os.replace(tmp, path)
            changed.append(str(path))
        return changed


class ModuleReloader(Actor):
    """Spawned on a proc mesh for ``auto_reload``: reloads modules whose files changed."""

    @endpoint
    def reload(self, paths: list[str]) -> list[str]:
        wanted = {os.path.realpath(p) for p in paths}
        reloaded = []
        for name, module in list(sys.modules.items()):
            file = getattr(module, "__file__", None)
            if module is not None and file and os.path.realpath(file) in wanted:
                importlib.reload(module)
                reloaded.append(name)
        return sorted(reloaded)


def _plan(
    src: dict[str, Entry], dst: dict[str, Entry]
) -> tuple[list[str], dict[str, str], list[str], list[str]]:
    """(folders, links, files to send, paths to remove) that turn ``dst`` into ``src``."""
    folders = sorted(r for r, e in src.items() if e[0] == "dir" and dst.get(r) != e)
    links = {r: e[1] for r, e in src.items() if e[0] == "link" and dst.get(r) != e}
    files = sorted(r for r, e in src.items() if e[0] == "file" and dst.get(r) != e)
    # Gone, or of another kind (a folder that became a file): removed first.
    remove = [r for r, e in dst.items() if r not in src or src[r][0] != e[0]]
    remove.sort(key=lambda r: r.count(os.sep), reverse=True)
    return folders, links, files, remove


def _batches(root: Path, src: dict[str, Entry], files: list[str]) -> list[dict]:
    """The files' bytes and modes, in messages of about ``_BATCH_BYTES``."""
    out: list[dict] = [{}]
    size = 0
    for rel in files:
        data = (root / rel).read_bytes()
        if out[-1] and size + len(data) > _BATCH_BYTES:
            out.append({})
            size = 0
        out[-1][rel] = (data, src[rel][2])
        size += len(data)
    return out


async def sync(receivers: Any, procs: list[Any], workspace: Any, auto_reload: bool) -> None:
    """Mirror ``workspace.dirs`` through ``receivers`` (one per host); then reload if asked."""
    changed: list[str] = []
    for local, dst in workspace.dirs.items():
        dst = check_destination(str(dst))
        root = Path(local).expanduser().resolve()
        src = await asyncio.to_thread(scan, root)
        listings = await receivers.listing.call(dst)
        for point, held in listings.items():
            folders, links, files, remove = _plan(src, held)
            if not (folders or links or files or remove):
                continue
            host = receivers.slice(**point) if point.extent.labels else receivers
            batches = await asyncio.to_thread(_batches, root, src, files)
            for i, batch in enumerate(batches):
                first = i == 0
                changed += await host.apply.call_one(
                    dst,
                    folders if first else [],
                    links if first else {},
                    batch,
                    remove if first else [],
                )
    if auto_reload and changed:
        for pm in procs:
            try:
                reloader = pm.spawn("_module_reloader", ModuleReloader)
            except SupervisionError as e:  # a proc mesh that is gone has nothing to reload
                log.warning("auto_reload: proc mesh %r did not reload: %s", pm._state.name, e)
                continue
            reloader._state.internal = True
            try:
                await reloader.reload.call(changed)  # a module that fails to load raises here
            except SupervisionError as e:
                log.warning("auto_reload: proc mesh %r did not reload: %s", pm._state.name, e)
            finally:
                with contextlib.suppress(Exception):
                    await reloader.stop()
