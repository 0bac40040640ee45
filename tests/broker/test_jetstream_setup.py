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

from monarch.broker.connections.cluster import nats_cluster
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
