"""What the single-framework benchmarks share: a broker of their own for the run.

Imported by ``bench_*.py`` and ``soak.py`` when run as scripts from this folder.
"""

from __future__ import annotations

import contextlib
import os

from monarch.broker.connections.server import EmbeddedBroker


def own_broker(cleanup: contextlib.ExitStack) -> EmbeddedBroker:
    """Start a broker and point monarch at it; ``cleanup`` stops the runtime, then the broker.

    Call it before monarch's first use, so the runtime connects here instead of
    starting an embedded broker of its own (one the script could not reach).
    """
    broker = EmbeddedBroker().start()
    cleanup.callback(broker.stop)
    os.environ["MONARCH_NATS_URL"] = broker.url

    def stop_runtime() -> None:
        from monarch.core.process_runtime import shutdown_runtime

        shutdown_runtime()

    cleanup.callback(stop_runtime)
    return broker
