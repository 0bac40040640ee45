"""Publishing from the runtime's loop in one plain call, not through nats-py's coroutines.

nats-py's ``publish`` is a coroutine that awaits three more (``_send_publish``,
``_send_command``, ``_flush_pending``), and where the job has a key a fourth
wraps them all (:mod:`monarch.broker.connections.auth`); the runtime drives them to their
end at once (:func:`monarch.broker.natspy_internals.inline.run_inline`), as they almost never
wait. Each message still pays for making and stepping those coroutines, on
both legs of every call. :func:`publisher` gives a connection a plain
function that does what they do, in the same order and with the same bytes:

1. nats-py's checks (subject and reply subject, payload size);
2. the job's ``Mon-Auth`` tag where :func:`monarch.broker.connections.auth.secure` made the
   connection sign (:func:`monarch.broker.connections.auth.signed_headers`);
3. the command, built by :mod:`monarch.broker.natspy_internals.fast_headers`, appended to
   nats-py's queue and counted in its ``stats``;
4. the write, as :mod:`monarch.broker.natspy_internals.write_through` does it (the first
   message of a loop turn at once, the rest at the next turn).

It returns False, having changed nothing, whenever nats-py's own path is
needed: a check fails (nats-py then raises its own error), the connection is
not up, nats-py's flusher holds the writing (back-pressure: write_through's
conditions), or the queue would pass nats-py's pending limit (a forced
flush). The caller then runs nats-py's ``publish`` as before.
``MONARCH_SYNC_PUBLISH=0`` turns it off.
"""

from __future__ import annotations

from collections.abc import Callable

import nats.aio.client as nats_client
from nats.aio.client import Client
from nats.protocol import command

from monarch.broker.connections.auth import auth_of, signed_headers
from monarch.broker.natspy_internals import fast_headers
from monarch.broker.natspy_internals.write_through import WriteThrough
from monarch.broker.settings import settings

Publisher = Callable[[str, bytes, str, "dict[str, str] | None"], bool]


def publisher(nc: Client) -> Publisher | None:
    """A plain ``publish(subject, payload, reply, headers) -> taken`` for ``nc``, or None.

    None where it cannot be (setting off, no write-through on ``nc``, a nats-py
    whose internals or header bytes differ from what this module knows).
    """
    through = getattr(nc, "_monarch_write_through", None)
    if (
        not settings().sync_publish
        or not isinstance(through, WriteThrough)
        or not fast_headers.installed(nc)
        or not callable(getattr(nats_client, "_validate_subject", None))
        or not all(
            hasattr(nc, a)
            for a in (
                "_skip_subject_validation",
                "_max_payload",
                "_max_pending_size",
                "stats",
                "_pending",
                "_pending_data_size",
                "_flush_queue",
                "is_draining_pubs",
            )
        )
    ):
        return None
    build = command_builder(nc)
    stats = nc.stats

    def publish(subject: str, payload: bytes, reply: str, headers: dict[str, str] | None) -> bool:
        if not through.can_write() or nc.is_draining_pubs:
            return False
        cmd = build(subject, payload, reply, headers)
        if cmd is None:
            return False
        limit = nc._max_pending_size
        if limit > 0 and nc._pending_data_size + len(cmd) > limit:
            return False  # nats-py forces a flush of the full queue, waiting on it
        stats["out_msgs"] += 1
        stats["out_bytes"] += len(payload)
        nc._pending.append(cmd)
        nc._pending_data_size += len(cmd)
        flush_queue = nc._flush_queue
        if (flush_queue is None or flush_queue.empty()) and not through.flush_now():
            through.hand_to_flusher()  # the transport refused the write: nats-py's flusher
        return True

    return publish


CommandBuilder = Callable[[str, bytes, str, "dict[str, str] | None"], "bytes | None"]


def command_builder(nc: Client) -> CommandBuilder:
    """``build(subject, payload, reply, headers)``: the bytes nats-py would write for it.

    Steps 1-3 of the module's list (checks, the job's tag, the PUB or HPUB
    command) and nothing else, so any thread may call it: None where nats-py's
    own publish must run instead (it then raises its own error). Shared with
    :mod:`monarch.broker.natspy_internals.direct_write`, so both write exactly what nats-py would.
    """
    validate = nats_client._validate_subject
    pub_cmd, build_hpub = command.pub_cmd, fast_headers.build_hpub

    def build(
        subject: str, payload: bytes, reply: str, headers: dict[str, str] | None
    ) -> bytes | None:
        if not nc._skip_subject_validation:
            try:
                validate(subject)
                if reply:
                    validate(reply)
            except Exception:
                return None
        if len(payload) > nc._max_payload or not subject:
            return None
        auth = auth_of(nc)
        if auth is not None:
            headers = signed_headers(auth, subject, reply, headers, payload)
        try:
            return (
                pub_cmd(subject, reply, payload)
                if headers is None
                else build_hpub(subject, reply, payload, headers)
            )
        except Exception:
            return None  # a header nats-py refuses: its publish raises the error

    return build
