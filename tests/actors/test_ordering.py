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
