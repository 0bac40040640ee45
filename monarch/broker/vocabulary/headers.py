"""Every ``Mon-*`` NATS header this system writes, declared once, with what it means.

Headers carry what a person watching traffic (``monarch tail``, ``nats sub
'mon.>'``) wants to read; bodies are encoded by :mod:`monarch.broker.bodies.codec`.
Modules use these names, never the strings, so this table is the whole list.
"""

from __future__ import annotations

PREFIX = "Mon-"

KIND = "Mon-Kind"
ENDPOINT = "Mon-Endpoint"
FROM = "Mon-From"
SEQ = "Mon-Seq"
SENT = "Mon-Sent"
RANK = "Mon-Rank"
MSG_RANK = "Mon-Msg-Rank"
ACTOR_RANK = "Mon-Actor-Rank"
WAIT = "Mon-Wait"
COUNT = "Mon-Count"
ADHOC = "Mon-Adhoc"
AUTH = "Mon-Auth"
LOOP_STALL = "Mon-Loop-Stall"
QUIET = "Mon-Quiet"
MESH = "Mon-Mesh"
OWNER = "Mon-Owner"
REASON = "Mon-Reason"
PROC = "Mon-Proc"
STREAM = "Mon-Stream"
XFER = "Mon-Xfer"
TRACE = "Mon-Trace"
REDUCE = "Mon-Reduce"
RANKS = "Mon-Ranks"

# name -> what it carries (docs/observability.md, "Watching the traffic", shows them on the wire)
TABLE: dict[str, str] = {
    KIND: "the message's kind: call (wants replies), send (no reply), reply, error, spawn, "
    "stop, ready, ok, sync, batch; on control subjects also probe and lost; heartbeats "
    "alive/dead; supervision failure; ps",
    ENDPOINT: "the endpoint a call or send is for",
    FROM: "the sender: its actor id (client for the root) or proc uid",
    SEQ: "<n>@<sender proc uid>: the n-th send of that process to this subject (a hole is "
    "a loss, monarch.actors.messaging.lost_sends); on heartbeats, the beat's number",
    SENT: "<n>@<sender proc uid> on a gathered call or a sync marker: that many sends so far",
    RANK: "the replier's rank in its mesh (replies), or the receiver's rank (spawn)",
    MSG_RANK: "on replies and port messages from an actor the message reached through a "
    "slice: its rank within that slice (a ranked PortReceiver's rank, as in Monarch)",
    ACTOR_RANK: "on a proc's failed answer to a spawn of several actors per proc "
    "(ProcMesh.per_proc): the rank of the actor whose __init__ failed",
    WAIT: "one: a caller blocks on this single reply, so both sides busy-poll briefly "
    "(monarch.core.busy_poll)",
    COUNT: "how many messages a batch holds (monarch.broker.bodies.batch)",
    ADHOC: "the caller used as_endpoint() on a plain method",
    AUTH: "HMAC-SHA256 of the message under the job key (monarch.broker.connections.auth)",
    LOOP_STALL: "on heartbeats: seconds the sender's event loop has not turned",
    QUIET: "on heartbeats: the sender is importing a library whose start-up holds the GIL "
    "(torch): watchers allow this many seconds of silence before declaring it dead",
    MESH: "on supervision events: the failed mesh's name",
    OWNER: "on supervision events: the owner actor told of the failure",
    REASON: "on supervision events: why (proc_died, heartbeat_lost, actor_failed, ...)",
    PROC: "on a host agent's exit reports: the proc that ended",
    STREAM: "on forwarded output: stdout, stderr or log",
    XFER: "on tensor moves between meshes: the transfer id",
    REDUCE: "on a call from an Accumulator given a reducer: the reducer's name, then itself "
    "(encoded like a body, base64): the replies of a per_proc mesh's actors in one proc "
    "may be merged there (monarch.actors.hosting.reduce)",
    RANKS: "on a reply merged or gathered on its proc: the ranks it answers for, as 0-5,8 "
    "(Mon-Rank is the first); a gathered reply's body is the list of their values, in that "
    "order (monarch.actors.hosting.reduce)",
    TRACE: "only while telemetry is on (MONARCH_TELEMETRY=1): the call's trace id, which "
    "links its send, deliver, handle and reply spans (monarch.telemetry)",
}
