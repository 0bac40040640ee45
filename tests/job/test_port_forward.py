"""PortForwarder: TCP through the broker between two procs, with real sockets on both ends."""

from __future__ import annotations

import asyncio
import socket
import struct

import pytest

from monarch.actor import ActorError, this_host, this_proc
from monarch.job import PortForwarder

H = "127.0.0.1"


@pytest.fixture(scope="module")
def procs(nats_url):
    """Two procs of this machine: ``procs=0`` reaches the services, ``procs=1`` listens."""
    mesh = this_host().spawn_procs(per_host={"procs": 2})
    mesh.initialized.get(timeout=60)  # running before any test counts its processes
    try:
        yield mesh
    finally:
        mesh.stop().get(timeout=60)


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind((H, 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(64 * 1024):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


async def forward(procs, service_port) -> tuple[int, PortForwarder]:
    (port,) = free_ports(1)
    fwd = this_proc().spawn("fwd", PortForwarder)
    await fwd.forward.call_one(
        procs.slice(procs=0), service_port, procs.slice(procs=1), f"{H}:{port}"
    )
    return port, fwd


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def refused(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((H, port)) != 0


def test_bytes_go_both_ways_and_stopping_the_forwarder_closes_the_port(procs):
    async def main():
        server = await asyncio.start_server(echo, H, 0)
        port, fwd = await forward(procs, server.sockets[0].getsockname()[1])
        payload = bytes(range(256)) * 1024
        reader, writer = await asyncio.open_connection(H, port)
        writer.write(payload)
        writer.write_eof()  # a half-close reaches the service, whose close comes back as EOF
        assert await reader.readexactly(len(payload)) == payload
        assert await reader.read() == b""
        writer.close()
        await fwd.stop()
        server.close()
        return port

    assert refused(run(main()))


def test_concurrent_connections_reach_the_service_of_their_own_rank(procs):
    async def main():
        async def identify(rank, _r, w):
            w.write(bytes([rank]))
            await w.drain()
            w.close()

        servers = [await asyncio.start_server(lambda r, w, k=k: identify(k, r, w), H, 0)
                   for k in range(2)]  # fmt: skip
        dst = [s.sockets[0].getsockname()[1] for s in servers]
        src = free_ports(2)
        fwd = this_proc().spawn("fwd", PortForwarder)
        await fwd.forward.call_one(
            procs, lambda p: dst[p["procs"]], procs, lambda p: f"{H}:{src[p['procs']]}"
        )

        async def ask(port):
            r, w = await asyncio.open_connection(H, port)
            data = await r.readexactly(1)
            w.close()
            return data

        got = await asyncio.gather(*(ask(src[k]) for k in range(2) for _ in range(6)))
        await fwd.stop()
        for s in servers:
            s.close()
        return got

    assert run(main()) == [b"\x00"] * 6 + [b"\x01"] * 6


def test_eight_mib_each_way_arrive_intact_through_a_slow_reader(procs):
    size = 8 * 1024 * 1024
    payload = bytes(i % 251 for i in range(size))

    async def main():
        async def slow_echo(reader, writer):  # reads slowly: the sender must be held back
            while data := await reader.read(64 * 1024):
                await asyncio.sleep(0.001)
                writer.write(data)
                await writer.drain()
            writer.close()

        server = await asyncio.start_server(slow_echo, H, 0)
        port, fwd = await forward(procs, server.sockets[0].getsockname()[1])
        reader, writer = await asyncio.open_connection(H, port)

        async def send():
            writer.write(payload)
            await writer.drain()
            writer.write_eof()

        sending = asyncio.create_task(send())
        back = await reader.readexactly(size)
        assert await reader.read() == b""
        await sending
        writer.close()
        await fwd.stop()
        server.close()
        return back

    assert run(main()) == payload


def test_a_reset_on_either_side_resets_the_other(procs):
    async def main():
        service_gone = asyncio.Event()

        async def firehose(_r, w):
            try:
                while True:
                    w.write(b"x" * 65536)
                    await w.drain()
            except OSError:
                pass
            finally:
                w.close()
                service_gone.set()

        server = await asyncio.start_server(firehose, H, 0)
        port, fwd = await forward(procs, server.sockets[0].getsockname()[1])
        reader, writer = await asyncio.open_connection(H, port)
        await reader.readexactly(65536)
        writer.transport.abort()  # RST from the client...
        await asyncio.wait_for(service_gone.wait(), 10)  # ...is seen by the service
        server.close()

        async def reset_at_once(r, w):
            await r.read(1)
            linger0 = struct.pack("ii", 1, 0)  # close with RST, not FIN
            w.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger0)
            w.transport.abort()  # RST from the service...

        server = await asyncio.start_server(reset_at_once, H, 0)
        await fwd.stop()
        port, fwd = await forward(procs, server.sockets[0].getsockname()[1])
        reader, writer = await asyncio.open_connection(H, port)
        writer.write(b"?")
        with pytest.raises(ConnectionResetError):  # ...reaches the client as a reset
            while await reader.read(65536):
                pass
        writer.close()
        await fwd.stop()
        server.close()

    run(main())


def test_bad_forwards_fail_and_leave_nothing_listening(procs):
    async def main():
        fwd = this_proc().spawn("fwd", PortForwarder)
        with pytest.raises(ActorError, match="must have the same shape"):
            await fwd.forward.call_one(procs, 1234, procs.slice(procs=0), f"{H}:5678")
        with pytest.raises(ActorError, match="'address:port' form"):
            await fwd.forward.call_one(procs, 1234, procs, "5678")
        with pytest.raises(ActorError, match="1 through 65535"):
            await fwd.forward.call_one(procs, 0, procs, f"{H}:5678")
        dst, *src = free_ports(3)
        blocker = socket.socket()
        blocker.bind((H, src[1]))
        blocker.listen()
        try:  # rank 1 cannot listen: rank 0's listener is closed again
            with pytest.raises(ActorError):
                await fwd.forward.call_one(procs, dst, procs, lambda p: f"{H}:{src[p['procs']]}")
        finally:
            blocker.close()
        await fwd.stop()
        return src

    for port in run(main()):
        with socket.socket() as probe:
            probe.bind((H, port))  # free again
