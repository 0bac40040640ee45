"""The internal names torchstore reaches for behave as on Monarch 0.7.

torchstore's SPMD start-up asks ``monarch._src.actor.actor_mesh._context.get()``
whether it already runs inside a Monarch actor and refuses to bootstrap a new
runtime if so. The alias must therefore read ``None`` in a client's own code
and the running actor's context inside an endpoint. Each check runs in a fresh
interpreter against the test's real nats-server, with real worker processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(body: str, nats_url: str, timeout: float = 240.0) -> dict:
    """Run ``body`` in a new interpreter on the test broker; its last stdout line is JSON."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    env["MONARCH_NATS_URL"] = nats_url
    env["PYTHONPATH"] = REPO
    proc = subprocess.run(
        [sys.executable, "-c", "import json\n" + textwrap.dedent(body)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_context_alias_is_none_in_the_client_and_the_actors_context_in_an_endpoint(nats_url):
    out = _run(
        """
        from monarch._src.actor import actor_mesh
        from monarch.actor import Actor, context, endpoint, this_host

        before = actor_mesh._context.get()

        class Probe(Actor):
            @endpoint
            def inside(self):
                seen = actor_mesh._context.get()
                return [seen is not None, seen is context(), seen.actor_instance.rank.rank]

        procs = this_host().spawn_procs(per_host={"gpus": 2})
        probes = procs.spawn("probe", Probe)
        answers = sorted(probes.inside.call().get().values(), key=lambda a: a[2])
        context()  # the client's own context() does not fill the actor variable
        after = actor_mesh._context.get()
        procs.stop().get()
        print(json.dumps({"before": before, "after": after, "answers": answers}))
        """,
        nats_url,
    )
    assert out["before"] is None
    assert out["after"] is None
    assert out["answers"] == [[True, True, 0], [True, True, 1]]


def test_context_alias_is_the_variable_our_public_context_reads():
    from monarch._src.actor import actor_mesh
    from monarch.actors.calls import context as ours

    assert actor_mesh._context is ours._current
    assert "_context" in actor_mesh.__all__  # beside ActorMesh, which TorchForge imports from here
