"""Actors for the job tests (importable by the procs that host agents start)."""

from __future__ import annotations

import os

from monarch.actor import Actor, endpoint


class Whereabouts(Actor):
    """Says which process it runs in, under which agent, with which job environment."""

    @endpoint
    def where(self) -> dict:
        return {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "host_uid": os.environ.get("MONARCH_HOST_UID"),
            "job_env": os.environ.get("JOB_TEST_ENV"),
        }
