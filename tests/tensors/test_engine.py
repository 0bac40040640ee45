"""Remote tensors: handles, metadata, pipelined ops in order, fetching values, no_mesh."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import monarch
import monarch.tensors
from monarch.tensors import controller as controller_mod
from tests.tensors.tensor_helpers import rank_value, values, write_file


def test_import_monarch_actor_does_not_import_torch():
    code = (
        "import sys, monarch, monarch.actor, monarch.tensors.worker\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "monarch.fetch_shard\n"
        "assert 'torch' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_script_that_ends_while_the_meta_warm_up_runs_exits_cleanly():
    # The warm-up's first meta op takes seconds (torch imports torch._dynamo for it). As a
    # daemon thread it was stopped inside that op by the interpreter's exit, and the
    # process aborted: "terminate called without an active exception", status 134.
    code = (
        "import torch\n"
        "from monarch.tensors.controller import _warm_up_meta\n"
        "_warm_up_meta()\n"
        "print('ending')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, "ending\n"), done.stderr
    assert "terminate called" not in done.stderr


def test_lazy_names_on_monarch_are_the_tensor_engine():
    from monarch.tensors.tensor import Tensor

    assert monarch.Tensor is Tensor
    for name in ("remote", "fetch_shard", "inspect", "show", "reduce", "reduce_", "to_mesh",
                 "slice_mesh", "no_mesh", "get_active_mesh", "RemoteTensorError"):  # fmt: skip
        assert getattr(monarch, name) is not None
    with pytest.raises(AttributeError):
        monarch.no_such_name


def test_factories_and_ops_make_handles_with_local_metadata(procs, monkeypatch):
    with procs.activate():
        assert monarch.get_active_mesh() is procs
        x = torch.ones(3, 4, dtype=torch.float64)
        y = (x * 2 + 1).t()
        assert isinstance(y, monarch.Tensor)
        pushed = []
        monkeypatch.setattr(
            controller_mod.Controller, "_push", lambda self, item: pushed.append(item)
        )
        assert y.shape == (4, 3) and y.size(0) == 4 and y.dim() == 2 and y.numel() == 12
        assert y.dtype == torch.float64 and y.device == torch.device("cpu")
        assert not y.requires_grad and not y.is_contiguous()
        assert "monarch.Tensor" in repr(y) and "hosts: 2" in repr(y)
        assert pushed == []  # metadata never leaves the client
        monkeypatch.undo()
        assert monarch.inspect(y).tolist() == [[3.0] * 3] * 4


def test_each_proc_holds_its_own_tensor(procs):
    with procs.activate():
        r = rank_value()
        doubled = r * 2
        assert values(doubled, procs) == [2.0, 4.0, 6.0, 8.0]
        assert monarch.inspect(doubled, hosts=1, gpus=0).item() == 6.0
        assert monarch.fetch_shard(doubled, {"hosts": 0}, gpus=1).get(timeout=30).item() == 4.0
        assert monarch.inspect(doubled).item() == 2.0  # default: coordinate 0 everywhere


def test_ops_are_pipelined_and_applied_in_order(procs, round_trips):
    calls = round_trips
    with procs.activate():
        x = torch.zeros(2)
        for i in range(500):
            x.add_(1)
            x.mul_(2) if i % 100 == 0 else None
        y = x + rank_value()
        assert calls == []  # no round trip while issuing ops
        expected = 0.0
        for i in range(500):
            expected = (expected + 1) * (2 if i % 100 == 0 else 1)
        assert values(y, procs) == [[expected + r] * 2 for r in (1, 2, 3, 4)]


def test_fetch_structures_and_show(procs, capsys):
    with procs.activate():
        a, b = torch.arange(3), torch.ones(2)
        got = monarch.fetch_shard({"a": a, "pair": (b, 7)}, hosts=1, gpus=1).get(timeout=30)
        assert got["a"].tolist() == [0, 1, 2] and got["pair"][0].tolist() == [1.0, 1.0]
        assert got["pair"][1] == 7
        shown = monarch.show(a)
    assert shown.tolist() == [0, 1, 2]
    assert "tensor([0, 1, 2])" in capsys.readouterr().out


def test_fetch_needs_every_coordinate(procs):
    with procs.activate():
        a = torch.ones(1)
        with pytest.raises(ValueError, match="gpus"):
            monarch.fetch_shard(a, hosts=1)
        with pytest.raises(KeyError):
            monarch.fetch_shard(a, hosts=0, gpus=0, racks=0)
        with pytest.raises(IndexError):
            monarch.fetch_shard(a, hosts=0, gpus=2)


def test_no_mesh_steps_out(procs):
    with procs.activate():
        remote_t = torch.ones(2)
        with monarch.no_mesh.activate():
            local = torch.ones(2)
            assert not isinstance(local, monarch.Tensor)
            assert (local + 1).tolist() == [2.0, 2.0]
            assert isinstance(remote_t + 1, monarch.Tensor)  # handles still run remotely
        assert isinstance(torch.zeros(1), monarch.Tensor)
    assert not isinstance(torch.zeros(1), monarch.Tensor)
    with pytest.raises(ValueError):
        monarch.get_active_mesh()


def test_values_are_not_readable_on_the_client(procs):
    with procs.activate():
        t = torch.ones(1)
        for read in (bool, float, lambda v: v.item(), lambda v: v.tolist()):
            with pytest.raises(TypeError, match="monarch.inspect"):
                read(t)


def test_local_tensors_do_not_mix_with_remote_ones(procs):
    local = torch.ones(2)
    with procs.activate():
        with pytest.raises(monarch.tensors.MeshError, match="local torch.Tensor"):
            torch.ones(2) + local
        copied = torch.as_tensor(local * 3)  # a factory's data may be local: it is sent
        assert monarch.inspect(copied, hosts=1, gpus=1).tolist() == [3.0, 3.0]


def test_shape_errors_raise_at_the_caller(procs):
    with procs.activate():
        a = torch.ones(2, 3)
        with pytest.raises(RuntimeError, match="same reduction dim|cannot be multiplied"):
            a @ a
        with pytest.raises(NotImplementedError, match="monarch.remote"):
            torch.nonzero(a)  # the result's shape depends on the data
        assert monarch.inspect(a.sum()).item() == 6.0


def test_autograd_runs_on_the_procs(procs):
    with procs.activate():
        w = torch.ones(3, requires_grad=True)
        loss = (w * rank_value()).sum() * 2
        assert loss.requires_grad and loss.grad_fn is not None
        loss.backward()
        assert w.grad is not None and w.grad.shape == (3,)
        assert values(w.grad, procs) == [[2.0 * r] * 3 for r in (1, 2, 3, 4)]
        with torch.no_grad():
            w -= 0.5 * w.grad
            w.grad.zero_()
        assert w.requires_grad
        assert values(w, procs) == [[1.0 - r] * 3 for r in (1, 2, 3, 4)]
        assert values(w.grad, procs) == [[0.0] * 3] * 4


def test_sliced_mesh_runs_only_there(procs):
    part = procs.slice(hosts=1)
    with part.activate():
        t = rank_value() * 10
        assert t.mesh is part
        assert values(t, part) == [30.0, 40.0]
    with procs.activate():
        other = torch.ones(1)
        with pytest.raises(monarch.tensors.MeshError, match="different meshes"):
            t + other


def test_dropped_tensor_cannot_be_used(procs):
    with procs.activate():
        t = torch.ones(1)
        t.drop()
        assert t.dropped
        with pytest.raises(monarch.tensors.MeshError, match="dropped"):
            t + 1


def test_stop_runs_queued_ops_then_refuses_new_ones(nats_url, tmp_path):
    from monarch.actor import MeshStoppedError, this_host

    pm = this_host().spawn_procs(per_host={"gpus": 1}, name="short")
    out = tmp_path / "written"
    with pm.activate():
        t = torch.ones(2) * 3
        assert monarch.inspect(t).tolist() == [3.0, 3.0]
        write_file(str(out), t + 1)  # queued, not flushed yet, when stop() is called
        pm.stop().get(timeout=60)
        assert out.read_text() == "[4.0, 4.0]"
        with pytest.raises(MeshStoppedError):
            t + 1
        with pytest.raises(MeshStoppedError):
            monarch.fetch_shard(t)
