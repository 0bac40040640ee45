"""Monarch's top-level names: each works as in Monarch 0.7 or raises NotImplementedError saying why.

Values asserted for ``NDSlice`` and ``Shape`` are the ones Monarch 0.7 gives
for the same calls. The builtins and ``coalescing`` run on real procs.
"""

from __future__ import annotations

import logging
import pickle

import pytest
import torch

import monarch
from monarch import NDSlice, Shape
from monarch.actor import Actor, endpoint, this_host
from monarch.timer import (
    ExecutionTimer,
    execution_timer_start,
    execution_timer_stop,
    get_execution_timer_average_ms,
    get_latest_timer_measurement,
)

# Every name in Monarch 0.7's ``monarch.__all__`` that scripts import, except the
# Meta-internal ones (mast_reserve, set_meta, Simulator, function_resolvers,
# RemoteProcessGroup, ActorFuture).
MONARCH_NAMES = [
    "coalescing",
    "clear_runtime_config",
    "configure",
    "configured",
    "get_global_config",
    "get_runtime_config",
    "get_active_mesh",
    "no_mesh",
    "remote",
    "Extent",
    "Future",
    "Shape",
    "Selection",
    "NDSlice",
    "OpaqueRef",
    "get_active_stream",
    "Stream",
    "Tensor",
    "reduce",
    "reduce_",
    "to_mesh",
    "slice_mesh",
    "call_on_shard_and_fetch",
    "fetch_shard",
    "inspect",
    "show",
    "grad_function",
    "grad_generator",
    "world_mesh",
    "RemoteProcessGroup",  # Monarch 0.7's; function_resolvers is not here (docs/support.md)
    "Simulator",
    "set_meta",
    "mast_reserve",
    "timer",
    "builtins",
]


def test_every_monarch_top_level_name_imports():
    for name in MONARCH_NAMES:
        assert getattr(monarch, name) is not None, name
        assert name in monarch.__all__
    from monarch import builtins, timer  # noqa: F401 - the import is the test

    assert timer.ExecutionTimer is ExecutionTimer
    with pytest.raises(AttributeError, match="no_such_name"):
        monarch.no_such_name  # noqa: B018


# -- NDSlice and Shape ---------------------------------------------------------


def test_ndslice_ranks_positions_and_coordinates():
    s = NDSlice(offset=1, sizes=[2, 3], strides=[4, 1])
    assert list(s) == [1, 2, 3, 5, 6, 7]
    assert len(s) == 6 and s.ndim == 2
    assert (s.offset, s.sizes, s.strides) == (1, [2, 3], [4, 1])
    assert s[4] == 6 and s.get(3) == 5 and s[1:3] == (2, 3)
    assert s.index(5) == 3
    assert s.coordinates(5) == [1, 0]
    assert s.nditem([1, 2]) == 7
    with pytest.raises(IndexError):
        s[6]
    with pytest.raises(ValueError):
        s.get(6)
    with pytest.raises(ValueError):
        s.index(4)  # between the rows: not in the slice


def test_ndslice_constructors_equality_and_pickling():
    dense = NDSlice.new_row_major([2, 3])
    assert dense == NDSlice(offset=0, sizes=[2, 3], strides=[3, 1])
    assert hash(dense) == hash(NDSlice(offset=0, sizes=[2, 3], strides=[3, 1]))
    assert NDSlice.from_list([0, 1, 2, 5, 6]) == [
        NDSlice(offset=0, sizes=[3], strides=[1]),
        NDSlice(offset=5, sizes=[2], strides=[1]),
    ]
    assert pickle.loads(pickle.dumps(dense)) == dense


def test_shape_selects_by_label():
    shape = Shape(["host", "gpu"], NDSlice.new_row_major([2, 3]))
    assert shape.labels == ["host", "gpu"] and len(shape) == 6
    assert shape.ranks() == [0, 1, 2, 3, 4, 5]
    assert shape.index(host=1).ranks() == [3, 4, 5]
    assert shape.index(host=1).labels == ["gpu"]
    assert shape.at("gpu", 2).ranks() == [2, 5]
    narrowed = shape.select("gpu", slice(1, 3))
    assert narrowed.labels == ["host", "gpu"] and narrowed.ranks() == [1, 2, 4, 5]
    assert shape.index(gpu=slice(0, 3, 2)).ranks() == [0, 2, 3, 5]
    assert shape.coordinates(4) == {"host": 1, "gpu": 1}
    assert dict(shape.extent) == {"host": 2, "gpu": 3}
    assert Shape.unity().ranks() == [0] and len(Shape.unity()) == 1
    assert repr(shape) == "{host=2,gpu=3}"
    assert pickle.loads(pickle.dumps(shape)) == shape
    with pytest.raises(ValueError, match="foo"):
        shape.index(foo=1)
    with pytest.raises(ValueError, match="mismatch"):
        Shape(["a"], NDSlice.new_row_major([2, 3]))


# -- timer -----------------------------------------------------------------------


def test_execution_timer_measures_cpu_sections():
    ExecutionTimer.reset()
    for _ in range(3):
        with ExecutionTimer.time("matmul", use_cpu=True):
            torch.ones(64, 64) @ torch.ones(64, 64)
    execution_timer_start("other", use_cpu=True)
    execution_timer_stop("other", use_cpu=True)
    summary = ExecutionTimer.summary()
    assert summary["matmul"]["count"] == 3 and summary["other"]["count"] == 1
    stats = summary["matmul"]
    assert stats["min_ms"] <= stats["mean_ms"] <= stats["max_ms"]
    assert stats["total_ms"] == pytest.approx(3 * stats["mean_ms"])
    latest = get_latest_timer_measurement("other")
    assert latest.dtype == torch.float64 and latest.item() >= 0.0
    assert get_execution_timer_average_ms("matmul").item() == pytest.approx(stats["mean_ms"])
    ExecutionTimer.reset()
    assert ExecutionTimer.summary() == {}
    assert ExecutionTimer.get_latest_measurement("matmul") == 0.0


def test_execution_timer_stop_without_start_says_so():
    ExecutionTimer.reset()
    with pytest.raises(ValueError, match="never_started"):
        ExecutionTimer.stop("never_started", use_cpu=True)


# -- names that are not built ------------------------------------------------------


@pytest.mark.parametrize(
    "use, hint",
    [
        (lambda: monarch.OpaqueRef(object()), "Actor"),
        (lambda: monarch.Selection.all(), "mesh.slice"),
        (lambda: monarch.Selection.from_string("*"), "mesh.slice"),
        (lambda: monarch.call_on_shard_and_fetch(print, shard={}), "fetch_shard"),
        (lambda: monarch.world_mesh(None, [], 1), "spawn_procs"),
        (lambda: monarch.grad_generator(None), "backward"),
        (lambda: monarch.grad_function(None), "backward"),
        (lambda: monarch.RemoteProcessGroup(None, ("gpus",)), "monarch.reduce"),
        (lambda: monarch.Simulator(hosts=1, gpus=2), "spawn_procs"),
        (lambda: monarch.set_meta(True), "spawn_procs"),
        (lambda: monarch.mast_reserve(), "monarch.job"),
    ],
)
def test_unbuilt_names_raise_not_implemented_saying_why(use, hint):
    with pytest.raises(NotImplementedError, match="monarch over NATS") as info:
        use()
    assert hint in str(info.value)


def test_unbuilt_classes_still_work_with_isinstance():
    assert not isinstance(object(), monarch.OpaqueRef)
    assert not isinstance(object(), monarch.Selection)


# -- on real procs: builtins and coalescing ----------------------------------------


class LogProbe(Actor):
    """Looks at the procs' ``monarch.builtins.log`` logger from inside the proc."""

    def __init__(self) -> None:
        self.records: list[str] = []

    @endpoint
    def capture(self) -> None:
        probe = self

        class Keep(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                probe.records.append(f"{record.levelname}:{record.getMessage()}")

        logging.getLogger("monarch.builtins.log").addHandler(Keep())

    @endpoint
    def seen(self) -> tuple[int, list[str]]:
        return logging.getLogger("monarch.builtins.log").level, list(self.records)


@pytest.fixture(scope="module")
def procs(nats_url):
    pm = this_host().spawn_procs(per_host={"gpus": 2}, name="toplevel")
    pm.initialized.get(timeout=60)
    yield pm
    pm.stop().get(timeout=60)


def local_rand(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(5, generator=gen)


def test_set_manual_seed_remote_seeds_every_proc(procs):
    from monarch.builtins.random import set_manual_seed_remote

    with procs.activate():
        set_manual_seed_remote(1234)
        a = torch.rand(5)
        set_manual_seed_remote(1234)
        b = torch.rand(5)
        set_manual_seed_remote(1235)
        c = torch.rand(5)
        set_manual_seed_remote(1234, process_idx=1)
        d = torch.rand(5)
        got = monarch.inspect((a, b, c, d))
        other_proc = monarch.inspect(a, gpus=1)
    assert torch.equal(got[0], local_rand(1234))
    assert torch.equal(got[1], got[0])
    assert torch.equal(got[2], local_rand(1235))
    assert torch.equal(got[3], local_rand(1234 ^ 1))
    assert torch.equal(other_proc, got[0])


def test_rng_state_remote_round_trips(procs):
    from monarch.builtins.random import (
        get_rng_state_remote,
        seed_remote,
        set_manual_seed_remote,
        set_rng_state_remote,
    )

    with procs.activate():
        set_manual_seed_remote(7)
        state = get_rng_state_remote()
        x = torch.rand(5)
        seed_remote()  # a fresh seed: what follows differs ...
        set_rng_state_remote(state)  # ... until the state is put back
        y = torch.rand(5)
        got_state, got_x, got_y = monarch.inspect((state, x, y))
    torch.manual_seed(7)
    assert torch.equal(got_state, torch.get_rng_state())
    assert torch.equal(got_x, got_y)
    assert torch.equal(got_x, local_rand(7))


def test_log_builtins_log_and_set_the_level_on_every_proc(procs):
    from monarch.builtins.log import log_remote, set_logging_level_remote

    probe = procs.spawn("log_probe", LogProbe)
    probe.capture.call().get(timeout=60)
    with procs.activate():
        set_logging_level_remote(logging.ERROR)
        log_remote("ignored %s", "info", level=logging.INFO)
        log_remote("seen %s %d", "error", 42, level=logging.ERROR)
        ready = torch.zeros(1)
        for g in range(2):  # each proc ran everything sent before it (inspect reads one)
            monarch.inspect(ready, gpus=g)
    seen = probe.seen.call().get(timeout=60)
    assert len(seen) == 2
    for point, (level, records) in seen.items():
        assert level == logging.ERROR, point
        # the message starts with the worker actor's name, as Monarch's logs do in actors
        assert len(records) == 1
        head, _, message = records[0].partition("] ")
        assert head.startswith("ERROR:[actor=<root>.<monarch.tensors.worker.TensorWorker ")
        assert message == "seen error 42"


def test_coalescing_blocks_nest_and_compute_what_they_would_without(procs):
    with procs.activate():
        with monarch.coalescing():
            a = torch.zeros(3, 4)
            for _ in range(9):
                a = a + torch.ones(3, 4)
            with monarch.coalescing():
                b = a * 2
        got = monarch.inspect((a, b))
        with pytest.raises(KeyError):
            with monarch.coalescing():
                raise KeyError("passes through")
    assert torch.equal(got[0], torch.full((3, 4), 9.0))
    assert torch.equal(got[1], torch.full((3, 4), 18.0))


def test_streams_activate_nest_and_borrowed_tensors_compute_in_order(procs):
    main = monarch.get_active_stream()
    assert str(main) == "stream 'main'"
    other = monarch.Stream("other")
    with procs.activate():
        a = torch.ones(3)
        with other.activate():
            assert monarch.get_active_stream() is other
            b, borrow = other.borrow(a, mutable=True)
            b.add_(1)  # a and b share storage, as in Monarch
            c = b * 10
            borrow.drop()
        assert monarch.get_active_stream() is main
        d = c + a
        got = monarch.inspect((a, d))
    assert torch.equal(got[0], torch.full((3,), 2.0))
    assert torch.equal(got[1], torch.full((3,), 22.0))


def test_monarch_tools_network_answers_like_monarch():
    """Scripts import AddrType and get_ipaddr from monarch.tools.network, as in Monarch 0.7."""
    from monarch.tools.network import AddrType, get_ipaddr, get_sockaddr

    assert get_ipaddr("127.0.0.1", 80, AddrType.IPv4) == "127.0.0.1"
    assert get_sockaddr("127.0.0.1", 8080) == "127.0.0.1:8080"
    with pytest.raises(RuntimeError, match="cannot resolve host"):
        get_ipaddr("no-such-host.invalid", 80, AddrType.IPv4)


def test_monarch_builtins_exports_its_log_functions_and_imports_torch_only_then():
    """``from monarch.builtins import log_remote`` as in Monarch 0.7; the package alone
    still does not import torch (its functions need it)."""
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys, monarch.builtins as b\n"
        "assert 'torch' not in sys.modules\n"
        "from monarch.builtins import log_remote, set_logging_level_remote\n"
        "from monarch.builtins.log import log_remote as same\n"
        "assert log_remote is same and b.__all__ == ['log_remote', 'set_logging_level_remote']\n"
        "try:\n    b.absent\nexcept AttributeError as e:\n    print(e)\n"
    )
    root = str(Path(__file__).resolve().parents[1])
    r = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": root}, capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "module 'monarch.builtins' has no attribute 'absent'"
