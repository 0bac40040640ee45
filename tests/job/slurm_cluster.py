"""A real one-node Slurm cluster for tests: munged, slurmctld and slurmd in a temp dir.

Everything the cluster needs lives in one private directory (munge key and
socket, ``slurm.conf``, state, spool, logs), so it never touches the
machine's own Slurm or munge set-up: the client commands (``sbatch``,
``squeue``, ...) find it through ``SLURM_CONF``, and slurm.conf names the munge
socket (``AuthInfo=socket=...``). The node is this machine's hostname with a
few CPUs, so one node runs several tasks (several host agents). There are no
cgroups here, hence ``proctrack/linuxproc`` and ``task/none``, and no
accounting database (``sacct`` has nothing to say; ``scontrol``/``squeue`` do).

The daemons must run as root (slurmd starts jobs as their user); when the
binaries or root are missing :func:`unavailable` says why, and the tests skip
with that reason. ``.ci/install-slurm.sh`` installs them in CI.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo", "scontrol")
START_TIMEOUT = 30.0  # seconds for the node to show up idle
CPUS = 4  # task slots on the one node


def unavailable() -> str | None:
    """Why a real Slurm cannot be started here, or None when it can."""
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return (
            f"Slurm/munge binaries missing ({', '.join(missing)}): "
            "run .ci/install-slurm.sh (apt-get install slurm-wlm munge) as root"
        )
    if os.geteuid() != 0:
        return "a test Slurm cluster needs root (slurmd and munged run as root here)"
    return None


def _slurm_conf(d: Path, host: str, ports: tuple[int, int]) -> str:
    return "\n".join(
        [
            "ClusterName=monarchtest",
            f"SlurmctldHost={host}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"SlurmctldPort={ports[0]}",
            f"SlurmdPort={ports[1]}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={d / 'munge.socket'}",
            f"StateSaveLocation={d / 'ctld'}",
            f"SlurmdSpoolDir={d / 'spool'}",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'slurmd.pid'}",
            f"SlurmctldLogFile={d / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/backfill",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "ReturnToService=2",
            "MailProg=/bin/true",
            "MpiDefault=none",
            # This machine may have fewer CPUs than task slots: trust the conf.
            "SlurmdParameters=config_overrides",
            "KillWait=5",
            "MinJobAge=300",
            "SlurmdTimeout=60",
            "InactiveLimit=0",
            f"NodeName={host} CPUs={CPUS} State=UNKNOWN",
            f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class SlurmCluster:
    """munged + slurmctld + slurmd for one node; ``env`` is what a Slurm client needs."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="monarch-slurm-"))
        self.host = socket.gethostname()
        self.conf = self.dir / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self._daemons: list[subprocess.Popen] = []

    def start(self) -> SlurmCluster:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        d = self.dir
        for sub in ("ctld", "spool", "munge"):
            (d / sub).mkdir(mode=0o700)
        os.chmod(d, 0o755)  # munged checks that nobody else can write the socket's directory
        key = d / "munge.key"
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(1024))
        self.conf.write_text(_slurm_conf(d, self.host, (_free_port(), _free_port())))
        self._spawn(
            "munged",
            "--foreground",
            "--force",
            f"--key-file={key}",
            f"--socket={d / 'munge.socket'}",
            f"--pid-file={d / 'munged.pid'}",
            f"--log-file={d / 'munged.log'}",
            f"--seed-file={d / 'munge' / 'seed'}",
        )
        self._wait(lambda: (d / "munge.socket").exists(), "munged did not create its socket")
        self._spawn("slurmctld", "-D", "-i")
        self._spawn("slurmd", "-D")
        self._wait(self._node_idle, f"node {self.host} did not become idle")

    def _spawn(self, *cmd: str) -> None:
        log = open(self.dir / f"{cmd[0]}.out", "wb")
        with log:
            self._daemons.append(
                subprocess.Popen(
                    cmd,
                    env=self.env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def _node_idle(self) -> bool:
        r = self.run("sinfo", "-h", "-N", "-o", "%T", check=False)
        return r.returncode == 0 and r.stdout.strip() == "idle"

    def _wait(self, ready, what: str, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [p.args[0] for p in self._daemons if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{what}: {dead} exited; logs:\n{self.logs()}")
            if ready():
                return
            time.sleep(0.2)
        raise RuntimeError(f"{what} within {timeout} s; logs:\n{self.logs()}")

    def run(
        self, *cmd: str, check: bool = True, timeout: float = 20
    ) -> subprocess.CompletedProcess:
        """Run a Slurm client command against this cluster."""
        return subprocess.run(
            cmd, env=self.env, capture_output=True, text=True, check=check, timeout=timeout
        )

    def logs(self) -> str:
        out = []
        for name in ("munged.log", "slurmctld.log", "slurmd.log", "munged.out", "slurmctld.out"):
            p = self.dir / name
            if p.exists():
                out.append(f"--- {name}\n" + p.read_text(errors="replace")[-3000:])
        return "\n".join(out)

    def stop(self) -> None:
        """Cancel every job, stop the daemons (SIGTERM, then SIGKILL) and remove the directory."""
        if self._daemons:
            self.run("scancel", "--full", "--user=root", check=False)
        for p in reversed(self._daemons):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self._daemons):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)
        self._daemons.clear()
        shutil.rmtree(self.dir, ignore_errors=True)
