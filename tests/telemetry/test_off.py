"""Telemetry off (the default): a whole job publishes nothing on ``mon.<ns>.tel.>``."""

from __future__ import annotations

import asyncio

import nats
from nats.js.errors import NotFoundError

from monarch.actors.calls.gather import Gather
from monarch.telemetry import recorder
from monarch.telemetry.stream import telemetry_stream
from tests.telemetry.jobs import new_namespace, run_job


def test_a_job_with_telemetry_off_publishes_nothing(nats_url):
    ns = new_namespace()
    seen: list[str] = []

    async def watch_job() -> bool:
        nc = await nats.connect(nats_url)
        try:
            everything: list[str] = []

            async def on_tel(msg):
                seen.append(msg.subject)

            async def on_any(msg):
                everything.append(msg.subject)

            await nc.subscribe(f"mon.{ns}.tel.>", cb=on_tel)
            await nc.subscribe(f"mon.{ns}.>", cb=on_any)
            await nc.flush()
            await asyncio.get_running_loop().run_in_executor(None, run_job, nats_url, ns)
            await nc.flush()
            await asyncio.sleep(0.5)
            assert everything, "the subscription heard none of the job's traffic"
            try:
                await nc.jetstream().stream_info(telemetry_stream(ns))
            except NotFoundError:
                return False
            return True
        finally:
            await nc.close()

    stream_made = asyncio.run(watch_job())
    assert seen == []
    assert not stream_made


def test_off_in_this_process_the_hooks_are_unset():
    # The test session's own client runs with telemetry off.
    assert recorder.ON is False and recorder.current_recorder() is None
    assert Gather.trace is None
