"""Monarch as a remote torchrun (Monarch 0.7's ``monarch.job.spmd``): serve once, run many times.

``serve(command)`` takes the torchrun command a user would type and gets the
hosts for it once (this machine, or a Slurm allocation); each
``job.run_spmd()`` then starts ``--nproc-per-node`` fresh procs on every host,
gives them torch elastic's environment (:class:`~monarch.spmd.SPMDActor`) and
runs the script there, as torchrun's workers would run it. The procs are
stopped when the script ends, so edit the script and call ``run_spmd()``
again: same hosts, no new allocation, the new code::

    from monarch.job.spmd import serve

    job = serve(["torchrun", "--nproc-per-node=4", "--standalone", "train.py"],
                scheduler="local_cwd")
    job.run_spmd()

A failing rank raises at ``run_spmd()`` (an ``ActorError`` naming the rank),
the other ranks' procs are stopped, and the hosts stay for the next run.
``serve`` also saves the job to ``.monarch/job_state.pkl``, so another script
(or a restarted notebook) gets it back with ``job_load()``.

Where the hosts come from (``scheduler``): ``"local_cwd"`` or ``"local"``,
this machine; ``"slurm"``, a Slurm job of one host per replica
(:class:`~monarch.job.slurm.SlurmJob`; ``scheduler_cfg`` keys ``partition``,
``time``, ``account``, ``qos``, ``job_dir``). Monarch 0.7 schedules through
torchx and defaults to Meta's MAST; here the default is this machine and no
torchx is needed. An ``AppDef`` (torchx's, or anything with its ``roles``)
is read for its one role's ``entrypoint``, ``args``, ``num_replicas`` and
``env``; its image and workspace are not shipped (the hosts must already
have the code, as Slurm's nodes share a file system).

:class:`StoreJob` (in :mod:`monarch.job.store_job`) is the other direction:
Monarch inside a job torchrun started.
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from monarch.job.job import DEFAULT_JOB_PATH, JobState, JobTrait, LocalJob
from monarch.job.slurm import SlurmJob
from monarch.job.store_job import StoreJob
from monarch.job.torchrun_command import TorchrunCommand, parse_torchrun, starts_command
from monarch.spmd.elastic_env import spawn_with_master

__all__ = ["SPMDJob", "StoreJob", "serve"]

_LOCAL = ("local_cwd", "local")
_SLURM_CFG = {  # torchx's slurm option -> SlurmJob's argument
    "partition": "partition",
    "time": "time_limit",
    "account": "account",
    "qos": "qos",
    "job_dir": "log_dir",
}
_MESH = "workers"  # the host mesh's name in the job's state, as in Monarch


class AppDefLike(Protocol):
    """What is read of a torchx ``AppDef``: its roles (exactly one)."""

    roles: list[Any]


def _apply_env(env: Mapping[str, str]) -> None:
    """A proc's bootstrap: the role's environment, before any actor (or CUDA) starts."""
    os.environ.update(env)


def _from_appdef(app: Any) -> tuple[list[str], int, dict[str, str]]:
    """(command, hosts, env) of an AppDef's single role."""
    roles = list(getattr(app, "roles", None) or [])
    if len(roles) != 1:
        raise ValueError(
            f"an SPMD job has exactly one role, this AppDef has {len(roles)}: "
            "give each role its own serve()"
        )
    role = roles[0]
    args = [str(a) for a in (getattr(role, "args", None) or [])]
    entrypoint = str(getattr(role, "entrypoint", "") or "")
    # A torchrun or python entrypoint starts the command; any other is a wrapper
    # (workspace/entrypoint.sh) that runs its arguments, which are the command.
    command = [entrypoint, *args] if starts_command(entrypoint) else args
    hosts = int(getattr(role, "num_replicas", 1) or 1)
    return command, hosts, dict(getattr(role, "env", None) or {})


def _hosts_job(scheduler: str, hosts: int, cfg: Mapping[str, Any], name: str) -> JobTrait:
    """The job that provides the hosts: this machine or a Slurm allocation."""
    if scheduler in _LOCAL:
        if cfg:
            raise ValueError(f"scheduler {scheduler!r} takes no scheduler_cfg, got {dict(cfg)}")
        if hosts != 1:
            raise ValueError(f"scheduler {scheduler!r} runs on this one host, not {hosts} hosts")
        return LocalJob(hosts=(_MESH,))
    if scheduler == "slurm":
        unknown = sorted(set(cfg) - set(_SLURM_CFG))
        if unknown:
            raise ValueError(
                f"scheduler_cfg keys not understood for slurm: {unknown}; "
                f"known: {sorted(_SLURM_CFG)}"
            )
        kwargs = {_SLURM_CFG[k]: (str(v) if k == "time" else v) for k, v in cfg.items()}
        return SlurmJob(meshes={_MESH: hosts}, job_name=name, **kwargs)
    raise ValueError(
        f"scheduler {scheduler!r} is not supported here; use 'local_cwd' (this machine) or "
        "'slurm' (Meta's MAST schedulers are not available outside Meta)"
    )


def serve(
    appdef: AppDefLike | Sequence[str],
    scheduler: str = "local_cwd",
    scheduler_cfg: Mapping[str, Any] | None = None,
) -> SPMDJob:
    """Get hosts for a torchrun command (or an ``AppDef``) once; run it with ``run_spmd()``.

    ``appdef``: a torchrun command as a list
    (``["torchrun", "--nproc-per-node=4", "--standalone", "train.py"]``),
    which runs on one host (``--nnodes`` above 1 is refused, as in Monarch),
    or an ``AppDef`` whose role has ``num_replicas`` hosts. The command is
    checked here: a wrong one raises ``ValueError`` before anything starts.
    A stale ``.monarch/job_state.pkl`` is removed (with a warning) and the
    new job saved there.
    """
    if isinstance(appdef, (str, bytes)):
        raise TypeError("give the command as a list of words, e.g. ['torchrun', ..., 'train.py']")
    if isinstance(appdef, Sequence):
        command, hosts, env, name = list(appdef), 1, {}, "spmd-job"
        parsed = parse_torchrun(command)
        if parsed.nnodes not in (None, 1):
            raise ValueError(
                f"--nnodes={parsed.nnodes}: a command list runs on one host; for several, "
                "serve an AppDef with num_replicas hosts on a cluster scheduler"
            )
    else:
        command, hosts, env = _from_appdef(appdef)
        name = str(getattr(appdef, "name", "") or "spmd-job")
        parsed = parse_torchrun(command)
        if parsed.nnodes not in (None, hosts):
            raise ValueError(
                f"--nnodes={parsed.nnodes} but the role has num_replicas={hosts}: they must agree"
            )
    hosts_job = _hosts_job(scheduler, hosts, dict(scheduler_cfg or {}), name)
    if os.path.exists(DEFAULT_JOB_PATH):
        warnings.warn(f"Removing stale job state file: {DEFAULT_JOB_PATH}", stacklevel=2)
        os.remove(DEFAULT_JOB_PATH)
    job = SPMDJob(hosts_job, parsed, scheduler, env)
    job.apply()
    print(f"Launched: {job.handle}")
    job.dump(DEFAULT_JOB_PATH)
    return job


class SPMDJob(JobTrait):
    """A served torchrun command and the hosts it runs on (``state().workers``).

    Made by :func:`serve`; pickles with its hosts (``job_load`` gets it back).
    """

    def __init__(
        self,
        hosts: JobTrait,
        command: TorchrunCommand,
        scheduler: str,
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__()
        self._hosts = hosts
        self._command = command
        self._scheduler = scheduler
        self._env = dict(env or {})

    @property
    def handle(self) -> str:
        """Where the hosts are: ``local_cwd://<apply id>`` or ``slurm://<job id>``."""
        if isinstance(self._hosts, SlurmJob):
            return f"slurm://{self._hosts.job_id}"
        return f"{self._scheduler}://{self.apply_id}"

    def _create(self, client_script: str | None) -> None:
        if client_script is not None:
            raise ValueError("an SPMDJob runs its command with run_spmd(), not a client script")
        self._hosts.apply()

    def _state(self) -> JobState:
        return JobState({_MESH: self._hosts.state(cached_path=None).workers})

    def _kill(self) -> None:
        self._hosts.kill()

    def can_run(self, spec: JobTrait) -> bool:
        """Another SPMD job on the same scheduler while these hosts are still there."""
        if not isinstance(spec, SPMDJob) or spec._scheduler != self._scheduler:
            return False
        running = self._hosts._running
        return running is not None and (self._scheduler in _LOCAL or running.can_run(spec._hosts))

    def run_spmd(self) -> None:
        """Run the command once on fresh procs of every host; returns when every rank is done.

        A rank whose script raises makes it raise that ``ActorError``; one that
        exits non-zero or dies, a ``SupervisionError`` (docs/spmd.md). The
        procs are stopped either way.
        """
        workers = self.state(cached_path=None).workers
        per_host = {"gpus": self._command.nproc_per_node}
        bootstrap = functools.partial(_apply_env, self._env) if self._env else None
        procs = workers.spawn_procs(per_host=per_host, bootstrap=bootstrap)
        try:
            actors, addr, port = spawn_with_master(procs)
            actors.main.call(addr, port, self._command.script_args).get()
        finally:
            with contextlib.suppress(Exception):  # a failed rank may have taken its proc
                procs.stop().get(timeout=60)
