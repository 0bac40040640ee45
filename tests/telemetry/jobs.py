"""Running the telemetry test job (``tel_actors``) as a real client process, and querying it.

Each run gets a namespace of its own on the session broker, so its stream
and subjects are its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def new_namespace() -> str:
    return f"tel{uuid.uuid4().hex[:10]}"


def _env(nats_url: str, namespace: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MONARCH_", "OTEL_EXPORTER"))}
    env.update(
        PYTHONPATH=str(ROOT),
        MONARCH_NATS_URL=nats_url,
        MONARCH_NAMESPACE=namespace,
        MONARCH_OPEN_BROKER_OK="1",
        **extra,
    )
    return env


def run_job(nats_url: str, namespace: str, *args: str, **env: str) -> None:
    """Run the job to its end (procs stopped, client shut down); fail with its output if it fails."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.telemetry.tel_actors", *args],
        cwd=ROOT,
        env=_env(nats_url, namespace, **env),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, f"job failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"mesh": "telmesh"}


def monarch(nats_url: str, namespace: str, *args: str) -> subprocess.CompletedProcess:
    """The ``monarch`` CLI as a subprocess, on this namespace."""
    return subprocess.run(
        [sys.executable, "-m", "monarch.cli.main", *args],
        cwd=ROOT,
        env=_env(nats_url, namespace),
        capture_output=True,
        text=True,
        timeout=60,
    )


def query(nats_url: str, namespace: str, sql: str) -> list[dict]:
    """Rows of ``monarch query --json SQL``."""
    done = monarch(nats_url, namespace, "query", "--json", sql)
    assert done.returncode == 0, f"monarch query failed ({done.returncode}): {done.stderr}"
    return json.loads(done.stdout)
