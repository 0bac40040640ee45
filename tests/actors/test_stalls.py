"""Stalled calls (longer than MONARCH_STALL_THRESHOLD): the proc's stats answer shows them,
and the caller, a real client script, warns once on stderr; ordinary calls on a CPU-starved
machine are not reported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WARNING = "has been running for"

CLIENT = textwrap.dedent("""
    import json, os, sys
    from monarch.actor import this_host
    from tests.actors.activity_actors import Busy
    from tests.actors.stats_requests import wait_for_actor

    url = os.environ["MONARCH_NATS_URL"]
    mode, mesh_name = sys.argv[1], sys.argv[2]
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    one = pm.spawn(mesh_name, Busy).slice(gpus=0)
    one.work.call_one(0).get(timeout=60)
    out = {}
    if mode == "stall":
        napping = one.nap.call_one(4.0)
        proc, actor = wait_for_actor(
            url, mesh_name,
            until=lambda p, a: any(s["actor_id"] == a["actor_id"] for s in p["stalls"]),
        )
        out["during"] = {"actor": actor, "stalls": proc["stalls"]}
        assert napping.get(timeout=60) == "rested"
        proc, actor = wait_for_actor(url, mesh_name, until=lambda p, a: a["state"] == "serving")
        out["after"] = {"actor": actor, "stalls": proc["stalls"]}
    else:
        for _ in range(200):
            one.nap.call_one(0.05).get(timeout=60)
        proc, actor = wait_for_actor(url, mesh_name)
        out["after"] = {"actor": actor, "stalls": proc["stalls"]}
    pm.stop().get(timeout=60)
    print(json.dumps(out))
""")


def run_client(tmp_path: Path, url: str, threshold: str, *args: str) -> tuple[dict, str]:
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    env = {**os.environ, "MONARCH_NATS_URL": url, "MONARCH_STALL_THRESHOLD": threshold,
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(script), *args], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, f"client failed:\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_a_stalled_call_is_shown_and_its_caller_warns_once(nats_url, tmp_path):
    out, stderr = run_client(tmp_path, nats_url, "1", "stall", "stalled_nap")
    warnings = [line for line in stderr.splitlines() if WARNING in line]
    assert len(warnings) == 1, stderr
    (line,) = warnings
    assert "stalled_nap" in line and "rank 0" in line and "'nap'" in line, line
    assert "MONARCH_STALL_THRESHOLD=1" in line

    during = out["during"]
    assert during["actor"]["state"] == "stalled"
    (call,) = during["actor"]["in_flight"]
    assert call["endpoint"] == "nap" and call["stalled"] is True
    (stall,) = [s for s in during["stalls"] if s["mesh"] == "stalled_nap"]
    assert stall["endpoint"] == "nap" and stall["seconds"] > 1

    after = out["after"]
    assert after["actor"]["state"] == "serving" and after["actor"]["in_flight"] == []
    (stall,) = [s for s in after["stalls"] if s["mesh"] == "stalled_nap"]
    assert stall["finished_after"] >= 4.0


@pytest.mark.alone  # its burners take both cores
def test_short_calls_on_a_cpu_starved_machine_are_not_stalls(nats_url, tmp_path):
    burn = [sys.executable, "-c", "while True: pass"]
    burners = [subprocess.Popen(burn) for _ in range(2)]
    try:
        out, stderr = run_client(tmp_path, nats_url, "2", "short", "short_naps")
    finally:
        for b in burners:
            b.kill()
            b.wait(timeout=30)
    assert WARNING not in stderr, stderr
    assert out["after"]["actor"]["endpoints"]["nap"]["calls"] == 200
    assert [s for s in out["after"]["stalls"] if s["mesh"] == "short_naps"] == []
