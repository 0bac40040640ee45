"""HostMesh.sync_workspace: local folders mirrored to $WORKSPACE_DIR on real hosts, over the broker.

The hosts are real ``monarch host`` agents (ProcessJob) whose environment sets
``WORKSPACE_DIR``, as Monarch's own test of this does; ``this_host()`` is used
where the client's environment is the host's (auto_reload).
"""

from __future__ import annotations

import os
import signal
import sys

import pytest

from monarch.actor import Actor, ActorError, endpoint, this_host
from monarch.actors.procs.workspace_sync import WorkspaceReceiver
from monarch.core.future import Future
from monarch.core.process_runtime import runtime
from monarch.job import ProcessJob
from monarch.tools.config import Config, Workspace
from tests.helpers import wait_until


@pytest.fixture
def agent_host(nats_url, tmp_path):
    """One host agent whose procs see WORKSPACE_DIR=<tmp>/remote."""
    remote = tmp_path / "remote"
    remote.mkdir()
    job = ProcessJob({"hosts": 1}, env={"WORKSPACE_DIR": str(remote)})
    try:
        yield job.state(cached_path=None).hosts, remote
    finally:
        job.kill()


def tree(root) -> dict[str, object]:
    """What a folder holds: files' bytes and mode bits, links' targets, folders."""
    out: dict[str, object] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                out[rel] = ("link", os.readlink(path))
            elif os.path.isdir(path):
                out[rel] = "dir"
            else:
                with open(path, "rb") as f:
                    out[rel] = (f.read(), os.stat(path).st_mode & 0o777)
    return out


def test_folders_are_mirrored_as_rsync_would_and_only_changed_files_travel(agent_host, tmp_path):
    hosts, remote = agent_host
    src = tmp_path / "project"
    (src / "pkg" / "empty").mkdir(parents=True)
    (src / "pkg" / "model.py").write_text("LAYERS = 4\n")
    (src / "train.sh").write_text("#!/bin/sh\necho train\n")
    os.chmod(src / "train.sh", 0o755)
    (src / "notes.txt").write_text("v1")
    os.symlink("pkg/model.py", src / "model_link.py")
    config = Config(scheduler="slurm", workspace=Workspace(dirs={str(src): "proj"}))

    hosts.sync_workspace(config.workspace).get(timeout=60)
    assert tree(remote / "proj") == tree(src)
    kept = os.stat(remote / "proj" / "pkg" / "model.py")

    # Change one file, add one, remove one; a stray file on the host goes too (--delete).
    (src / "notes.txt").write_text("v2")
    (src / "pkg" / "data.py").write_text("ROWS = 10\n")
    os.remove(src / "train.sh")
    (remote / "proj" / "stray.tmp").write_text("left by hand")
    hosts.sync_workspace(config.workspace).get(timeout=60)
    assert tree(remote / "proj") == tree(src)
    again = os.stat(remote / "proj" / "pkg" / "model.py")
    assert (again.st_ino, again.st_mtime_ns) == (kept.st_ino, kept.st_mtime_ns)  # not resent

    # A folder mapped to "" lands in WORKSPACE_DIR itself; a list maps each to its name.
    hosts.sync_workspace(Workspace(dirs=[str(src / "pkg")])).get(timeout=60)
    assert tree(remote / "pkg") == tree(src / "pkg")


class Reads(Actor):
    """Imports a module from the synced workspace and reports its value."""

    @endpoint
    def value(self) -> int:
        sys.path.insert(0, os.path.join(os.environ["WORKSPACE_DIR"], "proj"))
        import ws_sync_settings

        return ws_sync_settings.VALUE


def test_auto_reload_reloads_changed_modules_in_the_running_procs(nats_url, tmp_path, monkeypatch):
    monkeypatch.setenv("WORKSPACE_DIR", str(tmp_path / "remote"))  # this host's procs see it
    src = tmp_path / "project"
    src.mkdir()
    (src / "ws_sync_settings.py").write_text("VALUE = 1\n")
    workspace = Workspace(dirs={str(src): "proj"})
    host = this_host()
    procs = host.spawn_procs(per_host={"gpus": 2})
    try:
        host.sync_workspace(workspace).get(timeout=60)
        readers = procs.spawn("reads", Reads)
        assert list(readers.value.call().get(timeout=60).values()) == [1, 1]

        (src / "ws_sync_settings.py").write_text("VALUE = 2\n")
        host.sync_workspace(workspace).get(
            timeout=60
        )  # files only: the procs keep what they loaded
        assert list(readers.value.call().get(timeout=60).values()) == [1, 1]
        (src / "ws_sync_settings.py").write_text("VALUE = 3\n")
        host.sync_workspace(workspace, auto_reload=True).get(timeout=60)
        assert list(readers.value.call().get(timeout=60).values()) == [3, 3]
        # A module that no longer loads is the caller's error (the files are synced).
        (src / "ws_sync_settings.py").write_text("VALUE = (\n")
        with pytest.raises(ActorError, match="SyntaxError"):
            host.sync_workspace(workspace, auto_reload=True).get(timeout=60)
        assert (tmp_path / "remote" / "proj" / "ws_sync_settings.py").read_text() == "VALUE = (\n"
    finally:
        procs.stop().get(timeout=60)
        # The receiver proc sync_workspace keeps on this host for the next sync (until the
        # client ends): stopped here, as the test must leave no process behind.
        receivers = host._workspace.receivers_state
        Future(runtime().run_coro(receivers.stop())).get(timeout=60)


def test_a_receiver_that_dies_is_not_the_users_failure_and_the_next_sync_replaces_it(
    nats_url, tmp_path, monkeypatch, root_faults
):
    """The receivers are the library's own actors: when one dies (its proc is killed, or
    its host goes), no unhandled failure reaches the user's fault hook."""
    monkeypatch.setenv("WORKSPACE_DIR", str(tmp_path / "remote"))
    src = tmp_path / "project"
    src.mkdir()
    (src / "a.txt").write_text("a")
    host = this_host()
    try:
        host.sync_workspace(Workspace(dirs={str(src): "one"})).get(timeout=60)
        receivers = host._workspace.receivers
        (proc,) = host._workspace.receivers_state.procs
        os.kill(proc.pid, signal.SIGKILL)
        assert wait_until(lambda: receivers._state.dead, timeout=30)  # its death was handled
        host.sync_workspace(Workspace(dirs={str(src): "two"})).get(timeout=60)
        assert (tmp_path / "remote" / "two" / "a.txt").read_text() == "a"
        assert host._workspace.receivers is not receivers
        assert root_faults.failures == []
    finally:
        receivers = host._workspace.receivers_state
        Future(runtime().run_coro(receivers.stop())).get(timeout=60)


def test_what_cannot_be_synced_is_refused_with_the_reason(
    agent_host, nats_url, tmp_path, monkeypatch
):
    hosts, remote = agent_host
    src = tmp_path / "project"
    src.mkdir()
    with pytest.raises(ValueError, match="must stay under"):
        hosts.sync_workspace(Workspace(dirs={str(src): "../outside"}))
    with pytest.raises(RuntimeError, match="sliced host mesh"):
        hosts.slice(hosts=0).sync_workspace(Workspace(dirs={str(src): "p"}))
    with pytest.raises(NotImplementedError, match="Use HostMesh.sync_workspace"):
        hosts.spawn_procs(per_host={"gpus": 1}).sync_workspace(Workspace(dirs={str(src): "p"}))
    monkeypatch.setenv("CONDA_PREFIX", "/opt/conda/envs/train")
    with pytest.raises(NotImplementedError, match="conda environment"):
        hosts.sync_workspace(Workspace(dirs={str(src): "p"}), conda=True)
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        hosts.sync_workspace(Workspace(dirs={str(tmp_path / "nope"): "p"})).get(timeout=60)

    # A host whose environment has no WORKSPACE_DIR says so.
    bare = ProcessJob({"hosts": 1})
    try:
        with pytest.raises(ActorError, match="WORKSPACE_DIR is not set"):
            bare.state(cached_path=None).hosts.sync_workspace(Workspace(dirs={str(src): "p"})).get(
                timeout=60
            )
    finally:
        bare.kill()


def test_a_receiver_refuses_paths_that_leave_the_workspace(agent_host, tmp_path):
    """A foreign caller that reaches a receiver cannot write outside $WORKSPACE_DIR."""
    hosts, remote = agent_host
    receiver = hosts.spawn_procs(per_host={}).spawn("recv", WorkspaceReceiver)
    for rel in ("../escaped.txt", "/tmp/escaped.txt", "a/../../escaped.txt"):
        with pytest.raises(ActorError, match="leaves its folder"):
            receiver.apply.call_one("p", [], {}, {rel: (b"x", 0o644)}, []).get(timeout=30)
    with pytest.raises(ActorError, match="leaves its folder"):  # through a link it made
        receiver.apply.call_one(
            "p", [], {"out": str(tmp_path)}, {"out/escaped.txt": (b"x", 0o644)}, []
        ).get(timeout=30)
    with pytest.raises(ActorError, match="must stay under"):
        receiver.listing.call_one("../..").get(timeout=30)
    assert not (tmp_path / "escaped.txt").exists() and not os.path.exists("/tmp/escaped.txt")


def test_workspace_and_config_read_folders_as_monarch_does(tmp_path, monkeypatch):
    from pathlib import Path

    from monarch.tools.config import CondaEnvironment

    assert Workspace(dirs=["/src/torch", Path("/src/titan")]).dirs == {
        Path("/src/torch"): "torch",
        Path("/src/titan"): "titan",
    }
    assert Workspace(dirs={"/src/titan": "github/titan"}).dirs == {
        Path("/src/titan"): "github/titan"
    }
    with pytest.raises(AssertionError, match="empty folder"):
        Workspace(dirs=[""])
    assert Config().workspace == Workspace.null() and Workspace.null().env is None
    assert Config(workspace="/src/proj").workspace.dirs == {Path("/src/proj"): ""}
    monkeypatch.setenv("CONDA_PREFIX", "/opt/conda/envs/a")
    assert CondaEnvironment().conda_prefix == "/opt/conda/envs/a"
    assert CondaEnvironment("/x") == CondaEnvironment("/x") != CondaEnvironment()
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f.txt").write_text("f")
    Workspace(dirs={tmp_path / "a": "sub/a"}).merge(tmp_path / "out")
    assert (tmp_path / "out" / "sub" / "a" / "f.txt").read_text() == "f"
