"""Streams and buckets on a NATS cluster: made while it elects its leader, copied to every server.

Issue 35: with docker-compose.cluster.yml a client logged "could not create
JetStream stream monarch-default-hb: TimeoutError()": JetStream answers no
create request while its cluster has no leader (servers still starting, or too
few of them up), and a stream kept on one server is gone while that server is.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid

import nats
import pytest
from nats.js.errors import APIError

from monarch.broker.connections.cluster import nats_cluster
from monarch.broker.connections.jetstream_setup import StreamOffline, while_electing
from monarch.broker.connections.registry import HOSTS, bucket_name, open_bucket
from monarch.broker.connections.server import find_nats_server, read_info
from monarch.supervision.streams import ensure_streams, heartbeat_stream, supervision_stream


def test_streams_wait_for_the_cluster_leader_and_keep_a_copy_per_server(tmp_path):
    ns = f"t{uuid.uuid4().hex[:8]}"
    folder = tmp_path / "cluster"
    with nats_cluster(folder) as cluster:
        first, *others = cluster.nodes

        async def scenario():
            nc = await nats.connect(first.url, connect_timeout=5)  # told of all 3 servers
            try:
                for node in others:  # no quorum: JetStream has no leader now
                    node.kill()
                making = asyncio.ensure_future(ensure_streams(nc, ns))
                bucket = asyncio.ensure_future(open_bucket(nc, ns, HOSTS))
                await asyncio.sleep(2.0)
                assert not making.done() and not bucket.done()  # waiting, not failed
                for node in others:  # the servers come back, from their own stores
                    node.proc = subprocess.Popen(
                        [find_nats_server(), "-c", str(folder / f"{node.name}.conf")],
                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL, start_new_session=True,
                    )  # fmt: skip
                await asyncio.wait_for(asyncio.gather(making, bucket), 40)
                js = nc.jetstream()
                names = [
                    heartbeat_stream(ns),
                    supervision_stream(ns),
                    f"KV_{bucket_name(ns, HOSTS)}",
                ]
                return [(await js.stream_info(n)).config.num_replicas for n in names]
            finally:
                await nc.close()

        deadline = time.monotonic() + 10
        while len((read_info("127.0.0.1", first.port) or {}).get("connect_urls") or []) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert asyncio.run(scenario()) == [3, 3, 3]


# -- which answers mean "not ready yet": what nats-py raises for the server's JSON errors
# (made with its own APIError.from_error); the cluster that produces them is above and in
# tests/deploy/test_compose_cluster.py


def server_error(err_code: int, description: str) -> Exception:
    try:
        APIError.from_error({"code": 500, "err_code": err_code, "description": description})
    except APIError as e:
        return e
    raise AssertionError("from_error did not raise")


def test_a_stream_that_is_offline_is_asked_again_until_it_has_a_leader():
    answers = [server_error(10118, "stream is offline")] * 2 + ["the bucket"]
    asked = []

    async def make():
        asked.append(1)
        answer = answers[len(asked) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert asyncio.run(while_electing("the bucket", make, bound=10)) == "the bucket"
    assert len(asked) == 3


def test_a_stream_still_offline_after_the_bound_raises_stream_offline():
    async def make():
        raise server_error(10118, "stream is offline")

    with pytest.raises(StreamOffline, match="stream is offline"):
        asyncio.run(while_electing("the bucket", make, bound=0.5))


def test_another_server_error_is_raised_at_once():
    asked = []

    async def make():
        asked.append(1)
        raise server_error(10059, "stream not found")

    with pytest.raises(APIError, match="stream not found"):
        asyncio.run(while_electing("the bucket", make, bound=10))
    assert asked == [1]
