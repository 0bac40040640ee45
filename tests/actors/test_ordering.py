"""Per-sender order holds across point, slice and whole-mesh messages."""

from __future__ import annotations

import random

from tests.actors.actors_for_tests import Echo
from tests.helpers import proc_mesh_fixture

grid = proc_mesh_fixture({"hosts": 2, "gpus": 2})


def test_interleaved_point_slice_and_broadcast_messages_arrive_in_send_order(grid):
    mesh = grid.spawn("order", Echo)
    targets = {
        "all": (mesh, [0, 1, 2, 3]),
        "host0": (mesh.slice(hosts=0), [0, 1]),
        "gpu1": (mesh.slice(gpus=1), [1, 3]),
        **{f"p{r}": (mesh.slice(hosts=r // 2, gpus=r % 2), [r]) for r in range(4)},
    }
    rng = random.Random(1234)
    names = list(targets)
    expected: dict[int, list] = {r: [] for r in range(4)}
    n = 10_000
    for i in range(n):
        name = rng.choice(names)
        ref, ranks = targets[name]
        if name.startswith("p") and rng.random() < 0.5:
            ref.record.call_one(name, i)  # a call and a send share one order
        else:
            ref.record.broadcast(name, i)
        for r in ranks:
            expected[r].append((name, i))
    seen = mesh.seen_log.call().get(timeout=120)
    for point, log in seen.items():
        assert len(log) == len(expected[point.rank])
        assert log == expected[point.rank], f"rank {point.rank} saw messages out of order"


def test_each_threads_calls_and_sends_keep_their_order_when_threads_write_them_themselves(grid):
    """Three script threads interleave broadcasts (through the loop's batch) with calls that
    they wait on (written by the thread itself when nothing waits, monarch.broker.natspy_internals.direct_write),
    each to a mesh of its own on the same procs (a thread writes a call itself only while no
    other call to that mesh is unanswered): every rank sees each thread's messages, all of
    them, in the order that thread sent them."""
    import threading

    from monarch.core.process_runtime import runtime

    meshes = [grid.spawn(f"thread_order{t}", Echo) for t in range(3)]
    direct = runtime()._direct_write
    assert direct is not None
    before = direct.writes
    n, threads = 1_500, 3
    expected = {(tid, r): [] for tid in range(threads) for r in range(4)}

    def traffic(tid: int) -> None:
        rng = random.Random(tid)
        mesh = meshes[tid]
        for i in range(n):
            rank = rng.randrange(4)
            if rng.random() < 0.5:
                point = mesh.slice(hosts=rank // 2, gpus=rank % 2)
                point.record.call_one(f"t{tid}", i).get(timeout=60)
                expected[tid, rank].append(i)
            else:
                mesh.record.broadcast(f"t{tid}", i)
                for r in range(4):
                    expected[tid, r].append(i)

    workers = [threading.Thread(target=traffic, args=(t,)) for t in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(180)
        assert not t.is_alive()
    for tid, mesh in enumerate(meshes):
        for point, log in mesh.seen_log.call().get(timeout=120).items():
            mine = [i for _, i in log]
            assert mine == expected[tid, point.rank], f"rank {point.rank}, thread {tid}"
    assert direct.writes - before > 100, "the threads never wrote a call themselves"
    # and the actors' threads wrote replies themselves (the calls' ranks: all four, surely)
    assert all(w > 0 for w in meshes[0].direct_writes.call().get(timeout=60).values())
