"""Asking real processes ``mon.<ns>.ctl.stats`` with a plain nats-py client, as a viewer does."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import nats

from monarch.broker.vocabulary.subjects import stats_subject
from tests.helpers import run_in_own_loop


async def _gather(url: str, namespace: str, window: float, body: bytes = b"") -> list[dict]:
    nc = await nats.connect(url)
    answers: list[dict] = []
    try:
        inbox = nc.new_inbox()

        async def on(msg: Any) -> None:
            answers.append(json.loads(msg.data))

        sub = await nc.subscribe(inbox, cb=on)
        await nc.publish(stats_subject(namespace), body, reply=inbox)
        await asyncio.sleep(window)
        await sub.unsubscribe()
    finally:
        await nc.close()
    return answers


def stats_answers(
    url: str, namespace: str = "default", window: float = 0.5, body: bytes = b""
) -> list[dict]:
    """Every answer heard within ``window`` seconds of one request (``body``: its body)."""
    return run_in_own_loop(_gather(url, namespace, window, body), timeout=30)


def actor_of(answers: list[dict], mesh: str, rank: int = 0) -> tuple[dict, dict] | None:
    """(the answering process, the actor) of ``mesh``'s ``rank`` in ``answers``."""
    for proc in answers:
        for actor in proc["actors"]:
            if actor["mesh"] == mesh and actor["rank"] == rank:
                return proc, actor
    return None


def wait_for_actor(
    url: str,
    mesh: str,
    rank: int = 0,
    until: Callable[[dict, dict], bool] = lambda proc, actor: True,
    timeout: float = 30.0,
) -> tuple[dict, dict]:
    """Ask again and again until ``mesh[rank]`` is in an answer and ``until(proc, actor)``."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        found = actor_of(stats_answers(url), mesh, rank)
        if found is not None:
            last = found
            if until(*found):
                return found
    raise AssertionError(f"not within {timeout} s: {mesh}[{rank}] as wanted; last seen: {last}")
