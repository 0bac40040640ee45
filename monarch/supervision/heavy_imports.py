"""Imports that hold the GIL for seconds, announced to watchers before they start.

Importing torch loads its C++ libraries and runs their initialisers: C calls
that hold the GIL throughout. On an idle machine the longest lasts ~0.3 s;
with seven procs importing torch at once on two cores it was 1.3 s here, and
more on a machine others load too. While it lasts no other thread of the
process runs, the heartbeat thread included, so a watcher hears silence and
would declare a live, busy process dead (``heartbeat_lost``). Monarch's
heartbeats come from Rust and never wait for the GIL; ours are Python.

So while a heavy import is under way, each heartbeat says so
(``Mon-Quiet: <seconds>``, :data:`ALLOWANCE`) and watchers wait that long
before calling silence a death. The import's start is announced before its
first long C call: a meta path finder that finds nothing is told of every
import first, and for a heavy one asks each heartbeater (the listeners) to
beat at once, waiting (bounded) until the beat has reached the broker. An
import already running when heartbeats start (a proc's background import) is
seen from ``sys.modules``: the module's spec is ``_initializing`` until its
code has run. A process that dies meanwhile is still reported at once by
whoever reaps it; only a frozen one is declared dead later.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

HEAVY = frozenset({"torch"})
ALLOWANCE = 60.0  # seconds of silence a watcher grants while a heavy import runs
NOTICE_WAIT = 1.0  # at most this long an import waits for its announcing beat
_NOTICE_WINDOW = 5.0  # a notice not followed by the module itself soon was a mere lookup

_lock = threading.Lock()
_listeners: list[Callable[[], None]] = []
_noticed: dict[str, float] = {}  # heavy module name -> when its import was announced


def in_progress() -> str | None:
    """The heavy module this process is importing now, if any (any thread may ask)."""
    now = time.monotonic()
    for name in sorted(HEAVY):
        module = sys.modules.get(name)
        spec = getattr(module, "__spec__", None)
        if module is not None and getattr(spec, "_initializing", False):
            return name  # its code is running
        with _lock:
            since = _noticed.get(name)
            if since is None:
                continue
            if module is None and now - since < _NOTICE_WINDOW:
                return name  # found, not created yet: its code is about to run
            del _noticed[name]
    return None


def add_listener(announce: Callable[[], None]) -> None:
    """Call ``announce()`` (on the importing thread) when a heavy import starts.

    ``announce`` must return within about :data:`NOTICE_WAIT` seconds and must not
    import anything new: it runs under the interpreter's import lock.
    """
    with _lock:
        _listeners.append(announce)
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)


def remove_listener(announce: Callable[[], None]) -> None:
    with _lock:
        if announce in _listeners:
            _listeners.remove(announce)
        if not _listeners and _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)


class _Notice:
    """A meta path finder that finds nothing: it only hears of imports first."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name in HEAVY and name not in sys.modules:
            with _lock:
                _noticed[name] = time.monotonic()
                listeners = list(_listeners)
            for announce in listeners:
                try:
                    announce()
                except Exception:  # an import must not fail for a heartbeat
                    pass
        return None


_FINDER = _Notice()
