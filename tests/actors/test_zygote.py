"""The proc zygote: procs are forks, and a spawn never waits for torch's import.

The zygote imports torch in a second zygote, forked from the first once it is
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

ROOT = Path(__file__).resolve().parents[2]

# Stands in for torch: importing it waits until the file named by FAKE_TORCH_GO exists.
_BLOCKING_TORCH = """
import os, time

while not os.path.exists(os.environ["FAKE_TORCH_GO"]):
    time.sleep(0.02)
"""

_CLIENT = """
import json, os, sys, time
from pathlib import Path
from monarch.actor import Actor, endpoint, this_host


class Where(Actor):
    def __init__(self):
        self.torch_at_start = "torch" in sys.modules

    @endpoint
    def where(self) -> dict:
        return {"pid": os.getpid(), "ppid": os.getppid(), "torch": self.torch_at_start}


def spawn_one(name):
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    info = procs.spawn(name, Where).where.call_one().get(timeout=30)
    procs.stop().get(timeout=30)
    return info


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
    script.write_text(textwrap.dedent(_CLIENT))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(fake.parent), str(ROOT)]),
        "FAKE_TORCH_GO": str(tmp_path / "go"),
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
