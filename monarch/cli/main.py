"""The ``monarch`` command.

Every subcommand's options are declared here, so ``monarch --help`` and
``monarch COMMAND --help`` stay quick; the work is imported only when a
command runs (``monarch.cli.<command>.run(args)``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--nats-url",
        default=None,
        help="broker URL(s), comma separated (default: MONARCH_NATS_URL)",
    )
    p.add_argument(
        "--namespace",
        default=None,
        help="subject namespace (default: MONARCH_NAMESPACE or default)",
    )
    p.add_argument(
        "--job",
        default=None,
        metavar="NAME",
        help="the running job to use, as `monarch jobs` lists it (default: the only one)",
    )


def _connect_timeout(p: argparse.ArgumentParser, default: float = 10.0) -> None:
    p.add_argument(
        "--connect-timeout", type=float, default=default,
        help=f"seconds to wait for the broker (default {default:g})",
    )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="monarch", description="Monarch over NATS: actors for PyTorch, messages on NATS."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = sub.add_parser("demo", help="run a small actor mesh on this machine (embedded broker)")
    demo.add_argument("--gpus", type=int, default=4, help="procs to start (default 4)")

    broker = sub.add_parser(
        "broker", help="run a nats-server with JetStream for monarch, in the foreground"
    )
    broker.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    broker.add_argument("--port", type=int, default=4222, help="client port (default 4222)")
    broker.add_argument("--store-dir", default=None, help="JetStream storage directory")
    broker.add_argument("--name", default=None, help="server name (default monarch-<hostname>)")
    broker.add_argument("--http-port", type=int, default=None, help="monitoring port (e.g. 8222)")
    broker.add_argument(
        "server_args", nargs="*", help="after --: more nats-server flags (--cluster, --routes, ...)"
    )

    host = sub.add_parser("host", help="run a host agent: this machine starts procs for clients")
    _common(host)
    host.add_argument("--name", default=None, help="host name (default: this machine's hostname)")
    host.add_argument(
        "--labels", action="append", default=[], metavar="K=V", help="label(s), e.g. mesh=trainers"
    )
    host.add_argument("--capacity", type=int, default=None, help="most procs to run at once")
    _connect_timeout(host, 60.0)

    ps = sub.add_parser("ps", help="list host agents, procs and actor meshes")
    _common(ps)
    _connect_timeout(ps)
    ps.add_argument("--json", action="store_true", help="print JSON instead of tables")
    ps.add_argument("--window", type=float, default=1.5, help="seconds to listen for answers")
    ps.add_argument(
        "--prune", action="store_true", help="remove registry entries of silent hosts and procs"
    )

    jobs = sub.add_parser("jobs", help="list the running jobs this user can reach")
    jobs.add_argument("--json", action="store_true", help="print JSON instead of a table")
    stacks = sub.add_parser(
        "stacks", help="print the Python stack of every thread of the job's procs (like py-spy)"
    )
    _common(stacks)
    _connect_timeout(stacks)
    stacks.add_argument(
        "target", nargs="?", default=None, metavar="MESH[RANK]",
        help="only the procs hosting this actor mesh (or this rank of it); default: all procs",
    )  # fmt: skip
    stacks.add_argument(
        "--proc", action="append", default=[], metavar="UID", help="only this proc (repeatable)"
    )
    stacks.add_argument(
        "--timeout", type=float, default=3.0, help="seconds to wait for each proc (default 3)"
    )
    stacks.add_argument(
        "--window", type=float, default=1.5, help="seconds to listen for procs (default 1.5)"
    )
    stacks.add_argument(
        "--py-spy", action="store_true",
        help="read local procs with `py-spy dump` (works while a C call holds the GIL)",
    )  # fmt: skip
    debug = sub.add_parser(
        "debug", help="list actors paused at breakpoint() and attach a pdb console to them"
    )
    _common(debug)
    _connect_timeout(debug)
    debug.add_argument("--list", action="store_true", help="print the paused sessions and exit")
    debug.add_argument(
        "--cast",
        default=None,
        metavar="SEL",
        help="send PDB_COMMAND to the sessions SEL names (e.g. 'ranks(all)', 'trainers ranks(0,2)')"
        " and exit",
    )
    debug.add_argument("pdb_command", nargs="*", help="with --cast: the pdb command, e.g. c or p x")
    debug.add_argument(
        "--window", type=float, default=1.0, help="seconds to collect the sessions' answers"
    )
    debug.add_argument(
        "--timeout", type=float, default=10.0, help="seconds a session has to answer a command"
    )

    tail = sub.add_parser("tail", help="print live traffic on SUBJECT, decoded")
    _common(tail)
    _connect_timeout(tail)
    tail.add_argument("subject", nargs="?", default=None, help="default: mon.<namespace>.>")
    tail.add_argument("--width", type=int, default=240, help="cut lines to this many characters")
    tail.add_argument("--count", type=int, default=None, help="stop after this many messages")
    tail.add_argument("--seconds", type=float, default=None, help="stop after this many seconds")
    tail.add_argument(
        "--pickle", action="store_true", help="also unpickle pickled values (trusted traffic only)"
    )

    query = sub.add_parser(
        "query", help='SQL over the telemetry of a namespace: monarch query "SELECT ..."'
    )
    _common(query)
    _connect_timeout(query)
    query.add_argument("sql", nargs="?", default=None, help="the query (SQLite's dialect)")
    query.add_argument("--tables", action="store_true", help="print the tables and their columns")
    query.add_argument("--timeout", type=float, default=10.0, help="seconds to read the stream")
    fmt = query.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print the rows as JSON objects")
    fmt.add_argument("--csv", action="store_true", help="print the rows as CSV")
    _watch_commands(sub)
    return parser


def _watch_options(p: argparse.ArgumentParser) -> None:
    _common(p)
    p.add_argument("--interval", type=float, default=1.0, help="seconds between polls (default 1)")
    p.add_argument(
        "--history", type=float, default=600.0, help="seconds of history kept (default 600)"
    )
    _connect_timeout(p)


def _watch_commands(sub: argparse._SubParsersAction) -> None:
    top = sub.add_parser("top", help="live view of a job: actors, states, rates, latencies")
    _watch_options(top)
    top.add_argument("--once", action="store_true", help="print one snapshot as text and exit")

    dash = sub.add_parser("dashboard", help="web dashboard of a job (plots over time)")
    _watch_options(dash)
    dash.add_argument(
        "--host", default="127.0.0.1", help="address to serve on (default 127.0.0.1: this machine only)"
    )
    dash.add_argument("--port", type=int, default=8265, help="port (default 8265; 0: a free one)")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if getattr(args, "namespace", None):
        os.environ["MONARCH_NAMESPACE"] = args.namespace
        # Imported when the subcommand runs, so that `monarch --help` stays fast.
        from monarch.settings import settings

        settings.cache_clear()
    if args.command == "demo":
        # Imported when the subcommand runs, so that `monarch --help` stays fast.
        from monarch.cli.demo import run

        return run(gpus=args.gpus)
    try:
        return importlib.import_module(f"monarch.cli.{args.command}").run(args)
    except ConnectionError as e:
        if getattr(args, "discovered_job", None) is None:
            # A broker given by URL: its address and how long we tried, not a traceback.
            print(f"monarch {args.command}: {e}", file=sys.stderr)
            return 1
        # A job found by its record that cannot be reached has most likely just ended.
        from monarch.cli.jobs import explain_unreachable

        return explain_unreachable(args, e)


def broker_url(args: argparse.Namespace) -> str:
    """The broker a command talks to: ``--nats-url``, ``MONARCH_NATS_URL``, or a running job's.

    Given neither URL (or given ``--job``), the job is found by its record
    (:mod:`monarch.cli.jobs`), which also sets the job's namespace,
    credentials and key for the command. Exits 2 where ``--job`` names no
    running job or several jobs run and none is named; exits with a message
    if there is nothing to connect to.
    """
    # Imported when the subcommand runs, so that `monarch --help` stays fast.
    from monarch.settings import settings

    job = getattr(args, "job", None)
    if args.nats_url and job:
        print(f"monarch {args.command}: give --nats-url or --job, not both", file=sys.stderr)
        sys.exit(2)
    url = args.nats_url or (None if job else settings().nats_url)
    if url:
        return url
    from monarch.cli.jobs import discover, use

    record = discover(args)
    if record is None:
        sys.exit(
            f"monarch {args.command}: no running job found and no broker given: start a "
            "monarch script on this machine, pass --nats-url nats://HOST:4222 "
            "or set MONARCH_NATS_URL (`monarch broker` runs one)"
        )
    return use(args, record)


if __name__ == "__main__":
    sys.exit(main())
