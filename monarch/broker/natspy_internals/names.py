"""Every private name of nats-py (and of asyncio) that this subpackage reads or replaces.

nats-py has no public hooks for what the fast paths do, so they reach into
its internals. Each module checks, before it changes a connection, that what
it needs is there (and otherwise leaves the connection as nats-py made it);
this table is the whole list in one place, so that a new nats-py can be
judged at a glance, and ``tests/broker/test_natspy_internals.py`` checks that
each name exists on the installed nats-py (``.ci/natspy-range.sh`` runs it on
the oldest and newest nats-py pyproject.toml allows).

Keys are ``<owner>.<name>``; :data:`OWNERS` says what each owner is. Values say
what the name is used for, and by which module.
"""

from __future__ import annotations

OWNERS: dict[str, str] = {
    "Client": "an instance of nats.aio.client.Client, connected over TCP",
    "client_module": "the module nats.aio.client",
    "Subscription": "an instance of nats.aio.subscription.Subscription",
    "Parser": "nats.protocol.parser.Parser, a connected Client's _ps",
    "parser_module": "the module nats.protocol.parser",
    "TcpTransport": "nats.aio.transport.TcpTransport, a connected Client's _transport",
    "Msg": "the dataclass nats.aio.msg.Msg (its fields, given as keywords)",
    "StreamReader": "asyncio.StreamReader, a TcpTransport's _io_reader",
    "Future": "asyncio.Future",
}

PRIVATE_NAMES: dict[str, str] = {
    # -- nats.aio.client.Client -------------------------------------------------
    "Client._transport": "the socket's nats-py transport: direct_read takes over its reader, "
    "write_through and direct_write write to it, each checks it is the current one",
    "Client._ps": "nats-py's protocol parser: direct_read feeds it each received chunk; "
    "fast_delivery reads its buffer and state to know it holds no part of a frame",
    "Client._subs": "sid -> Subscription: fast_delivery finds the frame's subscription",
    "Client._read_loop": "nats-py's reader task: direct_read replaces it per connection so "
    "that each new socket's reader is taken over when the task starts",
    "Client._process_op_err": "direct_read drops the socket and reconnects through it when "
    "what the broker sent cannot be parsed, as nats-py's reader task does",
    "Client._parse_header_lines": "fast_headers replaces it (per connection); fast_delivery "
    "parses a frame's headers with it",
    "Client._send_publish": "fast_headers replaces it (per connection) to build HPUB faster",
    "Client._send_command": "fast_headers' _send_publish queues the command through it, as "
    "nats-py's does",
    "Client._flush_pending": "write_through replaces it (per connection) to write within the "
    "publish; sync_publish and write_through hand the queue to nats-py's own when they cannot",
    "Client._flush_queue": "nats-py's flusher's wake-up queue: whether a flush is due",
    "Client._flusher_task": "write_through writes only while nats-py's flusher runs",
    "Client._pending": "nats-py's list of commands waiting to be written: write_through and "
    "sync_publish append to and write it",
    "Client._pending_data_size": "bytes in _pending: kept in step; direct_write writes only "
    "while it is 0",
    "Client._max_pending_size": "sync_publish leaves a publish that would pass it to nats-py "
    "(a forced flush)",
    "Client._max_payload": "sync_publish refuses a payload over the server's limit, as nats-py",
    "Client._skip_subject_validation": "sync_publish validates subjects only when nats-py would",
    "Client._server_info": "the server's INFO: connections.auth (does the broker require "
    "credentials) and connections.jetstream_setup (cluster size) read it",
    # -- the module nats.aio.client ----------------------------------------------
    "client_module._validate_subject": "sync_publish checks subjects with nats-py's own check",
    "client_module._HEADER_KEY_RE": "fast_headers checks header keys with nats-py's pattern "
    "(its own copy where a nats-py lacks it)",
    # -- nats.aio.subscription.Subscription ----------------------------------------
    "Subscription._pending_queue": "intake replaces it with a queue that delivers inline, in "
    "wire order; fast_delivery hands frames to that queue's deliver",
    "Subscription._pending_size": "intake keeps nats-py's pending count at zero",
    "Subscription._pending_bytes_limit": "intake turns nats-py's limit off (mailboxes account)",
    "Subscription._received": "fast_delivery counts delivered messages, as nats-py does",
    "Subscription._max_msgs": "fast_delivery leaves a subscription with a message limit to nats-py",
    "Subscription._jsi": "fast_delivery leaves JetStream subscriptions to nats-py",
    "Subscription._future": "fast_delivery leaves request futures to nats-py",
    # -- nats.protocol.parser --------------------------------------------------------
    "parser_module.AWAITING_CONTROL_LINE": "fast_delivery: the parser is between frames",
    # -- nats.aio.transport.TcpTransport ---------------------------------------------
    "TcpTransport._io_reader": "direct_read replaces its feed_data to parse on arrival",
    "TcpTransport._io_writer": "its asyncio transport: write_through and direct_write look at "
    "the write buffer, direct_read pauses and resumes reading",
    "TcpTransport._bare_io_writer": "direct_write: the writer is still the plain TCP one (not TLS)",
    # -- nats.aio.msg.Msg ------------------------------------------------------------
    "Msg._client": "fast_delivery makes a Msg as nats-py's parser does (its connection)",
    "Msg._sid": "fast_delivery makes a Msg as nats-py's parser does (its subscription id)",
    # -- asyncio ---------------------------------------------------------------------
    "StreamReader._buffer": "direct_read hands on what arrived before it took the reader over",
    "StreamReader._waiter": "direct_read takes a reader over once nats-py's task waits on it",
    "StreamReader._maybe_resume_transport": "direct_read resumes reading after emptying the "
    "buffer (called only where it exists)",
    "Future._asyncio_future_blocking": "inline: run_inline stands where asyncio's Task would "
    "and clears it, as Task does, before awaiting the future a coroutine yielded",
}

# Names read with getattr and a fallback: a nats-py without them is served all the same.
OPTIONAL: frozenset[str] = frozenset(
    {"client_module._HEADER_KEY_RE", "StreamReader._maybe_resume_transport"}
)
