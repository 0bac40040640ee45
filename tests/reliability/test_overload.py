"""A flood to one actor: the sender is slowed down or told, never silently dropped."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_client(tmp_path: Path, code: str, **env: str) -> subprocess.CompletedProcess:
    script = tmp_path / "client.py"
    script.write_text(textwrap.dedent(code))
    full = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    full.update(PYTHONPATH=str(ROOT), MONARCH_FLOW_BATCH="50", MONARCH_FLOW_WINDOW="4", **env)
    return subprocess.run(
        [sys.executable, str(script)], env=full, capture_output=True, text=True, timeout=180
    )


def test_flood_slows_the_sender_and_loses_nothing(tmp_path):
    result = run_client(
        tmp_path,
        """
        from monarch.actor import this_host
        from tests.reliability.overload_actors import Sink
        pm = this_host().spawn_procs(per_host={"gpus": 1})
        sink = pm.spawn("sink", Sink, 0.0005)
        n, peak = 3000, 0
        for i in range(n):
            sink.take.broadcast(i)
            peak = max(peak, sink._state.flow.outstanding)
        count, in_order = sink.count.call_one().get(timeout=120)
        print("sent", n, "handled", count, "in_order", in_order, "peak", peak, flush=True)
        pm.stop().get()
        """,
    )
    assert result.returncode == 0, result.stderr
    words = result.stdout.split()
    sent, handled, in_order, peak = int(words[1]), int(words[3]), words[5], int(words[7])
    assert handled == sent and in_order == "True"
    assert peak == 4  # the sender was held at the window (4 markers of 50 messages)


def test_flood_to_a_stuck_actor_is_an_explicit_error(tmp_path):
    result = run_client(
        tmp_path,
        """
        from monarch.actor import this_host
        from monarch.actors.messaging.flow import BackpressureError
        from tests.reliability.overload_actors import Sink
        pm = this_host().spawn_procs(per_host={"gpus": 1})
        sink = pm.spawn("stuck", Sink, 0.0)
        sink.hang.broadcast()
        try:
            for i in range(10_000):
                sink.take.broadcast(i)
            print("no error", flush=True)
        except BackpressureError as e:
            print("backpressure after", i, "messages:", e, flush=True)
        pm.stop().get(timeout=60)
        """,
        MONARCH_FLOW_TIMEOUT="2",
        MONARCH_STOP_TIMEOUT="1",
    )
    assert result.returncode == 0, result.stderr
    assert "backpressure after" in result.stdout
    assert "has not kept up" in result.stdout
