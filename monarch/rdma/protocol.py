"""The bulk server's wire protocol: one fixed header per request, one per answer.

A connection carries any number of requests, one after another::

    request  = REQUEST (64 bytes) [payload of `length` bytes: WRITE, after the server's GO]
    response = RESPONSE (24 bytes) [message of `msg_len` bytes] [payload: READ]

READ      OK + `length` bytes streamed from the buffer, in chunks
WRITE     GO (or an error) right after the header, then the client streams
          `length` bytes, then OK once every byte is in the buffer. So a
          write is acknowledged only after the full payload has arrived.
FETCH_ADD / CAS   8-byte little-endian unsigned atomics, done by the owner
          under the buffer's lock; the answer's `value` is the old value
DROP      release the registration (the owner may also drop locally)
ACK       a reader finished a bulk body (see monarch.rdma.bulk)

Every request carries the buffer's 16-byte access key; a wrong key is
answered like an unknown buffer.
"""

from __future__ import annotations

import struct

MAGIC = b"MNRB"
VERSION = 1
REQUEST = struct.Struct("<4sBBHQ16sQQQQ")  # magic, version, op, 0, id, key, offset, length, a, b
RESPONSE = struct.Struct("<BxxxIQQ")  # status, msg_len, length, value
CHUNK = 1 << 20  # bytes per send/recv call: big enough to amortise, small enough to stay in cache

READ, WRITE, FETCH_ADD, CAS, DROP, ACK = 1, 2, 3, 4, 5, 6
OP_NAMES = {
    READ: "read",
    WRITE: "write",
    FETCH_ADD: "fetch_add",
    CAS: "compare_and_swap",
    DROP: "drop",
    ACK: "ack",
}

OK, GO, NO_BUFFER, OUT_OF_RANGE, READ_ONLY, BAD_REQUEST, FAILED = 0, 1, 2, 3, 4, 5, 6

MASK64 = (1 << 64) - 1
