"""A flood to one actor: the sender is slowed down or told, never silently dropped."""

from __future__ import annotations

import json
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
    full.update(PYTHONPATH=str(ROOT), MONARCH_FLOW_BATCH="50", MONARCH_FLOW_WINDOW="4")
    full.update(env)
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


def test_big_sends_to_a_stalled_actor_wait_instead_of_overflowing_the_broker(tmp_path):
    """300 in-band sends of 250 kB (75 MB) to an actor whose proc's loop is stalled:
    more than nats-server holds for one slow reader (64 MiB), after which it cuts the
    reader off and the messages are lost. The sender must wait instead (in-flight bytes
    are bounded per mesh, MONARCH_FLOW_BYTES), and every send must be handled."""
    result = run_client(
        tmp_path,
        """
        import json
        from monarch.actor import MessageLostError, this_host
        from tests.reliability.overload_actors import StalledSink
        pm = this_host().spawn_procs(per_host={"gpus": 1})
        sink = pm.spawn("stalled", StalledSink)
        sink.count.call_one().get(timeout=60)
        sink.stall.broadcast(5.0)
        payload = b"x" * 250_000
        lost = []
        for i in range(300):
            try:
                sink.take.broadcast(payload)
            except MessageLostError as e:
                lost.append(str(e))
        try:
            seen, nbytes = sink.count.call_one().get(timeout=120)
        except MessageLostError as e:
            lost.append(str(e))
            seen, nbytes = sink.count.call_one().get(timeout=120)
        flow = sink._state.flow
        print(json.dumps({"seen": seen, "nbytes": nbytes, "lost": lost[:3],
                          "waits": getattr(flow, "waits", 0)}), flush=True)
        pm.stop().get(timeout=60)
        """,
        MONARCH_FLOW_BATCH="1000",
        MONARCH_FLOW_WINDOW="16",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["lost"] == [], report
    assert "were lost on the way" not in result.stderr, result.stderr[-3000:]
    assert (report["seen"], report["nbytes"]) == (300, 300 * 250_000), report
    assert report["waits"] > 0, report  # the sender was held back, not the broker's buffer


# Two procs: a stalled receiver and, for the sends from an event loop, an async sender.
_STALLED_SETUP = """
import json
import time
from monarch.actor import MessageLostError, this_host
from tests.reliability.overload_actors import Flooder, StalledReceiver
pm = this_host().spawn_procs(per_host={"gpus": 2})
sink = pm.slice(gpus=0).spawn("stalled", StalledReceiver)
flooder = pm.slice(gpus=1).spawn("flooder", Flooder)
sink.count.call_one().get(timeout=60)
N, SIZE = 300, 250_000  # 75 MB, in band: over nats-server's 64 MiB for one slow reader


def wait_for(n, timeout=90.0):
    deadline = time.monotonic() + timeout
    while True:
        seen, nbytes, in_order = sink.count.call_one().get(timeout=60)
        if seen >= n or time.monotonic() > deadline:
            return seen, nbytes, in_order
        time.sleep(0.2)
"""


def _stalled_report(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr[-3000:]
    assert "were lost on the way" not in result.stderr, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_async_endpoint_sends_to_a_stalled_actor_are_held_in_the_sender(tmp_path):
    """An async endpoint (on its proc's event loop, which must not block) broadcasts
    75 MB to an actor whose proc's loop is stalled: past the window its messages wait
    in the sender's process, in order, instead of overflowing the broker's buffer."""
    result = run_client(
        tmp_path,
        _STALLED_SETUP
        + """
lost = []
sink.stall.broadcast(5.0)
holds = flooder.flood.call_one(sink, N, SIZE).get(timeout=60)
seen, nbytes, in_order = wait_for(N)
try:
    flooder.flood.call_one(sink, 0, 0).get(timeout=60)  # a loss report would raise here
except Exception as e:  # MessageLostError, raised in the flooder
    lost.append(repr(e))
print(json.dumps({"seen": seen, "nbytes": nbytes, "in_order": in_order, "holds": holds,
                  "lost": lost}), flush=True)
pm.stop().get(timeout=60)
""",
        MONARCH_FLOW_BATCH="1000",
        MONARCH_FLOW_WINDOW="16",
    )
    report = _stalled_report(result)
    assert report["lost"] == [], report
    assert (report["seen"], report["nbytes"], report["in_order"]) == (300, 300 * 250_000, True)
    assert report["holds"] > 0, report  # held in the sender, not in the broker's buffer


def test_port_sends_to_a_stalled_proc_wait_or_are_held(tmp_path):
    """``Port.send`` of 75 MB to a port of a proc whose loop is stalled, from a thread
    (the client's: it waits) and then from an async endpoint (its messages are held):
    each sender's values all arrive, in order, and the broker never cuts the proc off."""
    result = run_client(
        tmp_path,
        _STALLED_SETUP
        + """
from monarch.actors.process_state import actor_process
from monarch.core.process_runtime import runtime
out = {}
port = sink.open_port.call_one().get(timeout=60)
sink.stall.broadcast(5.0)
payload = b"x" * SIZE
for i in range(N):
    port.send((i, payload))
flows = getattr(actor_process(runtime()), "port_flows", None)
out["waits"] = flows.get(port.subject).waits if flows is not None else 0
out["thread"] = sink.drain.call_one(N, 30.0).get(timeout=60)
sink.stall.broadcast(5.0)
out["holds"] = flooder.flood_port.call_one(port, N, SIZE).get(timeout=60)
out["loop"] = sink.drain.call_one(N, 30.0).get(timeout=60)
print(json.dumps(out), flush=True)
pm.stop().get(timeout=60)
""",
        MONARCH_FLOW_BATCH="1000",
        MONARCH_FLOW_WINDOW="16",
    )
    report = _stalled_report(result)
    assert report["thread"] == [300, 300 * 250_000, True], report
    assert report["loop"] == [300, 300 * 250_000, True], report
    assert report["waits"] > 0 and report["holds"] > 0, report  # the senders were held back


def test_a_proc_tells_port_senders_how_many_share_it():
    """A proc's answer to a port flow marker counts the processes sending to it lately,
    so that each keeps to its share of the window (several generators into one scorer)."""
    from monarch.core.flow_answers import FlowAnswers

    answers = FlowAnswers()
    assert answers.answer("mon.ns.port.a.1") == b"1"
    assert answers.answer("mon.ns.port.b.1") == b"2"
    assert answers.answer("mon.ns.port.a.1") == b"2"  # the same sender again


def test_several_senders_to_a_stalled_actor_share_one_window(tmp_path):
    """Four procs each send 120 x 250 kB (120 MB in all) from an async endpoint to one
    actor whose proc's loop is stalled. Each alone stays under MONARCH_FLOW_BYTES, but
    four full windows add up past nats-server's 64 MiB for one slow reader. The actor's
    answers to flow markers tell each sender that four share it, and each keeps to a
    quarter of the window: nothing is lost, each sender's messages arrive in order."""
    result = run_client(
        tmp_path,
        """
import json
import time
from monarch.actor import this_host
from tests.reliability.overload_actors import Flooder, SharedReceiver
pm = this_host().spawn_procs(per_host={"gpus": 5})
sink = pm.slice(gpus=0).spawn("shared", SharedReceiver)
senders = [pm.slice(gpus=g).spawn(f"sender{g}", Flooder) for g in range(1, 5)]
sink.count.call_one().get(timeout=60)
N, SIZE, WARM = 120, 250_000, 8


def wait_for(n, timeout=90.0):
    deadline = time.monotonic() + timeout
    while True:
        seen, nbytes, in_order = sink.count.call_one().get(timeout=60)
        if seen >= n or time.monotonic() > deadline:
            return seen, nbytes, in_order
        time.sleep(0.2)


def flood(start, n):
    futures = [s.flood_from.call_one(sink, g, start, n, SIZE) for g, s in enumerate(senders)]
    return [f.get(timeout=90) for f in futures]


# Warm up: the sink hears each sender's markers, then answers later ones with "4".
windows, sent, deadline = [], 0, time.monotonic() + 30
while sent < 6 * WARM and time.monotonic() < deadline:
    windows = flood(sent, WARM)
    sent += WARM
    wait_for(4 * sent)
    if windows == [4] * 4:
        break
time.sleep(0.5)  # the last markers' answers reach the senders
windows = flood(sent, 0)
sink.stall.broadcast(6.0)
flood(sent, N)
seen, nbytes, in_order = wait_for(4 * (sent + N))
lost = []
try:
    flood(sent + N, 0)  # a loss report would raise here
except Exception as e:  # MessageLostError, raised in a sender
    lost.append(repr(e))
print(json.dumps({"seen": seen, "nbytes": nbytes, "in_order": in_order, "sent": sent,
                  "windows": windows, "lost": lost}), flush=True)
pm.stop().get(timeout=60)
""",
        MONARCH_FLOW_BATCH="1000",
        MONARCH_FLOW_WINDOW="16",
    )
    report = _stalled_report(result)
    assert report["lost"] == [], report
    total = 4 * (report["sent"] + 120)
    assert (report["seen"], report["nbytes"], report["in_order"]) == (
        total,
        total * 250_000,
        True,
    ), report
    assert report["windows"] == [4] * 4, report  # 16 markers' window, shared by four


def test_flow_answers_count_a_proc_not_a_port():
    """Markers from two ports of one sender proc (its port flow and a mesh call's reply
    port) count it once."""
    from monarch.core.flow_answers import FlowAnswers

    answers = FlowAnswers()
    assert answers.heard("mon.ns.port.a.7") == 1
    assert answers.heard("mon.ns.port.a.12") == 1
    assert answers.heard("mon.ns.port.b.3") == 2
