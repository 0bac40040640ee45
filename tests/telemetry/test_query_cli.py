"""``monarch query``: output formats, the schema, and its errors (bad SQL, no telemetry)."""

from __future__ import annotations

import asyncio
import csv
import io
import json

import nats
import pytest

from monarch.settings import Settings
from monarch.telemetry.stream import telemetry_stream
from tests.telemetry.jobs import monarch, new_namespace, run_job

COUNT = "SELECT endpoint, count(*) AS n FROM spans WHERE span = 'handle' GROUP BY endpoint"


@pytest.fixture(scope="module")
def job(nats_url):
    ns = new_namespace()
    run_job(
        nats_url,
        ns,
        MONARCH_TELEMETRY="1",
        MONARCH_TELEMETRY_MAX_BYTES=str(8 * 1024 * 1024),
        MONARCH_TELEMETRY_MAX_AGE="600",
    )
    return nats_url, ns


def test_prints_a_table_by_default_and_csv_on_request(job):
    table = monarch(*job, "query", COUNT + " ORDER BY endpoint")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["endpoint", "n"]
    assert lines[1:-1] and [line.split() for line in lines[1:-1]][:2] == [
        ["boom", "1"],
        ["one", "4"],  # the sum merged on the procs: each of its 4 ranks handled it
    ]
    assert lines[-1] == "(6 rows)"
    out = monarch(*job, "query", "--csv", COUNT + " ORDER BY endpoint")
    rows = list(csv.reader(io.StringIO(out.stdout)))
    assert rows[0] == ["endpoint", "n"] and rows[1] == ["boom", "1"] and len(rows) == 7


def test_bad_sql_is_sqlites_error_and_exit_2(job):
    done = monarch(*job, "query", "SELEKT * FROM spans")
    assert done.returncode == 2
    assert "syntax error" in done.stderr and "Traceback" not in done.stderr
    done = monarch(*job, "query", "SELECT * FROM no_such_table")
    assert done.returncode == 2 and "no such table: no_such_table" in done.stderr


def test_a_namespace_without_telemetry_is_exit_1_with_a_clear_message(nats_url):
    ns = new_namespace()
    done = monarch(nats_url, ns, "query", "SELECT * FROM spans")
    assert done.returncode == 1
    assert f"no telemetry (no stream monarch-{ns}-telemetry)" in done.stderr
    assert "MONARCH_TELEMETRY=1" in done.stderr and "Traceback" not in done.stderr


def test_tables_prints_the_schema(nats_url):
    done = monarch(nats_url, new_namespace(), "query", "--tables")
    assert done.returncode == 0
    assert "CREATE TABLE spans (" in done.stdout and "CREATE TABLE metrics (" in done.stdout
    for column in ("trace_id", "duration_ms", "endpoint", "labels", "value"):
        assert f"  {column} " in done.stdout


def test_the_stream_is_bounded_by_the_settings(job):
    nats_url, ns = job

    async def config():
        nc = await nats.connect(nats_url)
        try:
            return (await nc.jetstream().stream_info(telemetry_stream(ns))).config
        finally:
            await nc.close()

    cfg = asyncio.run(config())
    assert cfg.max_bytes == 8 * 1024 * 1024
    assert cfg.max_age == 600
    assert cfg.subjects == [f"mon.{ns}.tel.>"]
    assert str(getattr(cfg.discard, "value", cfg.discard)) == "old"
    defaults = Settings.from_env({})
    assert defaults.telemetry is False  # off unless asked
    assert defaults.telemetry_max_bytes == 64 * 1024 * 1024
    assert defaults.telemetry_max_age == 3600


def test_monarchs_job_enable_telemetry_turns_it_on(nats_url):
    ns = new_namespace()
    run_job(nats_url, ns, "--job-config")  # no MONARCH_TELEMETRY: TelemetryConfig instead
    done = monarch(nats_url, ns, "query", "--json", COUNT)
    assert done.returncode == 0, done.stderr
    assert {r["endpoint"]: r["n"] for r in json.loads(done.stdout)}["ping"] == 3

    async def max_age():
        nc = await nats.connect(nats_url)
        try:
            return (await nc.jetstream().stream_info(telemetry_stream(ns))).config.max_age
        finally:
            await nc.close()

    assert asyncio.run(max_age()) == 120  # retention_secs


def test_enable_telemetry_after_the_runtime_started_is_an_error(nats_url):
    from monarch.core.process_runtime import runtime
    from monarch.job import LocalJob, TelemetryConfig

    runtime()  # the test session's client, telemetry off
    with pytest.raises(RuntimeError, match="before the first mesh"):
        LocalJob().enable_telemetry(TelemetryConfig())
    with pytest.raises(TypeError, match="TelemetryConfig"):
        LocalJob().enable_telemetry({"retention_secs": 1})
