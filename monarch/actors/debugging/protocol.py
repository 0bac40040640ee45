"""What ``monarch debug`` and a paused process say to each other (subjects and JSON bodies).

Everything goes over NATS core (request/reply to an inbox) and, on the
process's side, over its side channel (the heartbeat thread's own
connection, :meth:`~monarch.supervision.heartbeat.Heartbeater.publish`): an
async endpoint's breakpoint blocks its proc's event loop, so nothing the
debugger needs may wait for that loop.

* ``mon.<ns>.dbg.list`` (request, empty body): every process that has paused
  sessions answers ``{"proc": uid, "sessions": [info, ...]}``, each ``info``
  as :func:`session_info` makes it.
* ``mon.<ns>.dbg.in.<proc-uid>.<session>`` (body ``{"op": "attach"|"line",
  "line": str}``, reply inbox): the session answers with one output message
  ``{"session": id, "out": text, "state": STATE, "how": why}``; ``STATE`` is ``prompt``
  (it waits for the next line), ``running`` (it went on; breakpoints remain
  set, it pauses again when one is hit), ``ended`` (it continued or quit for
  good; ``how`` says how: continued, quit, the endpoint returned) or ``gone``
  (no such session here: it ended meanwhile).
"""

from __future__ import annotations

import json
from typing import Any

PROMPT, RUNNING, ENDED, GONE = "prompt", "running", "ended", "gone"
ATTACH, LINE = "attach", "line"


def list_subject(namespace: str) -> str:
    return f"mon.{namespace}.dbg.list"


def input_subject(namespace: str, proc_uid: str, session: str) -> str:
    return f"mon.{namespace}.dbg.in.{proc_uid}.{session}"


def input_wildcard(namespace: str, proc_uid: str) -> str:
    """One subscription per process hears the input of all its sessions."""
    return f"mon.{namespace}.dbg.in.{proc_uid}.*"


def encode(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode()


def decode(data: bytes) -> dict[str, Any]:
    """The JSON object in ``data``; ``{}`` for anything else (a stray message is ignored)."""
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return {}
    return obj if isinstance(obj, dict) else {}
