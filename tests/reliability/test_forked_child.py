"""A forked child that uses its parent's meshes gets a clear error at once, never a hang."""

from __future__ import annotations

import os
import time

import pytest

from monarch.actor import this_host
from tests.actors.actors_for_tests import Echo


def test_a_forked_child_calling_its_parents_mesh_gets_a_clear_error(nats_url):
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        echo = procs.spawn("echo", Echo)
        assert echo.ping.call_one(1).get(timeout=30) == 1
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report what the call did, then leave at once
            os.close(read)
            try:
                echo.ping.call_one(2).get(timeout=10)
                outcome = b"answered"
            except RuntimeError as e:
                outcome = b"forked" if "was forked from" in str(e) else repr(e).encode()
            except BaseException as e:
                outcome = repr(e).encode()
            os.write(write, outcome[:500])
            os._exit(0)
        os.close(write)
        deadline = time.monotonic() + 30
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                pytest.fail("the forked child hung")
            time.sleep(0.02)
        outcome = os.read(read, 1000)
        os.close(read)
        assert outcome == b"forked"
        assert echo.ping.call_one(3).get(timeout=30) == 3  # the parent is untouched
    finally:
        procs.stop().get(timeout=60)
