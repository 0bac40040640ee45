"""What a client and a host agent say to each other on ``mon.<ns>.ctl.host.<host-uid>``.

Requests carry ``Mon-Kind`` and are answered (to the NATS reply subject, with
the request's ``Mon-Rank`` copied) with ``ok`` or ``error`` bodies, exactly
like a proc's control messages:

============  ===================================================================
``spawn``     body ``{"procs": [[uid, rank], ...], "labels", "sizes", "ready",
              "exits", "owner", "root", "settings"}``, and optionally
              ``"bind"`` (the mesh's ``proc_bind`` dicts, one per proc of a host)
              and ``"commands"`` (a bootstrap command per proc of ``procs``, as
              :func:`~monarch.actors.procs.command_launcher.command_to_wire`
              makes it), which only agents listing ``"bind"`` / ``"command"`` in
              their registry entry's ``features`` take; answer ``{uid: pid}``
``kill``      body ``[uid, ...]``: SIGKILL those procs; answer ``[uid killed]``
``ping``      answer: the agent's registry entry
============  ===================================================================

Each proc's end is reported at once as ``Mon-Kind: exit`` to the ``exits``
subject the requester gave (a port of its own), body ``{"uid", "code"}``,
and as a ``dead`` heartbeat on the proc's heartbeat subject.
"""

from __future__ import annotations

import os

from monarch.broker.connections.registry import HOST_UID_ENV
from monarch.broker.vocabulary import headers as hdr

SPAWN, KILL, PING, EXIT = "spawn", "kill", "ping", "exit"
FEATURES = ["bind", "command"]  # what this version's spawn takes beyond the default
PROC = hdr.PROC  # header of exit reports: the proc that ended


# Per-proc variables, never copied from a client to its remote procs; nor are
# MONARCH_NATS_* (URL, credentials, TLS files): each agent knows how its machine
# reaches the broker, and its procs do it the same way.
_LOCAL_ONLY = {
    "MONARCH_ROOT_PROC",
    "MONARCH_OWNER_PROC",
    "MONARCH_RANK",
    HOST_UID_ENV,
    "MONARCH_RDMA_HOST",  # the machine's own address, device and GID
    "MONARCH_RDMA_DEVICE",
    "MONARCH_RDMA_GID_INDEX",
}


def forwarded_settings(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The client's ``MONARCH_*`` settings that its procs on other hosts must share.

    Heartbeat timing, pickling, wire mode and the like are the job's, not the
    machine's; the broker URL, credentials and per-proc variables are not copied.
    """
    env = os.environ if environ is None else environ
    return {
        k: v
        for k, v in env.items()
        if k.startswith("MONARCH_")
        and k not in _LOCAL_ONLY
        and not k.startswith(("MONARCH_POINT_", "MONARCH_NATS_"))
    }


def visible_device(agent_value: str | None, coord: int) -> str:
    """``CUDA_VISIBLE_DEVICES`` for the proc at ``gpus`` coordinate ``coord`` on a host.

    If the agent itself was limited to some devices (``"4,5,6,7"``), the proc
    gets the ``coord``-th of those; otherwise device ``coord``. Raises
    ValueError when the host has fewer visible devices than the mesh asks for.
    """
    if agent_value is None:
        return str(coord)
    if agent_value.strip() == "":
        return agent_value  # the agent was given no devices: neither are its procs
    devices = [d.strip() for d in agent_value.split(",") if d.strip()]
    if coord >= len(devices):
        raise ValueError(
            f"gpus coordinate {coord} needs device #{coord}, but this host's agent sees only "
            f"CUDA_VISIBLE_DEVICES={agent_value}"
        )
    return devices[coord]
