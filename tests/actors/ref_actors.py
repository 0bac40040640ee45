"""Actors and plain objects for the mesh-reference and host/proc-mesh tests (procs import them)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from typing import Any

from monarch.actor import Actor, context, current_rank, endpoint, this_host


@dataclasses.dataclass
class Holder:
    """An ordinary dataclass with mesh references among other fields."""

    mesh: Any = None
    procs: Any = None
    hosts: Any = None
    note: str = ""


class Box:
    """A plain class (no dataclass) keeping references in a dict of lists."""

    def __init__(self, **items: Any) -> None:
        self.items = {k: [v] for k, v in items.items()}

    def get(self, key: str) -> Any:
        return self.items[key][0]


class Where(Actor):
    """Says which process and rank it is."""

    @endpoint
    def where(self) -> dict:
        return {"rank": current_rank().rank, "point": dict(current_rank()), "pid": os.getpid()}

    @endpoint
    def add(self, x: int) -> int:
        return x + 1


class Hop(Actor):
    """Receives objects holding references, passes them on, and uses them."""

    @endpoint
    def back(self, obj: Any) -> Any:
        return obj

    @endpoint
    def via(self, obj: Any, other: Any) -> Any:
        """Send ``obj`` on to ``other`` (a Hop mesh of one) and return what comes back."""
        return other.back.call_one(obj).get(timeout=60)

    @endpoint
    def use_mesh(self, holder: Holder) -> list:
        """Call the actor mesh found in ``holder`` from here."""
        return [(dict(p), v) for p, v in holder.mesh.where.call().get(timeout=60).items()]

    @endpoint
    def procs_on_host_of(self, box: Box) -> list[int]:
        """Start a proc on the host of the one-proc mesh in ``box``; the pids there."""
        hosts = box.get("procs").host_mesh
        procs = hosts.spawn_procs(per_host={"gpus": 1}, name="on_host_of")
        self.__dict__.setdefault("kept", []).append(procs)
        return [v["pid"] for v in procs.spawn("w", Where).where.call().get(timeout=60).values()]

    @endpoint
    def spawn_on(self, box: Box) -> Holder:
        """Spawn ``Where`` on the proc mesh in ``box``; hand back a new object holding it."""
        procs = box.get("procs")
        mesh = procs.spawn("spawned_here", Where)
        assert list(mesh.add.call(1).get(timeout=60).values()) == [2] * len(mesh)
        self.__dict__.setdefault("spawned", []).append(mesh)
        return Holder(mesh=mesh, procs=procs, note="spawned by Hop")

    @endpoint
    def call_spawned(self) -> str:
        """Call the meshes this actor spawned: "ok", or the name of the error raised."""
        try:
            for mesh in self.__dict__.get("spawned", []):
                mesh.add.call(1).get(timeout=60)
        except Exception as e:
            return type(e).__name__
        return "ok"

    @endpoint
    def stop_spawned(self) -> None:
        for mesh in self.__dict__.pop("spawned", []):
            mesh.stop().get(timeout=60)

    @endpoint
    def own_proc(self) -> Box:
        """This actor's own process as a proc mesh of one, inside an object."""
        return Box(procs=context().actor_instance.proc, pid=os.getpid())

    @endpoint
    def stop_procs(self, holder: Holder) -> str:
        """Try to stop the proc mesh in ``holder``: "stopped", or the error raised."""
        try:
            holder.procs.stop().get(timeout=60)
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        return "stopped"

    @endpoint
    def procs_on_host(self, box: Box) -> list:
        """Start a proc on the host mesh in ``box``, use it, stop it: what the proc said."""
        procs = box.get("hosts").spawn_procs(per_host={"workers": 1}, name="onhost")
        try:
            return list(procs.spawn("w", Where).where.call().get(timeout=60).values())
        finally:
            procs.stop().get(timeout=60)


class FreshProcs(Actor):
    """Starts procs from an async endpoint (a class of its own: Monarch refuses an actor
    that mixes sync and async endpoints)."""

    @endpoint
    async def fresh_procs(self, wait: bool) -> Box:
        """Start procs here (owned by this actor) and return them, at once or once up."""
        procs = this_host().spawn_procs(per_host={"fresh": 1}, name="fresh")
        self.__dict__.setdefault("fresh", []).append(procs)
        if wait:
            await procs.initialized
        return Box(procs=procs)


class WrapperProbe(Actor):
    """Reports the marker set by the Python wrapper script that started its proc."""

    @endpoint
    def marker(self) -> str:
        return os.environ.get("WRAPPER_MARKER_PID", "")

    @endpoint
    def spawn_inner(self) -> Any:
        """Start a proc from inside this one with this_host() and return an actor on it."""
        procs = this_host().spawn_procs(per_host={"inner": 1}, name="inner")
        self._inner = procs  # kept (owned by this actor) until it stops
        return procs.spawn("inner_probe", WrapperProbe)

    @endpoint
    def env(self, name: str) -> str | None:
        return os.environ.get(name)

    @endpoint
    def affinity(self) -> list[int]:
        return sorted(os.sched_getaffinity(0))

    @endpoint
    def memory_policy(self) -> str:
        """The proc's NUMA memory policy, as the kernel shows it: ``default``, ``bind:0``..."""
        with open("/proc/self/numa_maps") as f:
            return f.readline().split()[1]

    @endpoint
    def argv0(self) -> str:
        with open("/proc/self/cmdline", "rb") as f:
            return f.read().split(b"\0")[0].decode()


class SeesBootstrap(Actor):
    """Reads, in ``__init__``, what a ``spawn_procs(bootstrap=...)`` function left."""

    def __init__(self) -> None:
        self.seen = os.environ.get("BOOTSTRAP_MARK")

    @endpoint
    def seen_at_init(self) -> tuple[str | None, int]:
        return self.seen, os.getpid()


def mark_bootstrapped() -> None:
    os.environ["BOOTSTRAP_MARK"] = f"sync {os.getpid()}"


async def mark_bootstrapped_async() -> None:
    await asyncio.sleep(0.01)
    os.environ["BOOTSTRAP_MARK"] = f"async {os.getpid()}"


def fail_bootstrap() -> None:
    raise RuntimeError("the scratch disk is not mounted")
