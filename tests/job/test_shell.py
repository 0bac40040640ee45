"""shell(): an interactive shell on a host, driven through pipes standing in for a terminal."""

from __future__ import annotations

import os
import shlex
import sys
import threading
from unittest.mock import patch

import pytest

from monarch.actor import this_host
from monarch.job import shell
from tests.helpers import pid_alive, wait_until


def run_shell(stdin_fd: int, stdout_fd: int, **kwargs) -> int:
    with (
        os.fdopen(stdin_fd, "r") as stdin,
        os.fdopen(stdout_fd, "w") as stdout,
        patch.object(sys, "stdin", stdin),
        patch.object(sys, "stdout", stdout),
    ):
        return shell(this_host(), **kwargs)


class TwoHosts:
    """Just enough of a two-host mesh for the size check (no procs may start)."""

    def size(self) -> int:
        return 2

    def spawn_procs(self, *args, **kwargs):
        raise AssertionError("shell must not start procs on a mesh it refuses")


def test_a_mesh_of_more_than_one_host_is_refused():
    with pytest.raises(ValueError, match="singleton HostMesh"):
        shell(TwoHosts())


def test_keystrokes_reach_the_shell_and_its_exit_status_comes_back(nats_url):
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    os.write(in_w, b'printf "shell:%s:%s\\n" "$GREETING" "$TERM"; exit 7\n')
    try:
        code = run_shell(in_r, out_w, env={"GREETING": "connected"})
        output = os.read(out_r, 64 * 1024).decode(errors="replace")
    finally:
        os.close(in_w)
        os.close(out_r)
    assert code == 7
    assert "shell:connected:" in output


def test_the_end_of_our_input_hangs_up_the_shell_and_its_foreground_job(nats_url, tmp_path):
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    pid_file = tmp_path / "pid"
    child = f"echo $$ > {shlex.quote(str(pid_file))}; exec sleep 60"
    os.write(in_w, f"sh -c {shlex.quote(child)}\n".encode())

    def close_input_once_the_job_runs():
        wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=20)
        os.close(in_w)

    closer = threading.Thread(target=close_input_once_the_job_runs, daemon=True)
    closer.start()
    try:
        code = run_shell(in_r, out_w, env={"SHELL": "/bin/bash"})
    finally:
        closer.join(30)
        os.close(out_r)
    assert code == 128 + 1  # SIGHUP
    assert not pid_alive(int(pid_file.read_text()))  # the `sleep` was hung up too


def test_output_we_cannot_write_is_an_error_here(nats_url):
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    os.close(out_r)  # nobody reads our output
    os.write(in_w, b'echo "nobody reads this"; exit\n')
    os.close(in_w)
    with pytest.raises((BrokenPipeError, ConnectionResetError)):
        run_shell(in_r, out_w, env={"SHELL": "/bin/bash"})
