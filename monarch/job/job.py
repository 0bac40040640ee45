"""Jobs: a declarative request for machines, and the host meshes it yields (Monarch's ``JobTrait``).

A job object is a *specification* (how many hosts, in which named meshes)
plus, once applied, its *state*: the hosts it got, arranged as one
:class:`~monarch.actor.HostMesh` per requested mesh. ``apply()`` brings the
job into existence (a no-op when it already runs); ``state()`` returns the
meshes, applying first if needed. A job pickles (``dump``/``dumps``), so a
second client script can find a still-running job in ``.monarch/job_state.pkl``
and attach to its hosts instead of asking the scheduler again: that is what
``state(cached_path=...)`` does, as in Monarch.

Here the hosts of every job are ``monarch host`` agents on the broker; the
schedulers (:mod:`monarch.job.process`, :mod:`monarch.job.slurm`) only start
them. Subclasses implement four methods: ``_create(client_script)``,
``_state() -> JobState``, ``_kill()`` and ``can_run(spec)``.

``enable_telemetry(TelemetryConfig(...))`` turns on our telemetry
(:mod:`monarch.job.telemetry_config`); ``enable_admin(MeshAdminConfig(...))``
is accepted and starts nothing, the broker being the admin endpoint
(:mod:`monarch.job.admin`). Not here (Monarch 0.7's other side services):
``profile``, ``remote_mount``, ``gather_mount``; they raise NotImplementedError.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import logging
import os
import pickle
import subprocess
import sys
import tempfile
import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

from monarch.actor import HostMesh, this_host
from monarch.job.admin import MeshAdminConfig, admin_config
from monarch.job.command import exec_command
from monarch.job.telemetry_config import TelemetryConfig, apply_telemetry_config

__all__ = [
    "DEFAULT_JOB_PATH",
    "BatchJob",
    "JobState",
    "JobTrait",
    "LocalJob",
    "exec_command",
    "job_load",
    "job_loads",
    "load_current_job",
    "set_current_job",
]

log = logging.getLogger(__name__)

DEFAULT_JOB_PATH: str = ".monarch/job_state.pkl"
_MONARCH_DIR = ".monarch"
_STATE_FILE = "state.pkl"  # a context's cached job: .monarch/<context>/state.pkl
_SPEC_FILE = "spec"  # a context's job spec: the dotted path of a JobTrait
MONARCH_BATCH_JOB_ENV = "MONARCH_BATCH_JOB"  # set on a client script a job runs for us


class JobState:
    """The host meshes of a running job, one attribute per requested mesh name.

    ``state.trainers`` is the HostMesh of the ``trainers`` mesh; an unknown
    name raises AttributeError listing the names there are.
    """

    def __init__(self, hosts: dict[str, HostMesh]) -> None:
        self._hosts = hosts

    def __getattr__(self, attr: str) -> HostMesh:
        if attr.startswith("__") or attr == "_hosts":  # pickle/copy probe dunders first
            raise AttributeError(attr)
        try:
            return self._hosts[attr]
        except KeyError:
            available = ", ".join(sorted(self._hosts))
            raise AttributeError(
                f"'{attr}' is not a valid host mesh name. Available names: {available}"
            ) from None

    def __repr__(self) -> str:
        return f"JobState(hosts={self._hosts})"


class _CachedRunning(NamedTuple):
    """Status of a spec that found a running job in the cache: that job does the work."""

    job: JobTrait


class JobTrait(ABC):
    """A job: a specification of named host meshes, and (once applied) the hosts behind them.

    ``apply()`` creates the job unless it already runs. ``state(cached_path)``
    returns its :class:`JobState`: from this object if it was applied, else
    from a still-running compatible job pickled at ``cached_path`` (the same
    job, attached to from another client script), else by applying this one
    and saving it there. ``kill()`` stops it. Subclasses implement
    ``_create``, ``_state``, ``_kill`` and ``can_run``; they never set the
    status themselves (``apply`` does, after ``_create`` returns).
    """

    admin_config: MeshAdminConfig | None = None  # enable_admin's, if called (kept when pickled)

    def __init__(self) -> None:
        # No arguments, as in Monarch: subclass constructors carry the spec.
        self._status: Literal["running", "not_running"] | _CachedRunning = "not_running"
        self._apply_id: str | None = None

    # -- lifecycle ---------------------------------------------------------------

    @property
    def _running(self) -> JobTrait | None:
        """The job object that owns the running hosts: this one, a cached one, or none."""
        if self._status == "running":
            return self
        if isinstance(self._status, _CachedRunning):
            return self._status.job
        return None

    def apply(self, client_script: str | None = None) -> None:
        """Bring the job into existence; a no-op if it is already running.

        With ``client_script``, the job also runs that script as its client
        (batch mode), where the scheduler supports it.
        """
        if self._running is None:
            self._create(client_script)
            self._apply_id = str(uuid.uuid4())
            self._status = "running"

    @property
    def apply_id(self) -> str | None:
        """A UUID for the current allocation; kept across ``dump``/``load``; None before apply."""
        running = self._running
        return running._apply_id if running is not None else None

    @property
    def active(self) -> bool:
        """Whether this object has (or found in a cache) a running job."""
        return self._running is not None

    def state(self, cached_path: str | None = DEFAULT_JOB_PATH) -> JobState:
        """The job's host meshes, applying the job first if needed.

        If this object is not running and ``cached_path`` holds a running job
        that ``can_run`` this spec, its hosts are reused; an incompatible
        cached job is killed and its file removed. A freshly applied job is
        saved to ``cached_path`` (unless None) for the next script.
        """
        running = self._running
        if running is not None:
            return JobState(dict(running._state()._hosts))
        cached = self._load_cached(cached_path)
        if cached is not None:
            self._status = _CachedRunning(cached)
            log.info("monarch.job: attaching to the running job cached at %s", cached_path)
            return JobState(dict(cached._state()._hosts))
        self.apply()
        hosts = dict(self._state()._hosts)
        if cached_path is not None:
            self.dump(cached_path)
        return JobState(hosts)

    def _load_cached(self, cached_path: str | None) -> JobTrait | None:
        if cached_path is None:
            return None
        try:
            job = job_load(cached_path)
        except FileNotFoundError:
            return None
        running = job._running
        if running is None:
            return None
        if not running.can_run(self):
            log.info(
                "monarch.job: the job cached at %s cannot run this spec: replacing it", cached_path
            )
            try:
                running._kill()
            except Exception:  # a stale cache must never block applying the current spec
                log.warning("monarch.job: could not kill the stale cached job", exc_info=True)
            target = os.path.realpath(cached_path)  # keep a context symlink, drop its target
            try:
                os.remove(target)
            except FileNotFoundError:
                pass
            return None
        return job

    def kill(self) -> None:
        """Stop the job (its hosts and everything on them); the object can be applied again."""
        running = self._running
        if running is not None:
            running._kill()
        self._status = "not_running"

    # -- saving ------------------------------------------------------------------

    def dump(self, filename: str) -> None:
        """Pickle the job to ``filename`` (following a symlink there), readable by its owner only.

        Owner-only because a job may hold what reaches its hosts (a broker
        token, see :mod:`monarch.job.process`). Parent folders are created.
        """
        path = os.path.realpath(filename) if os.path.islink(filename) else filename
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        data = self.dumps()
        # Written beside the target and renamed: a reader never sees half a job.
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".job-", suffix=".tmp")  # mode 0600
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def dumps(self) -> bytes:
        """The job as bytes for :func:`job_loads`."""
        return pickle.dumps(self)

    # -- Monarch's side services (not supported here) -------------------------------

    def enable_telemetry(
        self,
        config: TelemetryConfig | None = None,
        *,
        mesh_admin_config: MeshAdminConfig | None = None,
        **kwargs: Any,
    ) -> JobTrait:
        """Record this job's telemetry (``monarch query``; docs/telemetry.md). Before the
        first mesh: it sets ``MONARCH_TELEMETRY=1`` for the client and its procs.
        ``kwargs`` are ``TelemetryConfig``'s fields; ``mesh_admin_config`` is
        :meth:`enable_admin`'s, as in Monarch."""
        if config is not None and kwargs:
            raise TypeError("enable_telemetry takes a TelemetryConfig or its fields, not both")
        apply_telemetry_config(config if config is not None else TelemetryConfig(**kwargs))
        if mesh_admin_config is not None:
            self.enable_admin(mesh_admin_config)
        return self

    def enable_admin(self, config: MeshAdminConfig | None = None, **kwargs: Any) -> JobTrait:
        """Monarch's admin server, which is the broker here: checks and keeps ``config``
        (``admin_config``), starts nothing (:mod:`monarch.job.admin` says why)."""
        self.admin_config = admin_config(config, kwargs)
        return self

    def remote_mount(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("remote_mount (FUSE) is not supported by monarch over NATS")

    def gather_mount(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("gather_mount (FUSE) is not supported by monarch over NATS")

    # -- what a scheduler implements ---------------------------------------------------

    @abstractmethod
    def _create(self, client_script: str | None) -> None:
        """Start the job's hosts (and ``client_script`` as its client, if given and supported)."""

    @abstractmethod
    def _state(self) -> JobState:
        """The host meshes of the running job (attaching to its hosts)."""

    @abstractmethod
    def _kill(self) -> None:
        """Stop the job's hosts and everything on them."""

    @abstractmethod
    def can_run(self, spec: JobTrait) -> bool:
        """Whether this running job can serve ``spec`` (so a cached job is reused, not replaced)."""


# -- loading --------------------------------------------------------------------------


def job_loads(data: bytes) -> JobTrait:
    """A job from :meth:`JobTrait.dumps` bytes (a pickle: load only what you wrote)."""
    return pickle.loads(data)


def job_load(filename: str = DEFAULT_JOB_PATH) -> JobTrait:
    """A job from a :meth:`JobTrait.dump` file; FileNotFoundError if there is none."""
    with open(filename, "rb") as f:
        return pickle.load(f)


# -- the current context: .monarch/job_state.pkl -> <context>/state.pkl, <context>/spec -----


def _current_spec_file() -> Path:
    link = Path(DEFAULT_JOB_PATH)
    if link.is_symlink():
        return Path(_MONARCH_DIR) / Path(os.readlink(link)).parent / _SPEC_FILE
    return Path(_MONARCH_DIR) / "default" / _SPEC_FILE


def set_current_job(module_path: str) -> None:
    """Make ``module_path`` (``"package.module.job"``, a JobTrait) the current context's job.

    On first use this creates ``.monarch/default/`` and makes
    ``.monarch/job_state.pkl`` a symlink to ``default/state.pkl`` (a plain
    ``job_state.pkl`` from before is moved there), as Monarch does.
    """
    link = Path(DEFAULT_JOB_PATH)
    Path(_MONARCH_DIR).mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        default = Path(_MONARCH_DIR) / "default"
        default.mkdir(parents=True, exist_ok=True)
        if link.exists():
            link.rename(default / _STATE_FILE)
        link.symlink_to(Path("default") / _STATE_FILE)
    spec = _current_spec_file()
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(module_path)


def load_current_job() -> JobTrait:
    """A fresh job object from the current context's spec (not yet applied or attached).

    Raises FileNotFoundError when no spec was set, ValueError for a path
    without a dot, AttributeError for a missing attribute and TypeError when
    it is not a JobTrait.
    """
    spec = _current_spec_file()
    try:
        module_path = spec.read_text().strip()
    except FileNotFoundError:
        raise FileNotFoundError(
            f"No spec found at {spec}. Run 'monarch apply <module.path>' first."
        ) from None
    if "." not in module_path:
        raise ValueError(f"module_path must be 'module.attr', got {module_path!r}")
    module_name, attr = module_path.rsplit(".", 1)
    job = getattr(importlib.import_module(module_name), attr, None)
    if job is None:
        raise AttributeError(f"Module '{module_name}' has no '{attr}' attribute")
    if not isinstance(job, JobTrait):
        raise TypeError(f"'{module_path}' must be a JobTrait, got {type(job).__name__}")
    return job


# -- this machine ----------------------------------------------------------------------


class LocalJob(JobTrait):
    """This machine as the job: every requested mesh is ``this_host()``.

    A stand-in so a script switches between local and cluster runs by
    changing only its job. With ``apply(client_script=...)`` the script runs
    as a detached batch client (logs in ``.monarch/logs/job_*/``) that finds
    this job in ``.monarch/job_state.pkl``.
    """

    def __init__(self, hosts: Sequence[str] = ("hosts",)) -> None:
        super().__init__()
        self._host_names = tuple(hosts)
        self._proc: subprocess.Popen | None = None
        self._log_dir: str | None = None

    def _state(self) -> JobState:
        return JobState({name: this_host() for name in self._host_names})

    def _kill(self) -> None:
        pass  # nothing was allocated

    def can_run(self, spec: JobTrait) -> bool:
        """Never: a LocalJob costs nothing to re-apply, and the spec has the right names."""
        return False

    def _create(self, client_script: str | None) -> None:
        if client_script is None:
            return  # this machine always exists
        BatchJob(self).dump(DEFAULT_JOB_PATH)
        os.makedirs(os.path.join(_MONARCH_DIR, "logs"), exist_ok=True)
        self._log_dir = tempfile.mkdtemp(prefix="job_", dir=os.path.join(_MONARCH_DIR, "logs"))
        env = {**os.environ, MONARCH_BATCH_JOB_ENV: "1"}
        with (
            open(os.path.join(self._log_dir, "stdout.log"), "w") as out,
            open(os.path.join(self._log_dir, "stderr.log"), "w") as err,
        ):
            self._proc = subprocess.Popen(
                [sys.executable, client_script],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
        log.info(
            "monarch.job: client %s runs as pid %d, logs in %s",
            client_script,
            self._proc.pid,
            self._log_dir,
        )

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_proc": None}  # a Popen does not pickle

    @property
    def process(self) -> subprocess.Popen:
        """The batch client started by ``apply(client_script=...)``."""
        if self._proc is None:
            raise ValueError("no local batch job")
        return self._proc


class BatchJob(JobTrait):
    """A job seen from the client script it runs: in batch mode, the cache always fits.

    Written to ``.monarch/job_state.pkl`` before a job starts its client
    script with ``MONARCH_BATCH_JOB=1``; that script's ``job.state()`` then
    attaches to the job it runs in instead of applying a new one.
    """

    def __init__(self, job: JobTrait) -> None:
        super().__init__()
        self._job = job
        self._apply_id = job.apply_id or str(uuid.uuid4())

    @property
    def _running(self) -> JobTrait | None:
        return self

    def can_run(self, spec: JobTrait) -> bool:
        if os.environ.get(MONARCH_BATCH_JOB_ENV) != "1":
            return False
        atexit.register(self._kill)  # the job ends with the client script it ran
        return True

    def _state(self) -> JobState:
        return self._job._state()

    def _create(self, client_script: str | None) -> None:
        self._job._create(client_script)

    def _kill(self) -> None:
        self._job._kill()
