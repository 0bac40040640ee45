"""The client script of the attach tests: ``python -m tests.compat.attach_job CASE URL``.

Each case runs in a fresh process (the client runtime is per-process) and
prints one JSON line: what happened.
"""

from __future__ import annotations

import json
import sys

from monarch.actor import Actor, attach, endpoint, shutdown_context, this_host


class Echo(Actor):
    @endpoint
    def echo(self, x: int) -> int:
        return x * 2


def _outcome(fn) -> str:
    try:
        fn()
    except RuntimeError:
        return "RuntimeError"
    except ValueError as e:
        return f"ValueError: {e}"
    return "ok"


def main() -> int:
    case, url = sys.argv[1], sys.argv[2]
    out: dict = {}
    if case == "attach":
        attach(url)
        from monarch.core.process_runtime import runtime

        out["runtime_url"] = runtime().nats_url
        out["again"] = _outcome(lambda: attach(url))
        out["other"] = _outcome(lambda: attach("nats://127.0.0.1:1"))
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        out["echo"] = procs.spawn("echo", Echo).echo.call_one(21).get(timeout=60)
        procs.stop().get(timeout=60)
    elif case == "local_first":
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        out["after_start"] = _outcome(lambda: attach(url))
        procs.stop().get(timeout=60)
    elif case == "bad_scheme":
        out["ipc"] = _outcome(lambda: attach("ipc:///tmp/gateway"))
        out["bare"] = _outcome(lambda: attach("localhost:4222"))
        from monarch.core.process_runtime import current_runtime_or_none

        out["started"] = current_runtime_or_none() is not None
    shutdown_context().get(timeout=60)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
