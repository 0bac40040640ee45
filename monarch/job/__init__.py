"""Jobs: where a script's hosts come from (this machine, local processes, Slurm), as in Monarch.

This module only re-exports; see :mod:`monarch.job.job` for the model
(``JobTrait``, ``state()``, the ``.monarch/job_state.pkl`` cache).
"""

from monarch.actor import hosts_from_config
from monarch.job.admin import MeshAdminConfig
from monarch.job.job import (
    DEFAULT_JOB_PATH,
    JobState,
    JobTrait,
    LocalJob,
    exec_command,
    job_load,
    job_loads,
    load_current_job,
    set_current_job,
)
from monarch.job.port_forward import PortForwarder
from monarch.job.process import ProcessJob
from monarch.job.service_identity import (
    SERVICE_PROC_IDS_ENV,
    SERVICE_PROC_RANK_ENV,
    deserialize_service_proc_ids,
    new_service_proc_id,
    ranked_service_proc_id_from_env,
    serialize_service_proc_ids,
    service_proc_addr,
    service_proc_addrs,
)
from monarch.job.shell import shell
from monarch.job.slurm import SlurmJob
from monarch.job.telemetry_config import TelemetryConfig

__all__ = [
    "DEFAULT_JOB_PATH",
    "JobState",
    "JobTrait",
    "LocalJob",
    "MeshAdminConfig",
    "PortForwarder",
    "ProcessJob",
    "SERVICE_PROC_IDS_ENV",
    "SERVICE_PROC_RANK_ENV",
    "SlurmJob",
    "TelemetryConfig",
    "deserialize_service_proc_ids",
    "exec_command",
    "hosts_from_config",
    "job_load",
    "job_loads",
    "load_current_job",
    "new_service_proc_id",
    "ranked_service_proc_id_from_env",
    "serialize_service_proc_ids",
    "service_proc_addr",
    "service_proc_addrs",
    "set_current_job",
    "shell",
]
