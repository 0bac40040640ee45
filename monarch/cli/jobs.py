"""``monarch jobs``, and how every command finds a running job when given no broker.

A job's client writes a record (:mod:`monarch.broker.connections.job_records`) that only
its user can read. ``monarch jobs`` lists them (without their secrets);
:func:`discover` is what :func:`monarch.cli.main.broker_url` falls back to
when neither ``--nats-url`` nor ``MONARCH_NATS_URL`` names a broker: the job
``--job NAME`` names, or the only one running. The record also gives the
command the job's namespace, credentials and job key.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from monarch.broker.connections import job_records
from monarch.broker.connections.job_records import JobRecord

# The settings a record supplies, by environment variable; a value the shell
# set for some other broker must not mix with the job's.
_ENV = {name: f"MONARCH_{name.upper()}" for name in job_records.CREDENTIALS}


def run(args: argparse.Namespace) -> int:
    jobs = job_records.list_jobs(prune=True)
    if args.json:
        print(json.dumps([job.public() for job in jobs], indent=2))
    elif jobs:
        print(table(jobs))
    else:
        print("no running jobs")
    return 0


def table(jobs: list[JobRecord]) -> str:
    """The jobs as a text table (no secrets)."""
    cols = ("NAME", "PID", "NAMESPACE", "URL", "STARTED", "SCRIPT")
    rows = [cols] + [
        (
            j.name,
            str(j.pid),
            j.namespace,
            job_records.strip_secrets(j.url) + (" (embedded)" if j.embedded else ""),
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(j.started_at)),
            j.script or "-",
        )
        for j in jobs
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def discover(args: argparse.Namespace) -> JobRecord | None:
    """The job a command given no broker should use; exits 2 where that is not one job.

    ``--job NAME`` picks that one (unknown: exit 2, listing the jobs this user
    can see); otherwise the only running job. Several: exit 2 with a table,
    asking for ``--job``. None: returns None (the caller says what to do).
    """
    wanted = getattr(args, "job", None)
    jobs = job_records.list_jobs(prune=True)
    if wanted:
        for job in jobs:
            if job.name == wanted:
                return job
        seen = f"running jobs:\n{table(jobs)}" if jobs else "no job is running"
        _usage_error(args, f"no running job named {wanted!r}; {seen}")
    if len(jobs) > 1:
        _usage_error(
            args, f"{len(jobs)} jobs are running; pick one with --job NAME:\n{table(jobs)}"
        )
    return jobs[0] if jobs else None


def use(args: argparse.Namespace, job: JobRecord) -> str:
    """Take the job's namespace, credentials and key into this process's settings; its URL.

    Set the way ``main()`` sets ``--namespace`` (the environment, then a fresh
    settings read), so every command reads them as it reads its own options.
    An explicit ``--namespace`` still wins.
    """
    # Imported when a command runs, so that `monarch --help` stays fast.
    from monarch.settings import settings

    if not getattr(args, "namespace", None):
        os.environ["MONARCH_NAMESPACE"] = job.namespace
    for name, var in _ENV.items():
        value = job.credentials.get(name)
        if value:
            os.environ[var] = value
        else:
            os.environ.pop(var, None)
    if job.credentials.get("nats_job_key") is None:
        os.environ.pop("MONARCH_AUTH", None)  # would make up a key of its own
    settings.cache_clear()
    args.discovered_job = job
    # A job that ends while this command connects is said to have ended at once.
    from monarch.hosts.connect import give_up_when

    give_up_when(lambda: job_records.find_job(job.name) is None)
    return job.url


def explain_unreachable(args: argparse.Namespace, error: BaseException) -> int:
    """A discovered job's broker could not be reached: say whether the job ended; exit 1."""
    job: JobRecord = args.discovered_job
    where = job_records.strip_secrets(job.url)
    if job_records.find_job(job.name) is None:
        print(f"monarch {args.command}: job {job.name} ended", file=sys.stderr)
    else:
        print(
            f"monarch {args.command}: cannot reach job {job.name}'s broker at {where}: {error}",
            file=sys.stderr,
        )
    return 1


def _usage_error(args: argparse.Namespace, message: str) -> None:
    print(f"monarch {args.command}: {message}", file=sys.stderr)
    sys.exit(2)
