"""Whole client scripts in their own processes: embedded broker, Ctrl-C, pickling switch, CLI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import descendants, pid_alive, wait_until

ROOT = Path(__file__).resolve().parent.parent


def client_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    env["TMPDIR"] = str(tmp_path)  # the embedded broker's store dir goes here
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def run_script(tmp_path: Path, code: str, timeout: float = 120, **env: str):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(code))
    store = tmp_path / "tmp"
    store.mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, str(script)],
        env=client_env(store, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
    ), store


def test_hello_mesh_example_runs_on_embedded_broker_and_cleans_up(tmp_path):
    store = tmp_path / "tmp"
    store.mkdir()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "hello_mesh.py")],
        env=client_env(store),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == "ValueMesh({gpus: 4}):"  # printed as Monarch prints it
    assert "".join(lines[1:5]).count("0.30000000000000004") == 4
    assert lines[5] == "0.1"
    assert list(store.iterdir()) == []  # broker store dir removed


READY_CLIENT = """
import time
from monarch.actor import Actor, endpoint, this_host

class Pinger(Actor):
    @endpoint
    def ping(self) -> int:
        return 1

procs = this_host().spawn_procs(per_host={"gpus": 2})
procs.spawn("p", Pinger).ping.call().get()
print("ready", flush=True)
time.sleep(120)
"""


def start_ready_client(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """A client on its own embedded broker with two procs, waiting once it says ready."""
    script = tmp_path / "script.py"
    script.write_text(READY_CLIENT)
    store = tmp_path / "tmp"
    store.mkdir()
    p = subprocess.Popen(
        [sys.executable, str(script)],
        env=client_env(store),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return p, store


def test_ctrl_c_stops_procs_and_embedded_broker(tmp_path):
    p, store = start_ready_client(tmp_path)
    try:
        assert p.stdout.readline().strip() == "ready"
        children = descendants(p.pid)
        assert len(children) >= 3  # nats-server and two procs
        p.send_signal(signal.SIGINT)
        p.wait(timeout=30)
        assert wait_until(lambda: not any(pid_alive(c) for c in children), timeout=15)
        assert list(store.iterdir()) == []
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_client_sigkill_takes_procs_and_broker_down(tmp_path):
    p, _ = start_ready_client(tmp_path)
    try:
        assert p.stdout.readline().strip() == "ready"
        children = descendants(p.pid)
        p.kill()
        p.wait(timeout=10)
        assert wait_until(lambda: not any(pid_alive(c) for c in children), timeout=15)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_pickle_forbidden_is_a_clear_error_at_the_sender(tmp_path):
    result, _ = run_script(
        tmp_path,
        """
        from monarch.actor import Actor, endpoint, this_host
        from monarch.broker.bodies.codec import PicklingForbiddenError

        class Local(Actor):
            @endpoint
            def ping(self, x):
                return x

        procs = this_host().spawn_procs(per_host={"gpus": 1})
        try:
            procs.spawn("local", Local)
        except PicklingForbiddenError as e:
            print("spawn refused:", e)

        from tests.actors.actors_for_tests import Echo
        echo = procs.spawn("echo", Echo)
        print("plain values:", echo.ping.call_one({"a": (1, 2.5, b"x")}).get())
        try:
            echo.ping.call_one({1, 2})
        except PicklingForbiddenError as e:
            print("set refused:", type(e).__name__)
        procs.stop().get()
        """,
        MONARCH_PICKLE="0",
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "spawn refused:" in out and "Local" in out and "MONARCH_PICKLE" in out
    assert "plain values: {'a': (1, 2.5, b'x')}" in out
    assert "set refused: PicklingForbiddenError" in out


def test_actor_output_reaches_the_client_with_pickle_off(tmp_path):
    """A forwarded log batch is plain values: it must not need pickle (it once held an ActorId)."""
    result, _ = run_script(
        tmp_path,
        """
        from monarch.actor import this_host
        from tests.actors.actors_for_tests import Printer

        procs = this_host().spawn_procs(per_host={"gpus": 1})
        procs.spawn("printer", Printer).say.call("printed with pickle off").get()
        procs.stop().get()
        """,
        MONARCH_PICKLE="0",
    )
    assert result.returncode == 0, result.stderr
    assert "printed with pickle off" in result.stdout, result.stdout + result.stderr


def test_monarch_demo_console_script(tmp_path):
    store = tmp_path / "tmp"
    store.mkdir()
    exe = Path(sys.executable).parent / "monarch"
    cmd = (
        [str(exe), "demo", "--gpus", "2"]
        if exe.exists()
        else [sys.executable, "-m", "monarch.cli.main", "demo", "--gpus", "2"]
    )
    result = subprocess.run(cmd, env=client_env(store), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "hello from rank 1" in result.stdout
    assert "every proc stopped" in result.stdout


@pytest.mark.parametrize("blocked", ["torch", "numpy"])
def test_actor_runtime_runs_without_torch_or_numpy(tmp_path, blocked):
    result, _ = run_script(
        tmp_path,
        f"""
        import sys
        sys.modules["{blocked}"] = None  # any import of it now fails
        from monarch.actor import Actor, endpoint, this_host

        class A(Actor):
            @endpoint
            def ping(self, x):
                return x

        procs = this_host().spawn_procs(per_host={{"gpus": 2}})
        print(list(procs.spawn("a", A).ping.call([1, "x"]).get().values()))
        procs.stop().get()
        """,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[[1, 'x'], [1, 'x']]"


def test_ping_pong_example(tmp_path):
    store = tmp_path / "tmp"
    store.mkdir()
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "ping_pong.py")],
        env=client_env(store),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "ping plays at {}",
        "pong plays at {}",
        "pong returns ping's ball 0 (return #1)",
        "pong returns ping's ball 1 (return #2)",
        "ping returns pong's ball 0 (return #1)",
        "ping returns pong's ball 1 (return #2)",
    ]


def test_script_that_never_stops_its_procs_still_cleans_up(tmp_path):
    store = tmp_path / "tmp"
    store.mkdir()
    marker = tmp_path / "cleanup.txt"
    result, _ = run_script(
        tmp_path,
        f"""
        from monarch.actor import this_host
        from tests.supervision.sup_actors import Worker
        pm = this_host().spawn_procs(per_host={{"gpus": 1}})
        w = pm.spawn("w", Worker, {str(marker)!r})
        print(w.ping.call_one(1).get(), flush=True)
        # no pm.stop(): the client stops its procs in order at exit
        """,
    )
    assert result.returncode == 0, result.stderr
    assert marker.read_text().strip() == "worker cleanup None"


def test_the_embedded_broker_outlives_the_thread_that_first_used_monarch(tmp_path):
    """A client whose first call happens on a pool thread keeps its broker after that thread
    ends: the broker's parent-death signal is tied to a thread that lives as long as the
    client (before, the kernel killed the broker with the pool's thread)."""
    proc, _ = run_script(
        tmp_path,
        """
        import threading
        from monarch.actor import Actor, endpoint, this_host

        class Echo(Actor):
            @endpoint
            def echo(self, x):
                return x

        def first_use():
            pm = this_host().spawn_procs(per_host={"gpus": 1})
            print(pm.spawn("a", Echo).echo.call_one(1).get(timeout=60))
            pm.stop().get(timeout=60)

        t = threading.Thread(target=first_use)
        t.start()
        t.join()
        # the thread that started the runtime (and its broker) is gone now
        pm = this_host().spawn_procs(per_host={"gpus": 1})
        print(pm.spawn("b", Echo).echo.call_one(2).get(timeout=60))
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "2"]


# -- a fault nobody handled ends the client as Monarch's does ------------------------

FAULTY_CLIENT = """
import atexit, time
import monarch.actor
from monarch.actor import this_host
from tests.actors.actors_for_tests import Echo

atexit.register(lambda: print("atexit ran", flush=True))
procs = this_host().spawn_procs(per_host={"gpus": 1})
echo = procs.spawn("echo", Echo)
print("proc", echo.whoami.call_one().get()["pid"], flush=True)
"""


def _proc_pid(stdout: str) -> int:
    return int(next(line for line in stdout.splitlines() if line.startswith("proc ")).split()[1])


def test_an_unhandled_fault_interrupts_the_main_thread_and_the_client_ends_like_a_program(
    tmp_path,
):
    # As Monarch: the default hook leaves the fault unhandled, the main thread gets
    # a KeyboardInterrupt (even inside a long sleep), and the interpreter ends the way
    # a program does: finally blocks and atexit handlers run, then the procs stop.
    result, store = run_script(
        tmp_path,
        FAULTY_CLIENT
        + """
echo.fail.broadcast("nobody handles this")
try:
    time.sleep(60)
    print("slept through", flush=True)
except BaseException as e:
    print("main thread got", type(e).__name__, flush=True)
    raise
""",
    )
    lines = result.stdout.splitlines()
    assert lines[1:] == ["main thread got KeyboardInterrupt", "atexit ran"], result.stderr
    assert result.returncode == -signal.SIGINT  # a KeyboardInterrupt's status, as Monarch's
    assert "Unhandled monarch failure" in result.stderr
    assert "nobody handles this" in result.stderr
    assert wait_until(lambda: not pid_alive(_proc_pid(result.stdout)), timeout=15)
    assert list(store.iterdir()) == []  # the embedded broker stopped cleanly too


def test_a_fault_hook_that_returns_drops_the_fault_and_one_that_raises_ends_the_client(
    tmp_path,
):
    result, _ = run_script(
        tmp_path,
        FAULTY_CLIENT
        + """
seen = []
monarch.actor.unhandled_fault_hook = lambda failure: seen.append(failure.mesh_name)
echo.fail.broadcast("dropped by the hook")
while not seen:
    time.sleep(0.05)
print("dropped", seen, flush=True)

def refuse(failure):
    raise RuntimeError("this hook refuses " + failure.mesh_name)

monarch.actor.unhandled_fault_hook = refuse
echo2 = procs.spawn("echo2", Echo)
echo2.fail.broadcast("left unhandled")
try:
    time.sleep(60)
    print("slept through", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
""",
    )
    lines = result.stdout.splitlines()
    assert lines[1:] == ["dropped ['echo']", "interrupted", "atexit ran"], result.stderr
    assert "RuntimeError: this hook refuses echo2" in result.stderr
    assert result.returncode == 0  # the script caught the KeyboardInterrupt and ended


def test_an_unhandled_fault_in_a_multiprocessing_child_exits_1_after_its_atexit_handlers(
    tmp_path,
):
    # Monarch's own test of this runs the client in a spawned multiprocessing child.
    marker = tmp_path / "marker.txt"
    result, _ = run_script(
        tmp_path,
        f"""
import multiprocessing

def client(marker):
    import atexit, time
    from monarch.actor import this_host
    from tests.actors.actors_for_tests import Echo

    atexit.register(lambda: open(marker, "w").write("finalized"))
    procs = this_host().spawn_procs(per_host={{"gpus": 1}})
    echo = procs.spawn("echo", Echo)
    echo.ping.call_one(1).get()
    echo.fail.broadcast("in the child")
    time.sleep(60)

if __name__ == "__main__":
    p = multiprocessing.get_context("spawn").Process(target=client, args=[{str(marker)!r}])
    p.start()
    p.join(90)
    print("exitcode", p.exitcode, flush=True)
""",
    )
    assert result.stdout.strip() == "exitcode 1", result.stderr
    assert marker.read_text() == "finalized"
