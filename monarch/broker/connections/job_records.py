"""Job records: how the same user finds a running job with no flags.

A job's client (the root) writes one small file when its runtime starts and
removes it at shutdown, so that ``monarch ps``/``tail`` (and the NATS CLI, see
:mod:`monarch.broker.connections.nats_context`) run from another terminal can reach the
job, even one on a private embedded broker whose URL and token exist nowhere
else. The file is ``<job name>.json`` in ``$XDG_RUNTIME_DIR/monarch/jobs``
(``~/.local/state/monarch/jobs`` when that is unset). It holds what a tool
needs to reach and read the job: the broker URL with its token, the
credentials the client used with an external broker, the job key when the
job signs its messages. So it is written only as a 0600 file in a 0700
directory of ours, atomically, and never named on a command line.

It also names its owner (pid, process start time, boot; see
:mod:`monarch.broker.connections.ownership`): a job that was SIGKILLed cannot remove its
record, and the next reader or writer recognises it as stale, ignores it and
removes it. Only the root writes a record; procs never do.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import stat
import time
from dataclasses import asdict, dataclass, field
from pathlib import PurePath
from typing import Any

from monarch.broker.connections import nats_context
from monarch.broker.connections.ownership import NOFOLLOW, owner_gone, process_identity

log = logging.getLogger(__name__)

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"  # MONARCH_JOB_NAME; a file name everywhere
_NAME = re.compile(NAME_PATTERN)
_SUFFIX = ".json"
_NAME_TRIES = 16

# What a record may hold besides where the job is: the credentials the client
# itself connected with, by the name of the MONARCH_* setting they come from.
CREDENTIALS = (
    "nats_token",
    "nats_user",
    "nats_password",
    "nats_creds",
    "nats_tls_ca",
    "nats_tls_cert",
    "nats_tls_key",
    "nats_job_key",
)


@dataclass
class JobRecord:
    """A running job as its record describes it (secrets included: never print it whole)."""

    name: str
    url: str  # as the client connected, token included (nats://TOKEN@host:port)
    namespace: str
    owner: dict[str, Any]  # process_identity() of the client
    started_at: float
    script: str  # the client's sys.argv[0]
    embedded: bool  # the broker is the client's own
    credentials: dict[str, str] = field(default_factory=dict)  # CREDENTIALS that were set

    @property
    def pid(self) -> int:
        return int(self.owner["pid"])

    def alive(self) -> bool:
        """Whether the client that wrote this record still runs (False if we cannot tell why not)."""
        try:
            return not owner_gone(self.owner)
        except (KeyError, TypeError, ValueError):
            return False

    def public(self) -> dict[str, Any]:
        """What may be shown to anyone: no token, password or key."""
        return {
            "name": self.name,
            "pid": self.pid,
            "namespace": self.namespace,
            "url": strip_secrets(self.url),
            "started_at": self.started_at,
            "script": self.script,
            "embedded": self.embedded,
        }


def records_dir() -> str:
    """Where this user's job records go: ``$XDG_RUNTIME_DIR/monarch/jobs``, else under ~/.local/state."""
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR")
    if runtime_dir and os.path.isabs(runtime_dir) and os.path.isdir(runtime_dir):
        return os.path.join(runtime_dir, "monarch", "jobs")
    return _state_dir()


def _state_dir() -> str:
    return os.path.join(os.path.expanduser("~"), ".local", "state", "monarch", "jobs")


def _search_dirs() -> list[str]:
    """Where readers look: the writer's place first, then the fallback (a terminal without
    XDG_RUNTIME_DIR, such as one reached by ``su``, still finds a job started from a login one)."""
    dirs = [records_dir()]
    return dirs if dirs[0] == _state_dir() else dirs + [_state_dir()]


def check_name(name: str) -> str:
    """``name`` if it can name a job (letters, digits, ``-``, ``_``; 64 at most), else ValueError."""
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"invalid job name {name!r}: use letters, digits, '-' and '_' "
            "(64 at most, starting with a letter or digit)"
        )
    return name


def default_stem(argv0: str) -> str:
    """The name part a job gets from its script: ``train.py`` -> ``train``; ``-c``, a REPL -> ``python``."""
    stem = ""
    if argv0 not in ("", "-", "-c"):
        path = PurePath(argv0)
        stem = path.parent.name if path.stem == "__main__" else path.stem  # python -m pkg
    stem = re.sub(r"[^A-Za-z0-9_-]+", "-", stem).strip("-_")[:40]
    return stem or "python"


def new_record(
    *,
    url: str,
    namespace: str,
    embedded: bool,
    credentials: dict[str, str | None],
    script: str,
) -> JobRecord:
    """This process's record (its name is chosen by :func:`publish`)."""
    return JobRecord(
        name="",
        url=url,
        namespace=namespace,
        owner=process_identity(os.getpid()),
        started_at=time.time(),
        script=script,
        embedded=embedded,
        credentials={k: v for k, v in credentials.items() if k in CREDENTIALS and v},
    )


class PublishedJob:
    """A record this process wrote; :meth:`remove` takes it (and its NATS context) away."""

    def __init__(self, record: JobRecord, path: str, context_path: str | None) -> None:
        self.record = record
        self.path = path
        self.context_path = context_path
        self._creator = os.getpid()

    @property
    def name(self) -> str:
        return self.record.name

    def remove(self) -> None:
        """Idempotent; in a forked child it does nothing (the record is the parent's)."""
        if os.getpid() != self._creator:
            return
        _unlink(self.path)
        if self.context_path is not None:
            nats_context.remove(self.context_path, self.record.name, self.record.pid)
            self.context_path = None


def publish(record: JobRecord, requested_name: str | None = None) -> PublishedJob | None:
    """Write ``record`` under a name no running job holds, with its NATS context; prune stale ones.

    The name is ``requested_name`` (``MONARCH_JOB_NAME``) when free, else
    ``<script stem>-<4 hex>``; a requested name that a running job holds gets
    the suffix too, with a warning. Returns None (and logs why) if the record
    cannot be written: discovery is a convenience, never a reason for a job to fail.
    """
    try:
        folder = _private_folder(records_dir())
        _prune(folder)
        record.name = _create_exclusive(folder, record, requested_name)
    except OSError as e:
        log.warning("monarch: cannot write this job's record (monarch ps will not find it): %s", e)
        return None
    path = os.path.join(folder, record.name + _SUFFIX)
    context_path = None
    try:
        context_path = nats_context.write(
            record.name, record.pid, record.url, _context_credentials(record.credentials)
        )
    except OSError as e:
        log.warning("monarch: cannot write the NATS context of job %s: %s", record.name, e)
    return PublishedJob(record, path, context_path)


def list_jobs(prune: bool = True) -> list[JobRecord]:
    """The running jobs of this user, oldest first; with ``prune``, stale records are removed."""
    found: dict[str, JobRecord] = {}
    for folder in _search_dirs():
        for record in _read_all(folder, prune):
            found.setdefault(record.name, record)
    if prune:
        _prune_contexts()
    return sorted(found.values(), key=lambda r: (r.started_at, r.name))


def find_job(name: str) -> JobRecord | None:
    """The running job called ``name``, if this user can see one."""
    if not _NAME.fullmatch(name):
        return None
    for folder in _search_dirs():
        record = _read(os.path.join(folder, name + _SUFFIX))
        if record is not None and record.alive():
            return record
    return None


def strip_secrets(url: str) -> str:
    """``url`` (comma-separated servers too) without user, password or token."""
    return nats_context.strip_secrets(url)


# -- writing --------------------------------------------------------------------------


def _private_folder(path: str) -> str:
    """``path`` as a 0700 directory of ours (made, or checked), its ``monarch`` parent too."""
    parent = os.path.dirname(path)
    os.makedirs(os.path.dirname(parent), exist_ok=True)  # $XDG_RUNTIME_DIR, ~/.local/state
    for folder in (parent, path):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
        st = os.lstat(folder)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            raise OSError(f"{folder} is not a directory of ours")
        if st.st_mode & 0o077:
            os.chmod(folder, 0o700)  # made by hand, or by an older umask: close it
    return path


def _create_exclusive(folder: str, record: JobRecord, requested: str | None) -> str:
    """Write the record under the first free name; return that name.

    Exclusive and atomic: the text goes to a private temporary file, which is
    then hard-linked to its name (fails if the name is taken), so two jobs
    starting at once never share a name and a reader never sees half a record.
    """
    stem = requested or default_stem(record.script)
    tmp = os.path.join(folder, f".{os.getpid()}.{secrets.token_hex(4)}.tmp")
    for attempt in range(_NAME_TRIES):
        name = requested if requested and attempt == 0 else f"{stem}-{secrets.token_hex(2)}"
        if len(name) > 64:
            name = f"{stem[: 64 - 5]}-{secrets.token_hex(2)}"
        record.name = name
        text = json.dumps(asdict(record), indent=1)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o600)
        with open(fd, "w") as f:
            f.write(text)
        try:
            os.link(tmp, os.path.join(folder, name + _SUFFIX))
            return name
        except FileExistsError:
            if name == requested:
                log.warning(
                    "monarch: job name %r is taken by a running job; this one gets a suffix", name
                )
        finally:
            _unlink(tmp)
    raise OSError(f"no free job name after {_NAME_TRIES} tries in {folder}")


def _context_credentials(creds: dict[str, str]) -> dict[str, str]:
    return {
        "token": creds.get("nats_token", ""),
        "user": creds.get("nats_user", ""),
        "password": creds.get("nats_password", ""),
        "creds": creds.get("nats_creds", ""),
        "ca": creds.get("nats_tls_ca", ""),
        "cert": creds.get("nats_tls_cert", ""),
        "key": creds.get("nats_tls_key", ""),
    }


# -- reading and pruning ------------------------------------------------------------------


def _read_all(folder: str, prune: bool) -> list[JobRecord]:
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []  # none yet, or not ours to read
    out = []
    for entry in entries:
        if not entry.name.endswith(_SUFFIX) or entry.name.startswith("."):
            continue
        record = _read(entry.path)
        if record is None:
            continue
        if record.alive():
            out.append(record)
        elif prune:
            _unlink(entry.path)
    return out


def _read(path: str) -> JobRecord | None:
    """The record at ``path``, if it is a file of ours that parses (else None: not ours to judge)."""
    try:
        fd = os.open(path, os.O_RDONLY | NOFOLLOW)
        with open(fd) as f:
            if os.fstat(f.fileno()).st_uid != os.getuid():
                return None
            data = json.load(f)
        return JobRecord(**{k: data[k] for k in JobRecord.__dataclass_fields__ if k in data})
    except (OSError, ValueError, TypeError):
        return None


def _prune(folder: str) -> None:
    _read_all(folder, prune=True)
    _prune_contexts()


def _prune_contexts() -> None:
    """Remove the NATS contexts we wrote for jobs that no longer run."""
    for path, name, pid in nats_context.ours():
        record = find_job(name)
        if record is None or record.pid != pid:
            nats_context.remove(path, name, pid)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        log.debug("cannot remove %s: %s", path, e)
