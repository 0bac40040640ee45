"""The actor the telemetry tests call, and the job script they run (with telemetry on or off).

``python -m tests.telemetry.tel_actors`` runs one job and prints, as its last
line, a JSON object with the mesh's name and the proc uids of the client.
"""

from __future__ import annotations

import json
import operator
import sys

from monarch.actor import Accumulator, Actor, endpoint, get_meter, span, this_host, traced

_meter = get_meter("tests.telemetry")
_items = _meter.create_counter("items.done")
_sizes = _meter.create_histogram("item.size", unit="By")
_queue = _meter.create_up_down_counter("queue.depth")


@traced
def _prepare(n: int) -> int:
    return n


class Worker(Actor):
    def __init__(self) -> None:
        self.ticks = 0

    @endpoint
    def ping(self, x: int) -> int:
        return x + 1

    @endpoint
    def tick(self) -> None:
        self.ticks += 1

    @endpoint
    def ticks_seen(self) -> int:
        return self.ticks

    @endpoint
    def work(self, n: int) -> int:
        _items.add(n, {"kind": "test"})
        _sizes.record(100.0 * n, {"kind": "test"})
        _queue.add(3)
        _queue.add(-1)
        with span("work.inner"):
            return _prepare(n)

    @endpoint
    def boom(self) -> None:
        raise ValueError("boom")


class Summer(Actor):
    """Two of these in each proc (``per_proc``): their replies are merged on the proc."""

    @endpoint
    async def one(self) -> int:
        return 1


def main() -> int:
    from monarch.actor import shutdown_context

    if "--job-config" in sys.argv:  # Monarch's way: job.enable_telemetry(TelemetryConfig(...))
        from monarch.job import LocalJob, TelemetryConfig

        LocalJob().enable_telemetry(TelemetryConfig(retention_secs=120))
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = procs.spawn("telmesh", Worker)
    one = mesh.slice(gpus=1)
    for i in range(3):
        assert one.ping.call_one(i).get(timeout=60) == i + 1
    mesh.tick.broadcast()
    mesh.tick.broadcast()
    assert list(mesh.ticks_seen.call().get(timeout=60).values()) == [2, 2]
    assert list(mesh.work.call(2).get(timeout=60).values()) == [2, 2]
    try:
        one.boom.call_one().get(timeout=60)
    except Exception:
        pass
    else:
        raise AssertionError("boom did not raise")
    summers = procs.per_proc(workers=2).spawn("telsum", Summer)
    merged = Accumulator(summers.one, 0, operator.add, reducer=operator.add)
    assert merged.accumulate().get(timeout=60) == 4
    procs.stop().get(timeout=60)
    shutdown_context().get(timeout=60)
    print(json.dumps({"mesh": "telmesh"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
