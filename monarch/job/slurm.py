"""``SlurmJob``: host agents for named meshes, started by one ``sbatch`` (Monarch's ``SlurmJob``).

``SlurmJob(meshes={"trainers": 2})`` submits ONE batch job with one task per
host of every mesh. Each task runs a ``monarch host`` agent named
``<tag>-<SLURM_PROCID>`` and labelled ``mesh=<name>,monarch_job=<tag>``, so two
tasks on the same node are two distinct hosts (a one-node cluster can run a
two-host mesh with ``ntasks_per_node=2``). ``state()`` waits for the job to
run and its agents to register, then returns one HostMesh per mesh, hosts in
task order. ``kill()`` runs ``scancel`` and waits until ``squeue`` no longer
lists the job; Slurm then stops the agents and every proc under them.

Where the broker lives (what makes ``dump``/``state(cached_path=...)`` work
from a second script after the first one exits):

* ``MONARCH_NATS_URL`` set (or ``broker_url=`` given) when the job is applied:
  that broker is used by everyone; it must be reachable from the nodes and
  outlive the client (``monarch broker`` on a login node, a NATS cluster).
* otherwise the batch script starts its own broker (``monarch broker``:
  nats-server with JetStream) on the job's first node with a generated token,
  and writes its URL to ``<job dir>/broker.url``. The client's runtime then
  connects to it, so ``state()`` must come before anything else starts the
  runtime (``this_host()``, spawning), and the broker ends with the job:
  ``kill()`` shuts this process's runtime down.

Secrets never reach a command line: the broker URL, token and other
``MONARCH_NATS_*`` credentials go in ``<job dir>/env`` (0600, in a 0700 job
directory under ``log_dir``, which must be on a filesystem the nodes share),
which the batch script sources; the in-job broker reads its token from a
0600 config file. The job's pickle (``dump``) holds paths, never the token.

Monarch's TCP options (``monarch_port``, ``out_of_cluster``, ``attach_to``,
``bind_to``) have no meaning here: agents open no port, everything goes
through the broker. ``apply(client_script=...)`` (batch mode) is not supported.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import shlex
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from monarch.actor import HostMesh
from monarch.hosts.attach import attach_host_mesh
from monarch.job.job import JobState, JobTrait
from monarch.job.slurm_commands import (
    TERMINAL,
    SlurmJobError,
    job_state,
    read_env,
    release_broker,
    run_slurm,
    use_broker,
    write_private,
)

__all__ = ["SlurmJob", "SlurmJobError"]

log = logging.getLogger(__name__)

_POLL = 0.5  # seconds between two looks at squeue
# Credentials an agent needs to reach an external broker: copied into the job's env file.
_PASSED_ENV = (
    "MONARCH_NATS_URL",
    "MONARCH_NAMESPACE",
    "MONARCH_NATS_TOKEN",
    "MONARCH_NATS_USER",
    "MONARCH_NATS_PASSWORD",
    "MONARCH_NATS_CREDS",
    "MONARCH_NATS_TLS_CA",
    "MONARCH_NATS_TLS_CERT",
    "MONARCH_NATS_TLS_KEY",
    "MONARCH_NATS_JOB_KEY",
    "MONARCH_HEARTBEAT_INTERVAL",
    "MONARCH_HEARTBEAT_TIMEOUT",
)


class SlurmJob(JobTrait):
    """Monarch's ``SlurmJob``: one ``sbatch`` whose tasks are ``monarch host`` agents.

    ``meshes`` maps a mesh name to its number of hosts (tasks). Tasks are
    packed ``ntasks_per_node`` to a node. ``job_start_timeout`` bounds the wait
    in the queue (None: 600 s here, where Monarch waits forever), after which
    the job is cancelled and :class:`SlurmJobError` names its id, state and
    reason; ``agent_timeout`` bounds the wait for the agents of a running job.
    ``python_exe`` runs the agents (default: this interpreter; the nodes must
    see the same path). ``log_dir`` (default: the current directory) holds the
    job directory; it must be shared with the nodes.
    """

    def __init__(
        self,
        meshes: dict[str, int],
        python_exe: str | None = None,
        slurm_args: Sequence[str] = (),
        monarch_port: int = 22222,
        job_name: str = "monarch_job",
        ntasks_per_node: int = 1,
        time_limit: str | None = None,
        partition: str | None = None,
        log_dir: str | None = None,
        exclusive: bool = True,
        gpus_per_node: int | None = None,
        cpus_per_task: int | None = None,
        mem: str | None = None,
        job_start_timeout: int | None = None,
        account: str | None = None,
        qos: str | None = None,
        out_of_cluster: bool = False,
        attach_to: str | None = None,
        bind_to: str | None = None,
        *,
        broker_url: str | None = None,
        agent_timeout: float = 60.0,
    ) -> None:
        super().__init__()
        if not meshes or any(
            isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in meshes.values()
        ):
            raise ValueError(f"meshes must map names to positive host counts, got {meshes!r}")
        if ntasks_per_node < 1:
            raise ValueError(f"ntasks_per_node must be at least 1, got {ntasks_per_node}")
        if out_of_cluster or attach_to is not None or bind_to is not None:
            raise NotImplementedError(
                "out_of_cluster/attach_to/bind_to: agents open no port here; give the client "
                "a broker it can reach instead (MONARCH_NATS_URL or broker_url=)"
            )
        del monarch_port  # agents listen on no port: everything goes through the broker
        self._meshes = dict(meshes)
        self._python_exe = python_exe or sys.executable
        self._slurm_args = tuple(slurm_args)
        self._job_name = job_name
        self._ntasks_per_node = ntasks_per_node
        self._time_limit = time_limit
        self._partition = partition
        self._log_dir = os.path.abspath(log_dir or os.getcwd())
        self._exclusive = exclusive
        self._gpus_per_node = gpus_per_node
        self._cpus_per_task = cpus_per_task
        self._mem = mem
        self._job_start_timeout = 600.0 if job_start_timeout is None else float(job_start_timeout)
        self._account = account
        self._qos = qos
        self._broker_url = broker_url
        self._agent_timeout = agent_timeout
        # Set by _create:
        self._slurm_job_id: str | None = None
        self._tag: str | None = None  # unique per submission: agent names and labels
        self._job_dir: str | None = None
        self._own_broker = False  # the batch script runs the broker

    # -- spec ----------------------------------------------------------------------

    def add_mesh(self, name: str, num_nodes: int) -> None:
        """Ask for one more mesh (before ``apply``)."""
        self._meshes[name] = num_nodes

    @property
    def job_id(self) -> str | None:
        """The Slurm job id once submitted."""
        return self._slurm_job_id

    def _spec(self) -> tuple:
        return (
            self._meshes,
            self._python_exe,
            self._slurm_args,
            self._job_name,
            self._ntasks_per_node,
            self._time_limit,
            self._partition,
            self._exclusive,
            self._gpus_per_node,
            self._cpus_per_task,
            self._mem,
            self._account,
            self._qos,
        )

    def can_run(self, spec: JobTrait) -> bool:
        """Same spec, and this job is still queued or running."""
        return (
            isinstance(spec, SlurmJob)
            and spec._spec() == self._spec()
            and self._slurm_job_id is not None
            and job_state(self._slurm_job_id)[0] not in TERMINAL | {"GONE"}
        )

    # -- submitting ------------------------------------------------------------------

    def _create(self, client_script: str | None) -> None:
        if client_script is not None:
            raise NotImplementedError(
                "SlurmJob batch mode (apply(client_script=...)) is not supported: apply() the "
                "job, then run the client script anywhere that reaches the broker"
            )
        total = sum(self._meshes.values())
        self._tag = f"{self._job_name}-{uuid.uuid4().hex[:8]}"
        job_dir = Path(self._log_dir) / f"monarch_slurm_{self._tag}"
        job_dir.mkdir(mode=0o700, parents=True)
        self._job_dir = str(job_dir)
        url = self._broker_url or os.environ.get("MONARCH_NATS_URL")
        self._own_broker = not url
        env = {k: os.environ[k] for k in _PASSED_ENV if os.environ.get(k)}
        if url:
            env["MONARCH_NATS_URL"] = url
        else:
            token = secrets.token_urlsafe(32)
            env["MONARCH_NATS_TOKEN"] = token
            write_private(job_dir / "nats.conf", f'authorization {{ token: "{token}" }}\n')
        write_private(job_dir / "env", "".join(f"{k}={shlex.quote(v)}\n" for k, v in env.items()))
        (job_dir / "task.sh").write_text(self._task_script())
        script = self._batch_script(total)
        (job_dir / "job.sbatch").write_text(script)
        r = run_slurm("sbatch", "--parsable", str(job_dir / "job.sbatch"))
        if r.returncode != 0:
            raise SlurmJobError(
                f"sbatch refused the job ({job_dir / 'job.sbatch'}): {r.stderr.strip()}"
            )
        self._slurm_job_id = r.stdout.strip().split(";")[0]
        log.info(
            "monarch.job: Slurm job %s submitted (%d host agents); logs in %s",
            self._slurm_job_id,
            total,
            job_dir,
        )

    def _batch_script(self, total: int) -> str:
        d = shlex.quote(self._job_dir or "")
        py = shlex.quote(self._python_exe)
        nodes = math.ceil(total / self._ntasks_per_node)
        directives = [
            f"--job-name={self._tag}",
            f"--nodes={nodes}",
            f"--ntasks={total}",
            f"--ntasks-per-node={min(self._ntasks_per_node, total)}",
            f"--output={self._job_dir}/slurm-%j.out",
        ]
        optional = [
            ("--time", self._time_limit),
            ("--partition", self._partition),
            ("--gpus-per-node", self._gpus_per_node),
            ("--cpus-per-task", self._cpus_per_task),
            ("--mem", self._mem),
            ("--account", self._account),
            ("--qos", self._qos),
        ]
        directives += [f"{flag}={value}" for flag, value in optional if value is not None]
        if self._exclusive:
            directives.append("--exclusive")
        directives += [a for a in self._slurm_args if a.startswith("-")]
        lines = [
            "#!/bin/bash",
            *(f"#SBATCH {d_}" for d_ in directives),
            "set -eu",
            f"set -a; . {d}/env; set +a",
        ]
        if self._own_broker:
            lines += _BROKER_BLOCK.format(dir=d, py=py).splitlines()
        lines += [
            f"srun --kill-on-bad-exit=0 bash {d}/task.sh &",
            "wait $!",
        ]
        return "\n".join(lines) + "\n"

    def _task_script(self) -> str:
        meshes = [name for name, n in self._meshes.items() for _ in range(n)]
        return (
            "#!/bin/bash\n"
            "# One host agent per Slurm task; its mesh follows from SLURM_PROCID.\n"
            f"meshes=({' '.join(shlex.quote(m) for m in meshes)})\n"
            'mesh="${meshes[$SLURM_PROCID]}"\n'
            f"exec {shlex.quote(self._python_exe)} -m monarch.cli.main host"
            f' --name "{self._tag}-$SLURM_PROCID"'
            f' --labels "mesh=$mesh,monarch_job={self._tag},slurm_job=$SLURM_JOB_ID"\n'
        )

    # -- attaching ----------------------------------------------------------------------

    def _error(self, what: str) -> SlurmJobError:
        state, reason = job_state(self._slurm_job_id or "")
        out = Path(self._job_dir or ".") / f"slurm-{self._slurm_job_id}.out"
        tail = out.read_text(errors="replace")[-1500:] if out.exists() else ""
        return SlurmJobError(
            f"Slurm job {self._slurm_job_id} {what} (state {state}"
            f"{f', reason {reason}' if reason and reason != 'None' else ''}); "
            f"log {out}{':' + chr(10) + tail if tail else ''}",
            self._slurm_job_id,
            state,
        )

    def _wait_running(self) -> None:
        deadline = time.monotonic() + self._job_start_timeout
        while True:
            state, _ = job_state(self._slurm_job_id or "")
            if state == "RUNNING":
                return
            if state in TERMINAL or state == "GONE":
                raise self._error("ended before its host agents started")
            if time.monotonic() >= deadline:
                err = self._error(
                    f"did not start within {self._job_start_timeout:g} s; cancelled it"
                )
                self._kill()
                raise err
            time.sleep(_POLL)

    def _connect_broker(self) -> None:
        """In-job broker: point this process's runtime at it (before the runtime starts)."""
        job_dir = Path(self._job_dir or "")
        deadline = time.monotonic() + self._agent_timeout
        while not (job_dir / "broker.url").exists():
            if job_state(self._slurm_job_id or "")[0] != "RUNNING":
                raise self._error("ended before its broker started")
            if time.monotonic() >= deadline:
                raise self._error(f"started no broker within {self._agent_timeout:g} s")
            time.sleep(_POLL)
        url = (job_dir / "broker.url").read_text().strip()
        token = read_env(job_dir / "env").get("MONARCH_NATS_TOKEN", "")
        use_broker(url, token)

    def _state(self) -> JobState:
        if self._slurm_job_id is None or self._tag is None:
            raise SlurmJobError("the Slurm job was never submitted")
        self._wait_running()
        if self._own_broker:
            self._connect_broker()
        hosts: dict[str, HostMesh] = {}
        first = 0
        deadline = time.monotonic() + self._agent_timeout
        for mesh, n in self._meshes.items():
            names = [f"{self._tag}-{i}" for i in range(first, first + n)]
            first += n
            while mesh not in hosts:
                try:
                    hosts[mesh] = attach_host_mesh(
                        workers=names, labels={"monarch_job": self._tag}, timeout=2.0
                    )
                except TimeoutError:
                    if job_state(self._slurm_job_id)[0] != "RUNNING":
                        raise self._error("ended before its host agents registered") from None
                    if time.monotonic() >= deadline:
                        raise self._error(
                            f"runs, but its agents for mesh {mesh!r} did not register within "
                            f"{self._agent_timeout:g} s"
                        ) from None
        return JobState(hosts)

    # -- stopping --------------------------------------------------------------------------

    def _kill(self) -> None:
        """``scancel`` the job and wait (bounded) until squeue no longer lists it."""
        job_id = self._slurm_job_id
        if job_id is None:
            return
        broker = Path(self._job_dir or "", "broker.url")
        if self._own_broker and broker.exists():
            release_broker(broker.read_text().strip())  # our runtime's broker dies with the job
        r = run_slurm("scancel", job_id)
        if r.returncode != 0:
            log.warning("monarch.job: scancel %s: %s", job_id, r.stderr.strip())
        deadline = time.monotonic() + 120
        while True:
            r = run_slurm("squeue", "-h", "-j", job_id, "-o", "%T")
            if not r.stdout.strip():
                break
            if time.monotonic() >= deadline:
                raise SlurmJobError(
                    f"Slurm job {job_id} still listed after scancel: {r.stdout.strip()}",
                    job_id,
                    r.stdout.strip(),
                )
            time.sleep(_POLL)
        for secret in ("env", "nats.conf"):  # the job is over: its credentials go too
            Path(self._job_dir or "", secret).unlink(missing_ok=True)
        self._slurm_job_id = None

    def __repr__(self) -> str:
        return f"SlurmJob(meshes={self._meshes}, job_id={self._slurm_job_id})"


_BROKER_BLOCK = """\
# The job's own broker: nats-server with JetStream on this (the first) node.
# Its token is in nats.conf (0600), never on the command line.
port=$({py} -c 'import socket; s=socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
{py} -m monarch.cli.main broker --port "$port" --store-dir {dir}/nats -- -c {dir}/nats.conf \\
    > {dir}/broker.log 2>&1 &
for _ in $(seq 300); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
export MONARCH_NATS_URL="nats://$(hostname):$port"
echo "$MONARCH_NATS_URL" > {dir}/broker.url.tmp && mv {dir}/broker.url.tmp {dir}/broker.url"""
