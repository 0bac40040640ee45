"""The proc zygote: procs are forks, and a spawn never waits for torch's import.

For a client that has imported torch (or with MONARCH_PRELOAD_TORCH=1), the
zygote imports torch in a second zygote, forked from the first once it is
idle; until that one is ready, the first forks procs itself. The test's torch
is a stand-in whose import blocks until the test allows it, so "during the
import" is a state the test holds, not a race it hopes to win.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from monarch.actor import Actor, endpoint
from tests.helpers import proc_mesh_fixture

ROOT = Path(__file__).resolve().parents[2]

# Stands in for torch: importing it waits until the file named by FAKE_TORCH_GO exists.
_BLOCKING_TORCH = """
import os, time

while not os.path.exists(os.environ["FAKE_TORCH_GO"]):
    time.sleep(0.02)
"""

# An actor that says which process it is in, who forked it, and whether it had torch;
# and spawn_one(name), for the client scripts.
_WHERE = """
class Where(Actor):
    def __init__(self):
        self.torch_at_start = "torch" in sys.modules

    @endpoint
    def where(self) -> dict:
        return {"pid": os.getpid(), "ppid": os.getppid(), "torch": self.torch_at_start}


def spawn_one(name):  # a mesh of one proc, the Where it holds, and stop
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    info = procs.spawn(name, Where).where.call_one().get(timeout=30)
    procs.stop().get(timeout=30)
    return info
"""

_CLIENT = """
import json, os, sys, time
from pathlib import Path
from monarch.actor import Actor, endpoint, this_host


{WHERE}


first = spawn_one("first")  # starts the zygote
time.sleep(1.0)  # idle: the torch zygote is forked and blocks in `import torch`
during = spawn_one("during")
Path(os.environ["FAKE_TORCH_GO"]).write_text("go")
deadline = time.monotonic() + 60
after = spawn_one("after")
while not after["torch"] and time.monotonic() < deadline:
    time.sleep(0.2)
    after = spawn_one("after")
with open(f"/proc/{after['ppid']}/status") as f:
    torch_zygote_parent = int(next(l for l in f if l.startswith("PPid:")).split()[1])
print(json.dumps({"first": first, "during": during, "after": after,
                  "torch_zygote_parent": torch_zygote_parent}))
"""


def test_a_spawn_during_the_torch_import_is_forked_at_once_and_later_ones_have_torch(
    tmp_path, nats_url
):
    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(_BLOCKING_TORCH)
    script = tmp_path / "client.py"
    script.write_text(textwrap.dedent(_CLIENT).replace("{WHERE}", _WHERE))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(fake.parent), str(ROOT)]),
        "FAKE_TORCH_GO": str(tmp_path / "go"),
        "MONARCH_PRELOAD_TORCH": "1",  # the client cannot import this torch itself
    }
    env.pop("MONARCH_NATS_URL", None)  # its own embedded broker and zygote
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=150
    )
    assert done.returncode == 0, done.stdout + done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    zygote = seen["first"]["ppid"]
    # Made by the first zygote while the torch zygote was still importing (before,
    # the spawn waited for the import: here, for ever).
    assert seen["during"]["ppid"] == zygote
    assert seen["during"]["torch"] is False
    # Once the import is done, procs are forks of the torch zygote, a child of the first.
    assert seen["after"]["torch"] is True
    assert seen["after"]["ppid"] != zygote
    assert seen["torch_zygote_parent"] == zygote


_CLIENT_KILLS_TORCH_ZYGOTE = """
import json, os, signal, sys, time
from pathlib import Path
import monarch.actor
from monarch.actor import Actor, endpoint, this_host
from monarch.actors.procs import zygote_client

failures = []
monarch.actor.unhandled_fault_hook = failures.append


{WHERE}


procs = this_host().spawn_procs(per_host={"gpus": 1})
first = procs.spawn("first", Where).where.call_one().get(timeout=30)
deadline = time.monotonic() + 60
with_torch = first
while not with_torch["torch"] and time.monotonic() < deadline:
    time.sleep(0.5)  # > zygote.PRELOAD_WHEN_IDLE: only an idle zygote forks its torch zygote
    more = this_host().spawn_procs(per_host={"gpus": 1})
    with_torch = more.spawn("more", Where).where.call_one().get(timeout=30)
torch_zygote = zygote_client._the_zygote.torch_zygote
os.kill(torch_zygote, signal.SIGKILL)  # as the OOM killer would
while time.monotonic() < deadline:
    try:
        with open(f"/proc/{torch_zygote}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                break  # dead, not yet reaped
    except OSError:  # ProcessLookupError too: reaped between the open and the read
        break  # dead and reaped
    time.sleep(0.05)
after = this_host().spawn_procs(per_host={"gpus": 2})
after_where = sorted(after.spawn("after", Where).where.call().get(timeout=30).values(),
                     key=lambda w: w["pid"])
while not failures and time.monotonic() < deadline:
    time.sleep(0.05)
print(json.dumps({"first": first, "with_torch": with_torch, "torch_zygote": torch_zygote,
                  "after": after_where, "failures": [str(f) for f in failures]}))
"""


def test_when_the_torch_zygote_dies_the_first_zygote_forks_again(tmp_path, nats_url):
    """The torch zygote is the biggest process of a client's (the OOM killer's
    choice): killed, it takes only its own (tied) procs along, whose deaths the
    first zygote reports at once (heartbeats here would take 60 s: the failure
    can only have come from that report); spawns go on, forked by the first
    zygote, without torch."""
    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")  # a torch that imports at once
    script = tmp_path / "client.py"
    script.write_text(textwrap.dedent(_CLIENT_KILLS_TORCH_ZYGOTE).replace("{WHERE}", _WHERE))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(fake.parent), str(ROOT)]),
        "MONARCH_HEARTBEAT_TIMEOUT": "60",
        "MONARCH_PRELOAD_TORCH": "1",
    }
    env.pop("MONARCH_NATS_URL", None)
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=150
    )
    assert done.returncode == 0, done.stdout + done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    zygote = seen["first"]["ppid"]
    assert seen["with_torch"]["torch"] is True
    assert seen["failures"], "the death of the torch zygote's proc was not reported"
    assert any("Killed(sig=9)" in f and "more" in f for f in seen["failures"]), seen["failures"]
    assert seen["with_torch"]["ppid"] == seen["torch_zygote"]
    assert [w["ppid"] for w in seen["after"]] == [zygote, zygote]
    assert [w["torch"] for w in seen["after"]] == [False, False]


_CLIENT_IMPORTS_TORCH_LATER = """
import json, os, sys, time
from monarch.actor import Actor, endpoint, this_host
from monarch.actors.procs import zygote_client
from tests.helpers import descendants


{WHERE}


def torch_zygotes():
    names = {}
    for pid in descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/comm") as f:
                names[pid] = f.read().strip()
        except OSError:
            pass
    return [pid for pid, name in names.items() if name == "zygote-torch"]


if sys.argv[1] == "torch-first":
    import torch  # a script that works with tensors, told not to preload them
before = spawn_one("before")
time.sleep(1.0)  # idle: a zygote that wanted torch would fork its torch zygote now
idle = spawn_one("idle")
no_torch_zygote = torch_zygotes() == [] and zygote_client._the_zygote.torch_zygote is None
import torch  # now the script works with tensors
deadline = time.monotonic() + float(sys.argv[2])
after = spawn_one("after")
while not after["torch"] and time.monotonic() < deadline:
    time.sleep(0.5)  # > zygote.PRELOAD_WHEN_IDLE
    after = spawn_one("after")
print(json.dumps({"before": before, "idle": idle, "no_torch_zygote": no_torch_zygote,
                  "after": after, "torch_zygotes": torch_zygotes()}))
"""


@pytest.mark.parametrize("how", ["auto", "off"])
def test_procs_have_torch_preloaded_only_for_a_client_that_imported_it(tmp_path, nats_url, how):
    """auto: a client that has not imported torch gets procs without it (as
    Monarch's), and no torch zygote; once it imports torch, procs have it. 0:
    never, even for a client that imported torch before it started."""
    script = tmp_path / "client.py"  # with the real torch: the client's codec uses it
    script.write_text(textwrap.dedent(_CLIENT_IMPORTS_TORCH_LATER).replace("{WHERE}", _WHERE))
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "MONARCH_PRELOAD_TORCH": "auto" if how == "auto" else "0",
    }
    env.pop("MONARCH_NATS_URL", None)
    # How long to keep spawning until a proc has torch: off, a few tries only.
    args = ["torch-later", "60"] if how == "auto" else ["torch-first", "2"]
    done = subprocess.run(
        [sys.executable, str(script), *args], env=env, capture_output=True, text=True, timeout=150
    )
    assert done.returncode == 0, done.stdout + done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    zygote = seen["before"]["ppid"]
    assert seen["before"]["torch"] is False and seen["idle"]["torch"] is False
    assert seen["idle"]["ppid"] == zygote  # forked by the first zygote
    assert seen["no_torch_zygote"]  # none was started while nothing wanted torch
    if how == "auto":
        assert seen["after"]["torch"] is True
        assert seen["after"]["ppid"] != zygote and seen["torch_zygotes"] == [seen["after"]["ppid"]]
    else:
        assert seen["after"]["torch"] is False and seen["torch_zygotes"] == []


zygote_procs = proc_mesh_fixture({"gpus": 1}, name="zygote_gc")


class GarbageCollectorView(Actor):
    @endpoint
    def seen(self) -> tuple[int, int, bool]:
        import gc

        return gc.get_freeze_count(), len(gc.get_objects()), gc.isenabled()


def test_a_forked_procs_inherited_objects_are_out_of_the_collectors_sight(zygote_procs):
    """What a proc inherits from the zygote (modules, classes, functions) is frozen: a
    full collection in the proc scans only its own objects. Unfrozen, the first full
    collection after a spawn took ~200 ms in each of 16 procs at once (NOTES 63)."""
    frozen, tracked, enabled = (
        zygote_procs.spawn("gc_view", GarbageCollectorView).seen.call_one().get(timeout=30)
    )
    assert enabled  # the collector still runs, for the proc's own objects
    assert frozen > tracked > 0, (frozen, tracked)


_DRAWS = """
import json, sys, time
import torch  # the client works with tensors: its procs are forks of a zygote that has torch
from monarch.actor import Actor, endpoint, this_host

class Draw(Actor):
    def __init__(self):
        self.forked_with_torch = "torch" in sys.modules  # before this actor imported anything

    @endpoint
    def draw(self):
        import torch
        return {"torch": self.forked_with_torch, "seed": torch.initial_seed(),
                "value": float(torch.rand(1))}

deadline = time.monotonic() + 60
while True:  # until the torch zygote is ready (it is forked once the first zygote is idle)
    pm = this_host().spawn_procs(per_host={"procs": 3})
    draws = list(pm.spawn("d", Draw).draw.call().get(timeout=60).values())
    pm.stop().get(timeout=30)
    if all(d["torch"] for d in draws) or time.monotonic() > deadline:
        break
    time.sleep(0.5)
print(json.dumps(draws))
"""


def test_procs_forked_with_torch_draw_different_random_numbers_as_fresh_interpreters_do(tmp_path):
    """A fork inherits its zygote's torch generator; a fresh interpreter (torchrun's worker,
    Monarch's proc) seeds its own from the OS. Same draws on every rank would mean the
    same dropout masks, shuffles and initial weights everywhere."""
    from tests.helpers import run_client

    rc, out, err = run_client(tmp_path, _DRAWS, timeout=120)
    assert rc == 0, err[-3000:]
    draws = json.loads(out.strip().splitlines()[-1])
    assert all(d["torch"] for d in draws), draws  # these came from the torch zygote
    assert len({d["seed"] for d in draws}) == 3 and len({d["value"] for d in draws}) == 3, draws
