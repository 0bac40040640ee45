"""Actors for the supervision tests (importable by procs)."""

from __future__ import annotations

import ctypes
import os
import signal

from monarch.actor import Actor, Port, endpoint, this_host


class Worker(Actor):
    def __init__(self, path: str = "") -> None:
        self.path = path

    @endpoint
    def ping(self, x=None):
        return x

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def boom(self, message: str) -> None:
        raise ValueError(message)

    @endpoint(explicit_response_port=True)
    def port_boom(self, port: Port, message: str) -> None:
        raise KeyError(message)

    @endpoint
    def block(self) -> None:
        import time

        time.sleep(600)

    @endpoint
    def die(self, how: str) -> None:
        if how == "exit":
            os._exit(7)
        if how == "segfault":
            ctypes.string_at(0)
        os.kill(os.getpid(), signal.SIGKILL)

    def __cleanup__(self, exc) -> None:
        if self.path:
            with open(self.path, "a") as f:
                f.write(f"worker cleanup {type(exc).__name__ if exc else None}\n")


class BadInit(Actor):
    def __init__(self) -> None:
        raise RuntimeError("init exploded")

    @endpoint
    def ping(self) -> int:
        return 1


class Owner(Actor):
    """Spawns a child mesh; handles (or not) its failures."""

    def __init__(
        self, name: str, handle: bool, path: str = "", child_handles: bool | None = None
    ) -> None:
        self.name = name
        self.handle = handle
        self.path = path
        self.failures: list = []
        self.procs = this_host().spawn_procs(per_host={"gpus": 1})
        if child_handles is None:
            self.child = self.procs.spawn(f"{name}_leaf", Worker, path)
        else:
            self.child = self.procs.spawn(f"{name}_mid", Owner, f"{name}_mid", child_handles, path)

    def __supervise__(self, failure) -> bool:
        self.failures.append(failure)
        self._log(
            f"{self.name} supervise {failure.mesh_name} {failure.reason} handled={self.handle}"
        )
        return self.handle

    @endpoint
    def seen(self) -> list:
        return [
            (f.mesh_name, f.reason, f.ranks, f.cause.mesh_name if f.cause else None)
            for f in self.failures
        ]

    @endpoint
    def break_leaf(self) -> None:
        if self.child._class_name == "Owner":
            self.child.break_leaf.call_one().get(timeout=60)
        else:
            self.child.boom.broadcast("leaf failed")

    @endpoint
    def child_pid(self) -> int:
        return self.child.pid.call_one().get(timeout=60)

    def _log(self, line: str) -> None:
        if self.path:
            with open(self.path, "a") as f:
                f.write(line + "\n")

    def __cleanup__(self, exc) -> None:
        self._log(f"{self.name} cleanup")


class Holder(Actor):
    """Owns a worker mesh and hands out a reference to it."""

    def __init__(self) -> None:
        self.procs = this_host().spawn_procs(per_host={"gpus": 1})
        self.worker = self.procs.spawn("held", Worker)

    @endpoint
    def ref(self):
        return self.worker  # the reference waits until the worker exists

    def __supervise__(self, failure) -> bool:
        return True
