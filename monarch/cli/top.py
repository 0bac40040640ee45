"""``monarch top``: a live terminal view of a running job (``--once``: one plain snapshot).

It listens like ``monarch ps`` (same broker, same namespace) and asks every
proc for its activity each interval; see :mod:`monarch.cli.watch`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any


def run(args: argparse.Namespace) -> int:
    # Imported when the subcommand runs, so that `monarch --help` stays fast.
    from monarch.cli.watch.model import model_for

    made = model_for(args, "top")
    if isinstance(made, int):
        return made
    model, connect_nats = made
    if args.once:
        return _once(model, connect_nats)
    # Imported here: textual is in the `watch` extra, and only the live view needs it.
    from monarch.cli.watch.top_app import TopApp

    app = TopApp(connect_nats, model)
    code = app.run()
    if app.exit_message:
        print(app.exit_message, file=sys.stderr)
    if isinstance(code, int):
        return code
    return app.return_code or 0  # non-zero when the app stopped on an error


def _once(model: Any, connect_nats: Any) -> int:
    """Two polls an interval apart (rates need two), then the snapshot as text."""
    from rich.console import Console

    from monarch.cli.watch.poller import Poller
    from monarch.cli.watch.text import snapshot

    async def go() -> None:
        nc = await connect_nats()
        try:
            async with Poller(nc, model) as poller:
                await poller.poll()
                await asyncio.sleep(model.interval)
                await poller.poll()
        finally:
            await nc.close()

    try:
        asyncio.run(go())
    except ConnectionError as e:
        print(f"monarch top: {e}", file=sys.stderr)
        return 1
    view = model.view()
    if view["status"] == "waiting":
        print(f"monarch top: {view['message']}", file=sys.stderr)
        return 1
    Console(highlight=False).print(snapshot(view))
    return 0
