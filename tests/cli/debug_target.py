"""A client script whose endpoints stop at breakpoint(), for tests/cli/test_debug.py.

``python -m tests.cli.debug_target sync|async`` spawns a 2-rank mesh, calls
``compute(4)`` on it and prints ``RESULT <json>`` with the values once every
rank was let go by ``monarch debug``; exits 0.
"""

from __future__ import annotations

import asyncio
import json
import sys

from monarch.actor import Actor, current_rank, endpoint, this_host


class Stepper(Actor):
    @endpoint
    def compute(self, base: int) -> int:
        x = base * 10 + current_rank().rank
        breakpoint()
        y = x + 1
        return y * 2


class AsyncStepper(Actor):
    @endpoint
    async def compute(self, base: int) -> int:
        x = base * 100 + current_rank().rank
        breakpoint()
        await asyncio.sleep(0.01)  # `n` over an await stops at the next line
        return x + 7


def main() -> None:
    kind = Stepper if sys.argv[1] == "sync" else AsyncStepper
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = procs.spawn(f"{sys.argv[1]}stepper", kind)
    print("READY", flush=True)
    values = mesh.compute.call(4).get(timeout=600)
    print("RESULT", json.dumps(sorted(v for _, v in values.items())), flush=True)
    procs.stop().get(timeout=60)


if __name__ == "__main__":
    main()
