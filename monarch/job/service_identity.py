"""Monarch 0.7's service-identity helpers: a ``ProcId`` per worker, handed over in its address.

Monarch gives each worker's host service a unique ``ProcId`` at launch and
writes it in front of the worker's address, ``ID@tcp://host:port``, so that
a client reaching one machine under two names still means one worker.
Here a client finds a dialled worker by the agent it answers with, so the
identity's use is the other half of that promise: a worker started with
``run_worker_loop_forever(address=service_proc_addr(addr, pid))`` refuses a
client whose address names another identity (the worker it meant is gone;
another took its port), and a client given ``ID@address`` dials the address.

Launchers that set one environment for many workers (a Kubernetes
StatefulSet, an sbatch) pass all identities as a JSON list in
``MONARCH_SERVICE_PROC_IDS`` and each worker's index in
``MONARCH_SERVICE_PROC_RANK``; :func:`ranked_service_proc_id_from_env` picks
the worker's own.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from monarch.actor import ProcId, Uid

SERVICE_PROC_IDS_ENV = "MONARCH_SERVICE_PROC_IDS"
SERVICE_PROC_RANK_ENV = "MONARCH_SERVICE_PROC_RANK"


def new_service_proc_id() -> ProcId:
    """A fresh identity for one worker's host service (``service<hex>``)."""
    return ProcId(Uid.instance("service"))


def serialize_service_proc_ids(proc_ids: Sequence[ProcId]) -> str:
    """The identities as the JSON list a launcher puts in ``MONARCH_SERVICE_PROC_IDS``."""
    return json.dumps([str(p) for p in proc_ids])


def deserialize_service_proc_ids(serialized: str) -> list[ProcId]:
    """The identities of :func:`serialize_service_proc_ids`' text; ValueError if it is not one."""
    try:
        items = json.loads(serialized)
    except json.JSONDecodeError as e:
        raise ValueError(f"service ProcIds are a JSON list of strings, got {serialized!r}") from e
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise ValueError(f"service ProcIds are a JSON list of strings, got {serialized!r}")
    return [ProcId.from_string(i) for i in items]


def service_proc_addr(address: str, proc_id: ProcId | None) -> str:
    """``ID@address`` (just ``address`` without an identity): a worker address to listen
    on or attach to."""
    return address if proc_id is None else f"{proc_id}@{address}"


def service_proc_addrs(addresses: Sequence[str], proc_ids: Sequence[ProcId] | None) -> list[str]:
    """:func:`service_proc_addr` of each address and its identity (lists of one length)."""
    if proc_ids is None:
        return list(addresses)
    if len(addresses) != len(proc_ids):
        raise ValueError(f"{len(addresses)} worker addresses but {len(proc_ids)} service ProcIds")
    return [service_proc_addr(a, p) for a, p in zip(addresses, proc_ids)]


def ranked_service_proc_id_from_env(*, rank_env: str = SERVICE_PROC_RANK_ENV) -> ProcId | None:
    """This worker's identity: entry ``$rank_env`` of ``MONARCH_SERVICE_PROC_IDS``.

    None when either variable is unset (the worker then goes by its address
    alone); ValueError naming the variable when the rank is not an index of it.
    """
    serialized, rank = os.environ.get(SERVICE_PROC_IDS_ENV), os.environ.get(rank_env)
    if serialized is None or rank is None:
        return None
    proc_ids = deserialize_service_proc_ids(serialized)
    if not rank.isdigit() or int(rank) >= len(proc_ids):
        raise ValueError(
            f"{rank_env}={rank!r} is not an index of the {len(proc_ids)} ids in {SERVICE_PROC_IDS_ENV}"
        )
    return proc_ids[int(rank)]
