"""``monarch.coalescing()``: group the tensor ops of a block, as Monarch's does.

Monarch holds back the messages of the ops in the block and sends them
together at its end. This engine already does what that is for: ops are never
sent one round trip each; each mesh's ops queue up and go out in batches, in
order (:mod:`monarch.tensors.controller`). So ``coalescing()`` changes
nothing about what runs or in which order: inside and after the block,
results are the same as without it. It nests, and an exception in the block
passes through unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def coalescing() -> Iterator[None]:
    """A block whose tensor ops are sent in batches (here, as all ops always are)."""
    yield
