"""A running job as a NATS CLI context: ``nats --context <job> sub 'mon.>'`` just works.

The ``nats`` command keeps named connection settings as JSON files in
``$XDG_CONFIG_HOME/nats/context/<name>.json`` (``~/.config/nats/context``
when unset), with the fields of ``natscontext`` in nats-io/jsm.go
(``description``, ``url``, ``token``, ``user``, ``password``, ``creds``,
``nkey``, ``cert``, ``key``, ``ca``, ...). Next to each job record
(:mod:`monarch.broker.connections.job_records`) we write one for the job, 0600, and
remove it with the record. Ours are marked by their description,
``monarch job <name> (pid N)``: only files carrying that mark are ever
replaced or removed, so a context the user made by hand is left alone.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

from monarch.broker.connections.ownership import NOFOLLOW, write_private

_MARK = re.compile(r"^monarch job ([A-Za-z0-9_-]+) \(pid (\d+)\)$")
_FIELDS = ("token", "user", "password", "creds", "nkey", "cert", "key", "ca")


def context_dir() -> str:
    """Where the NATS CLI looks for contexts (as ``natscontext`` computes it)."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "nats", "context")


def description(name: str, pid: int) -> str:
    """The mark of the context we wrote for job ``name`` run by ``pid``."""
    return f"monarch job {name} (pid {pid})"


def write(name: str, pid: int, url: str, credentials: dict[str, str]) -> str | None:
    """Write job ``name``'s context; its path, or None where a context of the user's has that name.

    ``url`` may carry the token (``nats://TOKEN@host:port``, the embedded
    broker's) or user and password: they go to the context's own fields, the
    URL is written without them. ``credentials`` holds the context fields the
    client connected with (token, user, password, creds, cert, key, ca).
    """
    folder = context_dir()
    os.makedirs(os.path.dirname(folder), mode=0o700, exist_ok=True)
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    path = os.path.join(folder, name + ".json")
    if os.path.lexists(path) and _mark_of(path) is None:
        return None  # the user's own context: not ours to replace
    write_private(path, json.dumps(settings(name, pid, url, credentials), indent=2))
    return path


def settings(name: str, pid: int, url: str, credentials: dict[str, str]) -> dict[str, str]:
    """The context's JSON fields for the job."""
    servers = [split_userinfo(u) for u in url.split(",") if u.strip()]
    user = next((u for _, u, _ in servers if u), None)
    password = next((p for _, _, p in servers if p), None)
    ctx = {"description": description(name, pid), "url": ",".join(s for s, _, _ in servers)}
    ctx.update({f: credentials.get(f) or "" for f in _FIELDS})
    if user is not None and password is None and not ctx["token"]:
        ctx["token"] = user  # nats://TOKEN@host:port
    elif user is not None and password is not None and not ctx["user"]:
        ctx["user"], ctx["password"] = user, password
    return ctx


def ours() -> Iterator[tuple[str, str, int]]:
    """``(path, job name, pid)`` of each context we wrote that is still there."""
    try:
        entries = list(os.scandir(context_dir()))
    except OSError:
        return
    for entry in entries:
        if entry.name.endswith(".json"):
            mark = _mark_of(entry.path)
            if mark is not None:
                yield entry.path, mark[0], mark[1]


def remove(path: str, name: str, pid: int) -> None:
    """Remove the context at ``path`` if it is still the one we wrote for ``name`` run by ``pid``."""
    if _mark_of(path) == (name, pid):
        try:
            os.unlink(path)
        except OSError:
            pass


def strip_secrets(url: str) -> str:
    """``url`` (comma-separated servers too) without user, password or token."""
    return ",".join(split_userinfo(u)[0] for u in url.split(","))


def split_userinfo(url: str) -> tuple[str, str | None, str | None]:
    """``(url without userinfo, user or token, password)`` of one server URL."""
    url = url.strip()
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None, None
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=host)), parts.username, parts.password


def _mark_of(path: str) -> tuple[str, int] | None:
    """``(job name, pid)`` if ``path`` is a regular file of ours with our mark."""
    try:
        fd = os.open(path, os.O_RDONLY | NOFOLLOW)
        with open(fd) as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
                return None
            match = _MARK.fullmatch(json.load(f).get("description", ""))
    except (OSError, ValueError, AttributeError):
        return None
    return (match.group(1), int(match.group(2))) if match else None
