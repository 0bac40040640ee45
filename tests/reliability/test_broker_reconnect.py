"""A broker restart is a reconnect, not a death: no live actor may be reported as gone.

While the broker is away and coming back, the client's connection and its
procs' connections return at different moments. A call issued in between (the
client back, the proc not yet) reaches no subscriber and the broker answers
"no responders"; that must not become :class:`NoActorError` (nor any
``SupervisionError``) for an actor that answers a moment later.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CLIENT = """
    import collections, json, os, threading, time
    from monarch.broker.connections.server import EmbeddedBroker, free_port
    port = free_port()
    store = os.environ["TEST_STORE"]
    broker = EmbeddedBroker(port=port, store_dir=store).start()
    os.environ["MONARCH_NATS_URL"] = broker.url
    from monarch.actor import BrokerLostError, MessageLostError, this_host
    from tests.reliability.node_actors import Counter

    procs = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = procs.spawn("counter", Counter)
    assert list(mesh.ping.call(0).get(timeout=60).values()) == [0, 0]
    outcomes = collections.Counter()
    others = []
    stop = threading.Event()

    def calls(target):
        i = 0
        while not stop.is_set():
            i += 1
            try:
                target.ping.call(i).get(timeout=60)
                outcomes["ok"] += 1
            except (BrokerLostError, MessageLostError) as e:
                outcomes[type(e).__name__] += 1   # honest: the connection or a message was lost
                time.sleep(0.01)
            except Exception as e:
                outcomes[type(e).__name__] += 1
                others.append(repr(e)[:300])
                time.sleep(0.01)

    targets = [mesh, mesh.slice(gpus=0), mesh.slice(gpus=1), mesh]
    threads = [threading.Thread(target=calls, args=(t,)) for t in targets]
    for t in threads:
        t.start()
    for _ in range(2):
        time.sleep(0.5)
        broker.stop()                                                 # the broker goes away...
        time.sleep(0.5)
        broker = EmbeddedBroker(port=port, store_dir=store).start()   # ...and comes back
        time.sleep(3.0)
    stop.set()
    for t in threads:
        t.join(90)
    after = list(mesh.ping.call(-1).get(timeout=60).values())
    procs.stop().get(timeout=60)
    broker.stop()
    print(json.dumps({
        "hung": any(t.is_alive() for t in threads), "outcomes": outcomes,
        "others": others[:5], "after": after,
    }))
"""


def test_calls_during_a_broker_restart_never_report_a_live_actor_as_gone(tmp_path):
    script = tmp_path / "client.py"
    script.write_text(textwrap.dedent(CLIENT))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    env.update(PYTHONPATH=str(ROOT), TEST_STORE=str(tmp_path / "store"))
    result = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    print(report)
    assert not report["hung"]
    assert report["others"] == [], report  # no NoActorError, no SupervisionError
    assert report["outcomes"]["ok"] > 0
    assert report["after"] == [-1, -1]
    # A probe the broker answered "no responders" (its proc not back yet) is no answer,
    # not a malformed one.
    assert "malformed probe answer" not in result.stderr, result.stderr[-3000:]
