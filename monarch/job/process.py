"""``ProcessJob``: a multi-host job made of local processes, for trying cluster code on one machine.

Each requested host is a ``monarch host`` agent started as a child process,
labelled ``mesh=<name>`` and ``job=<id>``; the job's state is one HostMesh
per mesh, built from those agents as ``attach_to_workers`` builds any other
(here by their names, so mesh order is start order). Procs spawned on a
host run under its agent, exactly as on a cluster.

Agents meet the client on its broker. With ``MONARCH_NATS_URL`` unset that
is the client's embedded broker: its URL and token reach the agents in
their environment (never argv), and because that broker dies with the
client, so do the agents (a clean SIGTERM at exit, and the kernel's
parent-death signal if the client is killed). With ``MONARCH_NATS_URL``
set, agents outlive the client script, as Monarch's workers do, until
``kill()``; another script attaches with ``job.state(cached_path=...)``.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass

from monarch.actor import HostMesh
from monarch.broker.connections._pdeathsig import child_dies_with_parent
from monarch.hosts.attach import attach_host_mesh
from monarch.job._broker import client_broker, use_broker
from monarch.job.job import JobState, JobTrait

_READY_TIMEOUT = 60.0  # seconds for an agent to register
_STOP_GRACE = 8.0  # seconds agents get to stop their procs and deregister before SIGKILL


@dataclass
class _Agent:
    """One host of the job: its agent's pid and name (the name is on its argv, the token never)."""

    pid: int
    name: str
    log: str


class ProcessJob(JobTrait):
    """Each host is a local ``monarch host`` process; ``{"trainers": 2, "dataloaders": 1}``.

    ``env`` adds to the agents' environment (and so to their procs').
    ``state(cached_path=None).trainers`` is a HostMesh of extent
    ``{"hosts": 2}``. ``kill()`` stops the agents and every proc on them.
    """

    def __init__(self, meshes: dict[str, int], env: dict[str, str] | None = None) -> None:
        super().__init__()
        if not isinstance(meshes, dict) or not meshes:
            raise ValueError(
                f"meshes must be a non-empty dict of name -> host count, got {meshes!r}"
            )
        for name, count in meshes.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise ValueError(f"mesh name {name!r} must be a Python identifier (state.<name>)")
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ValueError(f"mesh {name!r}: host count must be a positive int, got {count!r}")
        self._meshes = dict(meshes)
        self._env = dict(env or {})
        self._job_id = ""
        self._broker_url = ""
        self._agents: dict[str, _Agent] = {}  # "<mesh>_<i>" -> agent
        self._tmpdir: str | None = None
        self._popens: list[subprocess.Popen] = []  # ours to reap; not pickled
        self._made: list[HostMesh] = []  # meshes state() gave this client; not pickled

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_popens": [], "_made": []}

    # -- creating ------------------------------------------------------------------

    def _create(self, client_script: str | None) -> None:
        if client_script is not None:
            raise RuntimeError("ProcessJob cannot run batch-mode scripts")
        url, embedded = client_broker()
        self._broker_url = url
        self._job_id = uuid.uuid4().hex[:8]
        self._tmpdir = tempfile.mkdtemp(prefix=f"monarch_process_job_{self._job_id}_")
        env = dict(os.environ, **self._env)
        env["MONARCH_NATS_URL"] = url  # the token travels here, in the environment
        # The agents import what this script imports (its folder, its PYTHONPATH).
        paths = [p for p in sys.path if p and os.path.isdir(p)]
        env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), *paths])
        # The parent-death signal fires when the *thread* that started a child ends:
        # tie the agents to us only when started from the main thread.
        tie = embedded and threading.current_thread() is threading.main_thread()
        try:
            for mesh, count in self._meshes.items():
                for i in range(count):
                    self._start_agent(mesh, i, env, tie)
            self._wait_ready()
        except BaseException:  # Ctrl-C too: never leave half a job running
            self._kill()
            raise
        if embedded:  # our broker ends at exit; stop the agents cleanly before it does
            atexit.register(self._kill)

    def _start_agent(self, mesh: str, i: int, env: dict[str, str], tie: bool) -> None:
        key = f"{mesh}_{i}"
        name = f"{mesh}-{i}-{self._job_id}"
        assert self._tmpdir is not None
        log = os.path.join(self._tmpdir, f"{key}.log")
        cmd = [
            sys.executable, "-m", "monarch.cli.main", "host", "--name", name,
            "--labels", f"mesh={mesh},job={self._job_id}",
        ]  # fmt: skip
        preexec = None
        if tie:
            preexec = functools.partial(child_dies_with_parent, os.getpid())
        with open(log, "wb") as out:
            popen = subprocess.Popen(
                cmd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C at our terminal is for the client
                preexec_fn=preexec,
            )
        self._popens.append(popen)
        self._agents[key] = _Agent(popen.pid, name, log)

    def _wait_ready(self, timeout: float = _READY_TIMEOUT) -> None:
        """Until every agent says it serves; an agent that exits first is an error at once."""
        deadline = time.monotonic() + timeout
        waiting = dict(self._agents)
        while waiting:
            for key, agent in list(waiting.items()):
                text = _read(agent.log)
                if " serving " in text:
                    del waiting[key]
                elif not self._agent_runs(agent):
                    raise RuntimeError(
                        f"ProcessJob: the agent for host {key} exited while starting "
                        f"({self._exit_status(agent)}):\n{text[-2000:]}"
                    )
            if waiting and time.monotonic() > deadline:
                raise TimeoutError(
                    f"ProcessJob: host agents {sorted(waiting)} did not start within {timeout} s"
                )
            if waiting:
                time.sleep(0.05)

    def _popen(self, agent: _Agent) -> subprocess.Popen | None:
        """The Popen of an agent this client started (None for a job attached from a file)."""
        return next((p for p in self._popens if p.pid == agent.pid), None)

    def _agent_runs(self, agent: _Agent) -> bool:
        """Whether the agent runs. For an agent this client started, its Popen says:
        ``_alive``'s look at /proc can be wrong for the few microseconds after Popen
        returns, while the kernel still builds the new program's command line (it
        reads as empty then; a busy machine widens that window to a failed start)."""
        popen = self._popen(agent)
        if popen is not None:
            return popen.poll() is None
        return _alive(agent)

    def _exit_status(self, agent: _Agent) -> str:
        """How an agent ended (``exit code 1``, ``killed by SIGKILL``), for error messages."""
        popen = self._popen(agent)
        code = None if popen is None else popen.poll()
        if code is None:
            return "gone" if popen is None else "still running"
        if code < 0:
            return f"killed by {signal.Signals(-code).name}"
        return f"exit code {code}"

    # -- state ---------------------------------------------------------------------

    def _state(self) -> JobState:
        if not self._agents_alive():
            raise RuntimeError(
                "lost connection to worker processes (a host agent of the job exited)"
            )
        use_broker(self._broker_url)
        meshes = {}
        for mesh, count in self._meshes.items():
            names = [self._agents[f"{mesh}_{i}"].name for i in range(count)]
            meshes[mesh] = attach_host_mesh(
                workers=names, labels={"job": self._job_id, "mesh": mesh}, timeout=30.0
            )
        self._made.extend(meshes.values())
        return JobState(meshes)

    def can_run(self, spec: JobTrait) -> bool:
        """The same meshes, and every agent still running."""
        return (
            isinstance(spec, ProcessJob) and spec._meshes == self._meshes and self._agents_alive()
        )

    def _agents_alive(self) -> bool:
        return bool(self._agents) and all(self._agent_runs(a) for a in self._agents.values())

    # -- stopping ------------------------------------------------------------------

    def _kill(self) -> None:
        """Stop the procs this client started on the job, then the agents; SIGKILL what is left.

        Procs are stopped through their meshes first so that their end is an
        orderly stop, not a failure the client would be told about.
        """
        for mesh in self._made:
            with contextlib.suppress(Exception):  # already shut down, or the runtime is gone
                mesh.shutdown().get(timeout=_STOP_GRACE)
        self._made.clear()
        agents = list(self._agents.values())
        doomed = {pid for a in agents if self._agent_runs(a) for pid in _descendants(a.pid)}
        for a in agents:
            if self._agent_runs(a):
                with contextlib.suppress(OSError):
                    os.kill(a.pid, signal.SIGTERM)
        deadline = time.monotonic() + _STOP_GRACE
        while time.monotonic() < deadline and any(self._agent_runs(a) for a in agents):
            self._reap()
            time.sleep(0.05)
        for a in agents:  # stragglers, and procs an agent could not stop
            if self._agent_runs(a):
                doomed |= _descendants(a.pid)
        for pid in doomed:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for popen in self._popens:
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(5)
        self._popens.clear()
        self._agents.clear()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def _reap(self) -> None:
        for popen in self._popens:
            popen.poll()


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _alive(agent: _Agent) -> bool:
    """Whether the agent runs: its pid exists, is no zombie, and is *our* agent (pids are reused).

    For an agent long started (a job attached from a file); one just started by
    this client is asked through its Popen (see ``ProcessJob._agent_runs``).
    """
    try:
        with open(f"/proc/{agent.pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{agent.pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X", "x") and agent.name.encode() in argv


def _descendants(pid: int) -> set[int]:
    """``pid`` and every process below it (from /proc; empty where there is none)."""
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        if p not in found:
            found.add(p)
            todo.extend(children.get(p, []))
    return found
