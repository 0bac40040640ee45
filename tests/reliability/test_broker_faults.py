"""The broker restarts under a running job, or never comes back."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_client(tmp_path: Path, code: str, timeout: float = 120, **env: str):
    script = tmp_path / "client.py"
    script.write_text(textwrap.dedent(code))
    full = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    full.update(PYTHONPATH=str(ROOT), **env)
    return subprocess.run(
        [sys.executable, str(script)], env=full, capture_output=True, text=True, timeout=timeout
    )


def test_broker_restart_under_a_running_job(tmp_path):
    result = run_client(
        tmp_path,
        f"""
        import os, threading, time
        from monarch.broker.connections.server import EmbeddedBroker, free_port
        port = free_port()
        store = {str(tmp_path / "store")!r}
        broker = EmbeddedBroker(port=port, store_dir=store).start()
        os.environ["MONARCH_NATS_URL"] = broker.url
        from monarch.actor import this_host, BrokerLostError
        from tests.actors.actors_for_tests import Echo
        pm = this_host().spawn_procs(per_host={{"gpus": 2}})
        mesh = pm.spawn("survivor", Echo)
        assert list(mesh.ping.call(1).get(timeout=30).values()) == [1, 1]
        outcomes = {{"ok": 0, "lost": 0, "other": 0}}
        stop = threading.Event()
        def traffic():
            while not stop.is_set():
                try:
                    mesh.ping.call(2).get(timeout=30)
                    outcomes["ok"] += 1
                except BrokerLostError:
                    outcomes["lost"] += 1
                except Exception as e:
                    outcomes["other"] += 1
                    print("other:", repr(e), flush=True)
                    time.sleep(0.05)
        t = threading.Thread(target=traffic)
        t.start()
        time.sleep(0.5)
        broker.stop()                      # the broker goes away...
        time.sleep(1.0)
        broker = EmbeddedBroker(port=port, store_dir=store).start()   # ...and comes back
        time.sleep(2.0)
        stop.set()
        t.join(60)
        assert not t.is_alive(), "a call hung"
        print("outcomes", outcomes, flush=True)
        assert list(mesh.ping.call(3).get(timeout=30).values()) == [3, 3]
        # supervision still works after the restart: a proc's death reaches the root
        import signal
        import monarch.actor
        failures = []
        monarch.actor.unhandled_fault_hook = failures.append
        pid = mesh.slice(gpus=1).whoami.call_one().get(timeout=30)["pid"]
        os.kill(pid, signal.SIGKILL)
        deadline = time.time() + 30
        while not failures and time.time() < deadline:
            time.sleep(0.05)
        print("failure after restart:", failures[0].reason, failures[0].ranks, flush=True)
        pm.stop().get(timeout=60)
        broker.stop()
        print("done", flush=True)
        """,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "done" in result.stdout
    line = next(x for x in result.stdout.splitlines() if x.startswith("outcomes"))
    outcomes = eval(line.split(" ", 1)[1])
    assert outcomes["ok"] > 0
    assert "failure after restart: proc_died [1]" in result.stdout


def test_broker_that_never_comes_back_fails_the_job_clearly(tmp_path):
    result = run_client(
        tmp_path,
        """
        import os, time
        from monarch.broker.connections.server import EmbeddedBroker
        broker = EmbeddedBroker().start()
        os.environ["MONARCH_NATS_URL"] = broker.url
        from monarch.actor import this_host
        from tests.actors.actors_for_tests import Echo
        pm = this_host().spawn_procs(per_host={"gpus": 1})
        print(pm.spawn("e", Echo).ping.call_one(1).get(timeout=30), flush=True)
        broker.stop()
        time.sleep(60)
        print("should not get here", flush=True)
        """,
        timeout=90,
        MONARCH_BROKER_LOST_TIMEOUT="2",
    )
    assert result.returncode != 0
    assert "should not get here" not in result.stdout
    assert "the broker has been unreachable for 2 s" in result.stderr
