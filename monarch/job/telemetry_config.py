"""Monarch 0.7's ``TelemetryConfig`` and ``job.enable_telemetry(...)``, mapped onto our telemetry.

In Monarch, enabling a job's telemetry starts a query service (DataFusion)
and optionally a dashboard on the job's hosts. Here every process of the job
publishes its spans and metrics to the bounded ``monarch-<ns>-telemetry``
stream and ``monarch query`` reads them (docs/telemetry.md), so enabling it
means setting ``MONARCH_TELEMETRY=1`` (and the stream's age limit from
``retention_secs``) for the client and every proc it starts. That must happen
before the client's runtime starts: afterwards it is an error, as changing any
of our settings then is.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from monarch.core.process_runtime import current_runtime_or_none

log = logging.getLogger(__name__)


@dataclass
class TelemetryConfig:
    """As Monarch 0.7's: ``retention_secs`` bounds the telemetry stream's age (0: no
    age limit; its size limit, ``MONARCH_TELEMETRY_MAX_BYTES``, still holds). The
    dashboard and snapshot fields are accepted and have no effect here."""

    retention_secs: int = 3600
    include_dashboard: bool = False
    dashboard_port: int = 8265
    snapshot_interval_secs: float = 30.0


_NO_AGE_LIMIT = str(10 * 365 * 24 * 3600.0)  # JetStream's "unlimited" is 0; our setting is > 0


def apply_telemetry_config(config: TelemetryConfig | None) -> None:
    """Turn telemetry on for this client and the procs it will start."""
    config = config if config is not None else TelemetryConfig()
    if not isinstance(config, TelemetryConfig):
        raise TypeError(f"enable_telemetry takes a TelemetryConfig, not {config!r}")
    if config.retention_secs < 0:
        raise ValueError(f"retention_secs must be >= 0, not {config.retention_secs}")
    rt = current_runtime_or_none()
    if rt is not None and not rt.settings.telemetry:
        raise RuntimeError(
            "enable_telemetry() must come before the first mesh (this process's runtime "
            "already runs with telemetry off); or set MONARCH_TELEMETRY=1 in the environment"
        )
    if config.include_dashboard:
        log.warning("TelemetryConfig(include_dashboard=True): there is no dashboard here; "
                    "query the job's telemetry with `monarch query`")  # fmt: skip
    os.environ["MONARCH_TELEMETRY"] = "1"
    age = str(float(config.retention_secs)) if config.retention_secs else _NO_AGE_LIMIT
    os.environ["MONARCH_TELEMETRY_MAX_AGE"] = age
