"""``monarch dashboard``: a web page of a running job, on 127.0.0.1:8265 by default.

It binds the loopback address unless ``--host`` says otherwise: the page
shows actor names, failure reasons and stack-free call details of the job,
which only its users should see (it never shows the broker's URL or token).
``--port 0`` takes a free port; the URL is printed either way.
"""

from __future__ import annotations

import argparse
import socket
import sys


def run(args: argparse.Namespace) -> int:
    # Imported when the subcommand runs, so that `monarch --help` stays fast
    # (and starlette/uvicorn, of the `watch` extra, are needed only here).
    import uvicorn

    from monarch.cli.watch.model import model_for
    from monarch.cli.watch.web import create_app

    made = model_for(args, "dashboard")
    if isinstance(made, int):
        return made
    model, connect_nats = made
    ns = model.namespace

    try:
        sock = socket.create_server((args.host, args.port))
    except OSError as e:
        print(f"monarch dashboard: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 1
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    where = (
        "this machine only"
        if host in ("127.0.0.1", "::1", "localhost")
        else "reachable from the network"
    )
    print(
        f"monarch dashboard: http://{shown}:{port}/ ({where}; namespace {ns}; Ctrl-C stops)",
        flush=True,
    )
    config = uvicorn.Config(create_app(connect_nats, model), log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
    return 0
