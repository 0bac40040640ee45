"""The caller's side of telemetry: a call's trace id and its send span.

Reached only while telemetry is on (``ActorMesh._call`` and ``_cast`` check
:data:`monarch.telemetry.recorder.ON` and come here): the call gets a fresh
trace id, which travels in its ``Mon-Trace`` header so the actor's deliver
and handle spans (and the caller's reply spans, recorded by its
:class:`~monarch.actors.calls.gather.Gather`) join it; the send span covers
encoding the arguments and handing the message to the broker (or the loop).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from monarch.telemetry import recorder as tel

if TYPE_CHECKING:  # annotations only: actor_mesh calls into this module
    from monarch.actors.calls.actor_mesh import ActorMesh


def _target(mesh: ActorMesh) -> tuple[str | None, int | None]:
    ranks = mesh._view.ranks
    if len(ranks) == 1:
        rank = ranks[0]
        return mesh._state.actor_id(rank), rank
    return None, None


def traced_call(
    mesh: ActorMesh,
    endpoint: str,
    args: tuple,
    kwargs: dict,
    gather: str,
    adhoc: str | None,
    fold: Any = None,
) -> Any:
    rec = tel._recorder
    if rec is None:  # stopped meanwhile
        return mesh._call(endpoint, args, kwargs, gather, adhoc, True, "", fold)
    trace = rec.new_trace()
    start = time.time()
    ok = False
    try:
        result = mesh._call(endpoint, args, kwargs, gather, adhoc, True, trace, fold)
        ok = True
        return result
    finally:
        actor_id, rank = _target(mesh) if gather != "choose" else (None, None)
        rec.span("send", trace, start, time.time(), actor_id, mesh._name, rank, endpoint, ok)


def traced_cast(
    mesh: ActorMesh,
    endpoint: str,
    args: tuple,
    kwargs: dict,
    adhoc: str | None,
    port: Any,
    selection: str,
) -> None:
    rec = tel._recorder
    if rec is None:  # stopped meanwhile
        return mesh._cast(endpoint, args, kwargs, adhoc, port, selection, "")
    trace = rec.new_trace()
    start = time.time()
    ok = False
    try:
        mesh._cast(endpoint, args, kwargs, adhoc, port, selection, trace)
        ok = True
    finally:
        actor_id, rank = _target(mesh) if selection == "all" else (None, None)
        rec.span("send", trace, start, time.time(), actor_id, mesh._name, rank, endpoint, ok)
